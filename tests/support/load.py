"""Background consume load for fault tests, with the bookkeeping to judge it.

``ConsumeLoad`` runs threads that take tokens one by one and let ``contenders``
callers consume each, every caller with its own request id. A caller that gets
503 retries with the same request id (as the SDK does) until it gets an answer
or the load stops. The tally answers the questions a fault test asks: was any
token won by two callers, did anything answer 500, how many 503s, and how long
after the fault healed did the first consume succeed.

``post(path, body) -> (status, json)`` is the transport: a Flask test client
or an httpx client, so the same load drives the app in-process or gunicorn.
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

Post = Callable[[str, dict[str, Any]], tuple[int, Any]]


@dataclass
class Tally:
    winners: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    statuses: Counter[int] = field(default_factory=Counter)
    codes: Counter[str] = field(default_factory=Counter)
    successes_at: list[float] = field(default_factory=list)
    unavailable_at: list[float] = field(default_factory=list)
    replays: int = 0
    tokens_done: int = 0

    @property
    def double_wins(self) -> dict[str, set[str]]:
        return {token: ids for token, ids in self.winners.items() if len(ids) > 1}

    def first_success_after(self, moment: float) -> float | None:
        later = [at for at in self.successes_at if at >= moment]
        return min(later) - moment if later else None

    def summary(self) -> dict[str, Any]:
        return {
            "tokens": self.tokens_done,
            "wins": sum(len(ids) for ids in self.winners.values()),
            "double_wins": len(self.double_wins),
            "replayed_wins": self.replays,
            "statuses": dict(sorted(self.statuses.items())),
            "codes": dict(sorted(self.codes.items())),
        }


class ConsumeLoad:
    def __init__(
        self,
        post_factory: Callable[[], Post],
        tokens: Sequence[str],
        *,
        scope: str,
        contenders: int = 2,
        threads: int = 6,
        retry_pause_seconds: float = 0.02,
    ) -> None:
        self.post_factory = post_factory
        self.tokens = list(tokens)
        self.scope = scope
        self.contenders = contenders
        self.threads = threads
        self.retry_pause_seconds = retry_pause_seconds
        self.tally = Tally()
        self._next = itertools.count()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._workers: list[threading.Thread] = []
        self.errors: list[BaseException] = []

    def start(self) -> ConsumeLoad:
        self._workers = [
            threading.Thread(target=self._work, name=f"load-{n}", daemon=True) for n in range(self.threads)
        ]
        for worker in self._workers:
            worker.start()
        return self

    def stop(self) -> Tally:
        self._stop.set()
        for worker in self._workers:
            worker.join(timeout=30)
        if self.errors:
            raise self.errors[0]
        return self.tally

    # 120 s by default: the load's pace is the machine's, and a loaded CI machine runs it many times
    # slower; a wait that is reached sooner ends then.
    def wait_for_tokens(self, done: int, timeout_seconds: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_seconds
        while self.tally.tokens_done < done:
            if time.monotonic() > deadline or self.errors:
                raise TimeoutError(f"load got through {self.tally.tokens_done} tokens, wanted {done}")
            time.sleep(0.01)

    def wait_for_success_after(self, moment: float, timeout_seconds: float = 120.0) -> float:
        deadline = time.monotonic() + timeout_seconds
        while (recovered := self.tally.first_success_after(moment)) is None:
            if time.monotonic() > deadline or self.errors:
                raise TimeoutError(f"no successful consume within {timeout_seconds}s: {self.tally.summary()}")
            time.sleep(0.01)
        return recovered

    @property
    def exhausted(self) -> bool:
        return self.tally.tokens_done >= len(self.tokens)

    def _work(self) -> None:
        try:
            post = self.post_factory()
            while not self._stop.is_set():
                index = next(self._next)
                if index >= len(self.tokens):
                    return
                token = self.tokens[index]
                for _ in range(self.contenders):
                    self._contend(post, token, uuid.uuid4().hex)
                with self._lock:
                    self.tally.tokens_done += 1
        except BaseException as exc:  # surfaced by stop(): a broken load must fail the test
            self.errors.append(exc)

    def _contend(self, post: Post, token: str, request_id: str) -> None:
        body = {"token": token, "scope": self.scope, "request_id": request_id}
        while True:
            status, reply = post("/token/consume", body)
            now = time.monotonic()
            code = reply.get("code", "") if isinstance(reply, dict) else ""
            with self._lock:
                self.tally.statuses[status] += 1
                if code:
                    self.tally.codes[code] += 1
                if status == 200:
                    self.tally.winners[token].add(request_id)
                    self.tally.successes_at.append(now)
                    self.tally.replays += bool(reply.get("replayed"))
                elif status == 503:
                    self.tally.unavailable_at.append(now)
            if status != 503 or self._stop.is_set():
                return
            time.sleep(self.retry_pause_seconds)  # same request id: a win already made is replayed


def flask_post(app: Any, headers: dict[str, str]) -> Callable[[], Post]:
    """A transport factory over the Flask test client (one client per load thread)."""

    def factory() -> Post:
        client = app.test_client()

        def post(path: str, body: dict[str, Any]) -> tuple[int, Any]:
            response = client.post(path, json=body, headers=headers)
            return response.status_code, response.get_json(silent=True)

        return post

    return factory
