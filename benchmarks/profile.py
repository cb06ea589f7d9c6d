"""Where a worker's time goes: ``python -m benchmarks.profile [generate|consume|batch] [--baseline]``.

Starts the same servers as the suite, drives the endpoint with wrk, and
samples one gunicorn worker with py-spy (``pip install py-spy``) while it
runs. Prints the share of samples under each of a few well-known frames
(hot path or Flask dispatch, marshmallow, redis-py, JSON, ...) and the heaviest leaf
functions. py-spy samples wall-clock stacks of a running (not idle) thread, so
time blocked in a socket syscall counts: on a busy machine that is where
most samples land.
"""

from __future__ import annotations

import argparse
import collections
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from benchmarks import suite
from benchmarks.procs import children

# (label, substring of a frame) — a sample counts for every label whose frame is on its stack
REQUEST_FRAMES = ("__call__ (token_service/server/hot_path.py", "wsgi_app (flask/app.py")
BUCKETS = [
    ("whole request (hot path)", REQUEST_FRAMES[0]),
    ("whole request (Flask wsgi_app)", REQUEST_FRAMES[1]),
    ("operation (api.py)", "(token_service/server/api.py"),
    ("  marshmallow load", "load (marshmallow/schema.py"),
    ("  redis-py command", "execute_command (redis/client.py"),
    ("    of which pack", "pack (redis/connection.py"),
    ("    of which socket send/recv", "(redis/_parsers/socket.py"),
    ("  json_response", "json_response (token_service/server/responses.py"),
    ("  issuance limits (admit)", "admit (token_service/store.py"),
    ("  metrics", "(prometheus_client/"),
    ("  logging", "(logging/__init__.py"),
    ("  access line + request metrics", "record (token_service/server/telemetry.py"),
    ("gunicorn outside the app", "handle_request (gunicorn/workers/sync.py"),
]


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.profile", description=__doc__)
    parser.add_argument("endpoint", choices=["generate", "consume", "batch"])
    parser.add_argument("--baseline", action="store_true", help="profile the hand-written baseline instead")
    parser.add_argument("--seconds", type=int, default=10)
    args = parser.parse_args()
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    config = suite.Config(workers=2)
    target = "baseline" if args.baseline else "service"
    with suite.servers(config, ("service", "baseline")) as servers:
        runner = suite.HttpRunner(servers, suite.TokenSupply(servers.redis.client()))
        server = servers.baseline if args.baseline else servers.service
        assert server.process is not None
        worker = children(server.process.pid)[0]
        raw = Path(tempfile.mkstemp(suffix=".txt")[1])
        record = [py_spy, "record", "--pid", str(worker), "--duration", str(args.seconds - 2)]
        record += ["--rate", "500", "--nonblocking", "--format", "raw", "--output", str(raw)]
        spy = threading.Thread(target=subprocess.run, args=(record,), kwargs={"capture_output": True})
        spy.start()
        result = runner.run(target, args.endpoint, 8, args.seconds)
        spy.join()
    stacks = collections.Counter[str]()
    text = raw.read_text()
    raw.unlink()
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        stacks[stack] += int(count)
    total = sum(stacks.values())
    print(f"{target} {args.endpoint}: {result.rps:.0f} req/s, {result.server_cpu_ms:.3f} ms server CPU/req")
    print(f"{total} samples of worker {worker}")
    in_request = sum(n for s, n in stacks.items() if any(frame in s for frame in REQUEST_FRAMES)) or 1
    for label, frame in BUCKETS:
        share = sum(n for s, n in stacks.items() if frame in s)
        print(
            f"  {label:36s} {100 * share / total:5.1f}% of samples, "
            f"{100 * share / in_request:5.1f}% of request"
        )
    leaves = collections.Counter[str]()
    for stack, n in stacks.items():
        leaves[stack.split(";")[-1]] += n
    print("heaviest leaf frames:")
    for leaf, n in leaves.most_common(15):
        print(f"  {100 * n / total:5.1f}%  {leaf}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
