"""Flask's, FastAPI's and Django's ``@require_token`` answer every request of one script alike.

Three apps that do the same thing (plain JSON, a returned value, a response
object, a streamed body and a file under and over the caps, HEAD, 429 and 503
from the view, the framework's HTTP exceptions raised, an exception), each
behind its framework's decorator, on one
Redis, each driven through its framework's in-process test client. The same
script runs against each (every app with tokens of its own); every answer
(status, body, the replay headers) and every run of a view must be the same: the
three are one flow (``client/_require_token_core.py``) under three thin
adapters, not three implementations. Django runs twice, with sync views (a
``TokenClient``) and with ``async def`` views (an ``AsyncTokenClient``; its file
stays a synchronous stream): its module has both flows.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import django
import fakeredis
import httpx
import pytest
import redis
import redis.asyncio
from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.http import FileResponse as DjangoFileResponse
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseBase,
    JsonResponse,
    StreamingHttpResponse,
)
from django.test import AsyncClient as DjangoAsyncClient
from django.test import Client as DjangoClient
from django.test import override_settings
from django.urls import path
from fastapi import FastAPI, Request
from fastapi import HTTPException as FastAPIHTTPException
from fastapi import Response as FastAPIResponse
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse, StreamingResponse
from flask import Flask, abort, send_file
from flask import Response as FlaskResponse
from flask import request as flask_request
from starlette.exceptions import HTTPException as StarletteHTTPException
from werkzeug.exceptions import HTTPException as WerkzeugHTTPException

from tests.support.processes import RedisServer
from token_service.client import AsyncTokenClient, TokenClient
from token_service.client.django import require_token as django_require_token
from token_service.client.fastapi import require_token as fastapi_require_token
from token_service.client.flask import require_token as flask_require_token

SCOPE = "parity.op"
CAP_BYTES = 2048  # max_result_bytes everywhere (and Flask's max_body_bytes)
TEXT = "text/plain; charset=utf-8"
CRASH_BODY = "a crash's 500 page is each framework's own: only its status is compared"


FILES = {"small": b"%PDF-1.4 small receipt", "large": b"%PDF-1.4 " + b"x" * 5000}  # under, over the caps
PDF = "application/pdf"


def lines(count: int) -> list[bytes]:
    return [b"line %04d\n" % number for number in range(count)]


def http_error_body(status: int) -> bytes:
    """What each app's handler of its framework's HTTP exceptions answers (the same in all three)."""
    return b"http error %d" % status


def subject_of(headers: Any) -> str | None:
    value = headers.get("X-User")
    return str(value) if value is not None else None


# -- the three apps: each view counts its runs in `runs` and answers the same bytes -----------------


def flask_app(tokens: TokenClient, runs: Counter[str], files: dict[str, Path]) -> Flask:
    app = Flask("parity")
    guard = flask_require_token(
        tokens,
        SCOPE,
        subject=lambda request: subject_of(request.headers),
        max_body_bytes=CAP_BYTES,
        max_result_bytes=CAP_BYTES,
    )

    @app.post("/json")
    @guard
    def plain_json() -> Any:
        runs["json"] += 1
        return {"ran": runs["json"]}, 201

    @app.post("/value")
    @guard
    def value() -> Any:
        runs["value"] += 1
        return {"ran": runs["value"]}, 200, {"Location": f"/things/{runs['value']}"}

    @app.post("/response")
    @guard
    def response() -> Any:
        runs["response"] += 1
        body = b"made %d" % runs["response"]
        return FlaskResponse(body, status=202, content_type=TEXT, headers={"Location": "/made"})

    @app.route("/stream", methods=["POST", "HEAD"])
    @guard
    def stream() -> Any:
        runs["stream"] += 1
        return FlaskResponse(iter(lines(int(flask_request.args["n"]))), content_type=TEXT)

    @app.route("/file", methods=["POST", "HEAD"])
    @guard
    def file() -> Any:
        runs["file"] += 1
        return send_file(files[flask_request.args["size"]], mimetype=PDF)

    @app.post("/status")
    @guard
    def status() -> Any:
        runs["status"] += 1
        return FlaskResponse(b"status", status=int(flask_request.args["code"]), content_type=TEXT)

    @app.post("/raise")
    @guard
    def raises() -> Any:
        runs["raise"] += 1
        abort(int(flask_request.args["code"]))

    @app.errorhandler(WerkzeugHTTPException)
    def http_error(error: WerkzeugHTTPException) -> Any:
        status = error.code or 500
        return FlaskResponse(http_error_body(status), status=status, content_type=TEXT)

    @app.post("/crash")
    @guard
    def crash() -> Any:
        runs["crash"] += 1
        raise RuntimeError("bug")

    return app


def fastapi_app(tokens: AsyncTokenClient, runs: Counter[str], files: dict[str, Path]) -> FastAPI:
    app = FastAPI()
    guard = fastapi_require_token(
        tokens, SCOPE, subject=lambda request: subject_of(request.headers), max_result_bytes=CAP_BYTES
    )

    @app.post("/json")
    @guard
    async def plain_json() -> Any:
        runs["json"] += 1
        return JSONResponse({"ran": runs["json"]}, status_code=201)

    @app.post("/value")
    @guard
    async def value(response: FastAPIResponse) -> dict[str, int]:
        runs["value"] += 1
        response.headers["Location"] = f"/things/{runs['value']}"
        return {"ran": runs["value"]}

    @app.post("/response")
    @guard
    def response() -> FastAPIResponse:  # a sync endpoint: FastAPI runs it in a thread
        runs["response"] += 1
        body = b"made %d" % runs["response"]
        return FastAPIResponse(body, status_code=202, media_type="text/plain", headers={"Location": "/made"})

    @app.api_route("/stream", methods=["POST", "HEAD"])
    @guard
    async def stream(request: Request) -> StreamingResponse:
        runs["stream"] += 1

        async def chunks() -> AsyncIterator[bytes]:
            for chunk in lines(int(request.query_params["n"])):
                yield chunk

        return StreamingResponse(chunks(), media_type="text/plain")

    @app.api_route("/file", methods=["POST", "HEAD"])
    @guard
    async def file(request: Request) -> FileResponse:
        runs["file"] += 1
        return FileResponse(files[request.query_params["size"]], media_type=PDF)

    @app.post("/status")
    @guard
    async def status(request: Request) -> FastAPIResponse:
        runs["status"] += 1
        return FastAPIResponse(
            b"status", status_code=int(request.query_params["code"]), media_type="text/plain"
        )

    @app.post("/raise")
    @guard
    async def raises(request: Request) -> Any:
        runs["raise"] += 1
        code = int(request.query_params["code"])
        # FastAPI's own, and Starlette's (its base, which Starlette's routes raise)
        raise (FastAPIHTTPException if code == 404 else StarletteHTTPException)(code)

    async def http_error(request: Request, error: Exception) -> FastAPIResponse:
        assert isinstance(error, StarletteHTTPException)
        return PlainTextResponse(http_error_body(error.status_code), status_code=error.status_code)

    app.add_exception_handler(StarletteHTTPException, http_error)

    @app.post("/crash")
    @guard
    async def crash() -> Any:
        runs["crash"] += 1
        raise RuntimeError("bug")

    return app


def django_views(
    tokens: TokenClient,
    async_tokens: AsyncTokenClient,
    runs: Counter[str],
    files: dict[str, Path],
    *,
    is_async: bool,
) -> list[Any]:
    """The same views for Django, sync (on ``tokens``) or ``async def`` (on ``async_tokens``)."""

    def answer(name: str, request: HttpRequest) -> HttpResponseBase:
        runs[name] += 1
        if name == "json":
            return JsonResponse({"ran": runs["json"]}, status=201)
        if name == "value":
            made = JsonResponse({"ran": runs["value"]})
            made["Location"] = f"/things/{runs['value']}"
            return made
        if name == "response":
            return HttpResponse(
                b"made %d" % runs["response"], status=202, content_type=TEXT, headers={"Location": "/made"}
            )
        if name == "stream":
            return StreamingHttpResponse(iter(lines(int(request.GET["n"]))), content_type=TEXT)
        if name == "file":  # a sync stream, in an async view too
            return DjangoFileResponse(files[request.GET["size"]].open("rb"), content_type=PDF)
        if name == "status":
            return HttpResponse(b"status", status=int(request.GET["code"]), content_type=TEXT)
        if name == "raise":
            code = int(request.GET["code"])
            if code == 404:
                raise Http404
            if code == 403:
                raise PermissionDenied
            # Django has no exception that stands for a 503: the view answers it
            return HttpResponse(http_error_body(code), status=code, content_type=TEXT)
        raise RuntimeError("bug")

    def guarded(name: str) -> Any:
        options: dict[str, Any] = {"subject": lambda request: subject_of(request.headers)}
        options["max_result_bytes"] = CAP_BYTES
        if is_async:

            async def async_view(request: HttpRequest) -> HttpResponseBase:
                made = answer(name, request)
                if type(made) is StreamingHttpResponse:  # an async stream for an async view
                    sync_chunks = list(made.streaming_content)

                    async def chunks() -> AsyncIterator[bytes]:
                        for chunk in sync_chunks:
                            yield chunk

                    made = StreamingHttpResponse(chunks(), content_type=TEXT)
                return made

            return django_require_token(SCOPE, client=async_tokens, **options)(async_view)

        def view(request: HttpRequest) -> HttpResponseBase:
            return answer(name, request)

        return django_require_token(SCOPE, client=tokens, **options)(view)

    prefix = "async/" if is_async else ""
    return [
        path(f"{prefix}{name}", guarded(name))
        for name in ("json", "value", "response", "stream", "file", "status", "raise", "crash")
    ]


urlpatterns: list[Any] = []  # this module is the Django URLconf; the test fills it in


def handler404(request: HttpRequest, exception: Exception) -> HttpResponse:
    """The URLconf's page for Http404 (Django looks it up in this module)."""
    return HttpResponse(http_error_body(404), status=404, content_type=TEXT)


def handler403(request: HttpRequest, exception: Exception) -> HttpResponse:
    return HttpResponse(http_error_body(403), status=403, content_type=TEXT)


# -- one script ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    what: str
    method: str
    path: str
    slot: str | None  # which of the app's tokens (None: no token header)
    user: str = "alice"


SCRIPT = [
    Step("no token: 400", "POST", "/json", None),
    Step("plain JSON: runs, 201", "POST", "/json", "a"),
    Step("plain JSON: replayed", "POST", "/json", "a"),
    Step("another user's token: 403, not used up", "POST", "/json", "b", user="bob"),
    Step("a returned value: runs", "POST", "/value", "b"),
    Step("a returned value: replayed with its Location", "POST", "/value", "b"),
    Step("a response object: runs, 202", "POST", "/response", "c"),
    Step("a response object: replayed", "POST", "/response", "c"),
    Step("a stream under the caps: runs", "POST", "/stream?n=5", "d"),
    Step("a stream under the caps: replayed byte for byte", "POST", "/stream?n=5", "d"),
    Step("a stream over the caps: runs", "POST", "/stream?n=300", "e"),
    Step("a stream over the caps: replayed omitted, with its length", "POST", "/stream?n=300", "e"),
    Step("HEAD of a stream: runs", "HEAD", "/stream?n=5", "f"),
    Step("after HEAD: replayed (its status and headers)", "POST", "/stream?n=5", "f"),
    Step("a file under the caps: runs", "POST", "/file?size=small", "i"),
    Step("a file under the caps: replayed byte for byte", "POST", "/file?size=small", "i"),
    Step("a file over the caps: runs", "POST", "/file?size=large", "j"),
    Step("a file over the caps: replayed omitted, with its length", "POST", "/file?size=large", "j"),
    Step("HEAD of a file: runs", "HEAD", "/file?size=small", "k"),
    Step("after HEAD of a file: replayed omitted, with its length", "POST", "/file?size=small", "k"),
    Step("429 from the view: not stored", "POST", "/status?code=429", "g"),
    Step("429 again: runs again", "POST", "/status?code=429", "g"),
    Step("503 from the view: not stored", "POST", "/status?code=503", "g"),
    Step("then a 201: runs, stored", "POST", "/status?code=201", "g"),
    Step("the 201 replayed", "POST", "/status?code=503", "g"),
    Step(
        "a raised 404 (abort, HTTPException, Http404): answered as the app renders it",
        "POST",
        "/raise?code=404",
        "l",
    ),
    Step("the raised 404 replayed: it is the response it stands for", "POST", "/raise?code=404", "l"),
    Step("a raised 403 (abort, HTTPException, PermissionDenied): answered", "POST", "/raise?code=403", "n"),
    Step("the raised 403 replayed", "POST", "/raise?code=403", "n"),
    Step("a raised 503: answered, not stored", "POST", "/raise?code=503", "m"),
    Step("the raised 503 again: runs again", "POST", "/raise?code=503", "m"),
    Step("a raised 401 (not logged in): answered, not stored", "POST", "/raise?code=401", "o"),
    Step("the raised 401 again: runs again, the token was freed", "POST", "/raise?code=401", "o"),
    Step("logged in now, the same token: runs", "POST", "/json", "o"),
    Step("an exception: 500, the token freed", "POST", "/crash", "h"),
    Step("an exception again: runs again", "POST", "/crash", "h"),
    Step("in flight (another request holds the lease): 409", "POST", "/json", "held"),
    Step("a used token's replay under another path's view", "POST", "/response", "a"),
]


def comparable(status: int, headers: dict[str, str], body: bytes) -> tuple[Any, ...]:
    """What must be the same: status, body (JSON by its meaning), the replay headers, the media type."""
    kept = {
        name: headers.get(name.lower())
        for name in ("Idempotent-Replayed", "Idempotent-Body-Omitted", "Location")
    }
    media = (headers.get("content-type") or "").replace(" ", "").lower() or None
    if status == 500:
        content: Any = CRASH_BODY
        media = None
    elif media is not None and "json" in media and body:
        content = json.loads(body)
        if isinstance(content, dict):
            content.pop("retry_after_seconds", None)  # counted down by the store: not the flow's
    else:
        content = body
    return status, content, kept, media, "retry-after" in headers


class Driver:
    """One app and its test client: ``send(step, token)`` answers what :func:`comparable` compares."""

    name: str
    runs: Counter[str]

    async def send(self, step: Step, token: str | None) -> tuple[Any, ...]:
        raise NotImplementedError


def headers_for(step: Step, token: str | None) -> dict[str, str]:
    headers = {"X-User": step.user}
    if token is not None:
        headers["Idempotency-Token"] = token
    return headers


@dataclass
class FlaskDriver(Driver):
    app: Flask
    runs: Counter[str]
    name: str = "flask"

    async def send(self, step: Step, token: str | None) -> tuple[Any, ...]:
        answer = self.app.test_client().open(step.path, method=step.method, headers=headers_for(step, token))
        body = answer.get_data()
        answer.close()
        return comparable(answer.status_code, {k.lower(): v for k, v in answer.headers.items()}, body)


@dataclass
class FastAPIDriver(Driver):
    client: httpx.AsyncClient  # on httpx's ASGI transport
    runs: Counter[str]
    name: str = "fastapi"

    async def send(self, step: Step, token: str | None) -> tuple[Any, ...]:
        answer = await self.client.request(step.method, step.path, headers=headers_for(step, token))
        return comparable(answer.status_code, dict(answer.headers), answer.content)


@dataclass
class DjangoDriver(Driver):
    """Sync views through Django's test ``Client``, ``async def`` views through its ``AsyncClient``."""

    client: DjangoClient | DjangoAsyncClient
    runs: Counter[str]
    prefix: str
    name: str = "django"

    async def send(self, step: Step, token: str | None) -> tuple[Any, ...]:
        path = self.prefix + step.path.lstrip("/")
        if isinstance(self.client, DjangoAsyncClient):
            answer = await self.client.generic(step.method, path, headers=headers_for(step, token))
        else:
            answer = self.client.generic(step.method, path, headers=headers_for(step, token))
        if getattr(answer, "streaming", False) and answer.is_async:
            body = b"".join([chunk async for chunk in answer.streaming_content])
        else:
            body = answer.getvalue()
        answer.close()
        return comparable(answer.status_code, {k.lower(): v for k, v in answer.items()}, body)


def configure_django() -> None:
    if not settings.configured:
        settings.configure(
            SECRET_KEY="tests-only-not-a-secret",
            ALLOWED_HOSTS=["testserver"],
            ROOT_URLCONF=__name__,
            MIDDLEWARE=[],
            INSTALLED_APPS=[],
            DATABASES={},
            USE_TZ=True,
        )
        django.setup()


@pytest.fixture(
    params=[pytest.param("real", marks=pytest.mark.real), pytest.param("fake", marks=pytest.mark.fake)]
)
def backend(request: pytest.FixtureRequest) -> Iterator[tuple[redis.Redis, Callable[[], Any]]]:
    """A sync Redis connection, and a maker of async ones to the same data."""
    if request.param == "real":
        server: RedisServer = request.getfixturevalue("redis_server")
        raw: redis.Redis = request.getfixturevalue("real_redis")
        yield raw, lambda: redis.asyncio.Redis(host="127.0.0.1", port=server.port)
    else:
        fake = fakeredis.FakeServer()
        sync = fakeredis.FakeRedis(server=fake)
        yield sync, lambda: fakeredis.FakeAsyncRedis(server=fake)
        sync.close()


async def run_script(drivers: list[Driver], issuer: TokenClient) -> dict[str, tuple[Any, ...]]:
    """Every step against every app; returns each step's answer (the same from all)."""
    slots: dict[str, dict[str, str]] = {driver.name: {} for driver in drivers}
    same: dict[str, tuple[Any, ...]] = {}
    for number, step in enumerate(SCRIPT):
        answers = []
        for driver in drivers:
            token = None
            if step.slot is not None:
                mine = slots[driver.name]
                if step.slot not in mine:
                    mine[step.slot] = issuer.generate(SCOPE, subject="alice").token
                    if step.slot == "held":  # a first request still running holds its lease
                        issuer.begin(mine[step.slot], SCOPE, subject="alice")
                token = mine[step.slot]
            answers.append((driver.name, await driver.send(step, token), dict(driver.runs)))
        first_name, first_answer, first_runs = answers[0]
        for name, answer, runs in answers[1:]:
            assert answer == first_answer, (number, step.what, first_name, name)
            assert runs == first_runs, (number, step.what, first_name, name)
        same[step.what] = first_answer
    return same


@pytest.mark.parametrize("django_kind", ["sync", "async"])
async def test_the_three_decorators_answer_one_script_alike(
    backend: tuple[redis.Redis, Callable[[], Any]], django_kind: str, tmp_path: Path
) -> None:
    raw, async_redis = backend
    files = {name: tmp_path / f"{name}.pdf" for name in FILES}
    for name, content in FILES.items():
        files[name].write_bytes(content)
    is_async = django_kind == "async"
    configure_django()
    runs: dict[str, Counter[str]] = {name: Counter() for name in ("flask", "fastapi", "django")}
    async_tokens = AsyncTokenClient.from_redis(async_redis())
    asgi = httpx.ASGITransport(
        app=fastapi_app(async_tokens, runs["fastapi"], files), raise_app_exceptions=False
    )
    with TokenClient.from_redis(raw) as issuer, TokenClient.from_redis(raw) as tokens:
        urlpatterns[:] = django_views(tokens, async_tokens, runs["django"], files, is_async=is_async)
        async with httpx.AsyncClient(transport=asgi, base_url="http://t") as fastapi_client:
            with override_settings(ROOT_URLCONF=__name__, ALLOWED_HOSTS=["testserver"]):
                django_client = (
                    DjangoAsyncClient(raise_request_exception=False)
                    if is_async
                    else DjangoClient(raise_request_exception=False)
                )
                drivers: list[Driver] = [
                    FlaskDriver(flask_app(tokens, runs["flask"], files), runs["flask"]),
                    FastAPIDriver(fastapi_client, runs["fastapi"]),
                    DjangoDriver(django_client, runs["django"], "/async/" if is_async else "/"),
                ]
                try:
                    answers = await run_script(drivers, issuer)
                finally:
                    await async_tokens.close()
    # the script meant what its steps say
    assert [answer[0] for answer in answers.values()] == [
        400, 201, 201, 403, 200, 200, 202, 202, 200, 200, 200, 200, 200, 200,
        200, 200, 200, 200, 200, 200, 429, 429, 503, 201, 201, 404, 404, 403, 403, 503, 503,
        401, 401, 201, 500, 500, 409, 201,
    ]  # fmt: skip
    counted = {
        "json": 2,
        "value": 1,
        "response": 1,
        "stream": 3,
        "file": 3,
        "status": 4,
        "raise": 6,
        "crash": 2,
    }
    assert dict(runs["flask"]) == counted
    assert answers["after HEAD of a file: replayed omitted, with its length"][2] == {
        "Idempotent-Replayed": "true",
        "Idempotent-Body-Omitted": str(len(FILES["small"])),
        "Location": None,
    }
    assert answers["the raised 404 replayed: it is the response it stands for"][:3] == (
        404,
        http_error_body(404),
        {"Idempotent-Replayed": "true", "Idempotent-Body-Omitted": None, "Location": None},
    )
    assert answers["the raised 503 again: runs again"][2]["Idempotent-Replayed"] is None
    assert answers["a file over the caps: replayed omitted, with its length"][2] == {
        "Idempotent-Replayed": "true",
        "Idempotent-Body-Omitted": str(len(FILES["large"])),
        "Location": None,
    }
