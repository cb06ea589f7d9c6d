"""``python -m examples.checkout``: the token service and the shop, ready for a browser."""

from __future__ import annotations

import argparse
import logging
import signal
import threading

from examples.checkout.demo import Demo


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m examples.checkout", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1", help="address for both servers (default: 127.0.0.1)")
    parser.add_argument("--token-port", type=int, default=8000, help="token service port (default: 8000)")
    parser.add_argument("--shop-port", type=int, default=8001, help="shop port (default: 8001)")
    parser.add_argument(
        "--charge-delay",
        type=float,
        default=0.5,
        help="seconds the payment provider takes, so double clicks overlap (default: 0.5)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    demo = Demo(args.host, args.token_port, args.shop_port, charge_delay_seconds=args.charge_delay).start()
    print(f"token service: {demo.token_url}  (the JS helper: {demo.token_url}/static/token-client.js)")
    print(f"shop:          {demo.shop_url}  ← open this; charges at {demo.shop_url}/api/charges")
    print("Ctrl-C stops both.")
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
