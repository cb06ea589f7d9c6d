"""``python -m examples.checkout``: the shop, and a token service unless --token-service names one."""

from __future__ import annotations

import argparse
import logging
import signal
import threading

import httpx

from examples.checkout.demo import Demo


def check_token_service(token_url: str, shop_url: str, api_key: str) -> list[str]:
    """Why the demo would not work with the token service at ``token_url`` (empty: it would).

    Two questions, neither of which changes anything there: does it let the shop's page ask
    for tokens (a CORS preflight), and does it take the shop's service key (inspecting a
    token that does not exist: 404 with the right key, 401 with a wrong one)?
    """
    quiet = logging.getLogger("httpx")
    level = quiet.level
    quiet.setLevel(logging.WARNING)  # the probe's expected "404 NOT FOUND" would read like a failure
    try:
        preflight = httpx.options(
            token_url + "/token/generate",
            headers={
                "Origin": shop_url,
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "content-type",
            },
            timeout=5,
        )
        probe = httpx.post(
            token_url + "/token/inspect",
            json={"token": "checkout-demo-probe-" + "0" * 24},
            headers={"Authorization": f"Bearer {api_key}"},
            timeout=5,
        )
    except httpx.HTTPError as exc:
        return [f"no answer from {token_url} ({type(exc).__name__}): is it running?"]
    finally:
        quiet.setLevel(level)
    problems = []
    if preflight.headers.get("Access-Control-Allow-Origin") != shop_url:
        problems.append(
            f"{token_url} does not allow the origin {shop_url}: add it to its TOKEN_SERVICE_CORS_ORIGINS "
            "(and start the shop with that --shop-port)"
        )
    if probe.status_code == 401:
        problems.append(
            f"{token_url} refuses the shop's service key: set CHECKOUT_API_KEY to one of its "
            "TOKEN_SERVICE_API_KEYS (every payment would fail, and the page would say 'not charged')"
        )
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m examples.checkout", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    parser.add_argument("--shop-port", type=int, default=0, help="shop port (default: a free port)")
    parser.add_argument(
        "--token-service",
        metavar="URL",
        help="an already-running token service, such as make run's; the shop's key for it is "
        "CHECKOUT_API_KEY, else make run's development key (default: start one here, embedded store)",
    )
    parser.add_argument(
        "--token-port",
        type=int,
        default=0,
        help="port of the token service started here (default: a free port)",
    )
    parser.add_argument(
        "--database", metavar="URL", help="the shop's SQLAlchemy database URL (default: SQLite in a temp dir)"
    )
    parser.add_argument(
        "--charge-delay",
        type=float,
        default=0.5,
        help="seconds the payment provider takes, so double clicks overlap (default: 0.5)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    demo = Demo(
        args.host,
        args.shop_port,
        token_service_url=args.token_service,
        token_port=args.token_port,
        database_url=args.database,
        charge_delay_seconds=args.charge_delay,
    ).start()
    where = "started here" if args.token_service is None else "yours"
    print(f"token service: {demo.token_url}  ({where})", flush=True)
    print(f"shop:          {demo.shop_url}  ← open this", flush=True)
    print(f"database:      {demo.database_url}", flush=True)
    if args.token_service is not None:
        for problem in check_token_service(demo.token_url, demo.shop_url, demo.api_key):
            print(f"warning: {problem}", flush=True)
    print("Ctrl-C stops it.", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    finally:
        demo.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
