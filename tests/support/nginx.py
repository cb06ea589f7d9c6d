"""deploy/nginx/token-service.conf run by a real nginx, in front of a server on a loopback port.

The shipped file is used as it is, except for its two addresses (the listen port and the
upstream's) and its access log path; nginx runs with its own prefix, pid file and temp folders
under the caller's folder. Used by the edge tests that run the recipe (tests/edge/test_nginx.py)
and by those that hold granian only behind it (docs/deployment.md, "granian: only behind the proxy").
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.processes import REPO_ROOT, start_serving
from tests.support.raw_http import exchange, request_bytes

__all__ = ["CONF", "Nginx", "nginx_binary", "shipped_server_block"]

CONF = REPO_ROOT / "deploy" / "nginx" / "token-service.conf"


def nginx_binary() -> str:
    binary = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)
    if binary:
        return binary
    message = "nginx is not installed: the proxy recipe's test needs it (apt-get install nginx)"
    if os.environ.get("CI"):
        pytest.fail(message + " — CI must run it", pytrace=False)
    pytest.skip(message)


def shipped_server_block(listen_port: int, upstream_port: int, log_dir: Path) -> str:
    """The shipped file with its two addresses (and its access log path) pointed at the test's."""
    text = CONF.read_text()
    for old, new in [
        ("listen 8080;", f"listen 127.0.0.1:{listen_port};"),
        ("server token-service:8000;", f"server 127.0.0.1:{upstream_port};"),
        ("access_log /var/log/nginx/access.log ", f"access_log {log_dir / 'access.log'} "),
    ]:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    return text


class Nginx:
    def __init__(self, root: Path, upstream_port: int) -> None:
        self.root = root
        self.upstream_port = upstream_port
        self.port = 0  # start() picks a free one
        self.process: subprocess.Popen[bytes] | None = None
        for folder in ("logs", "client_body", "proxy", "fastcgi", "uwsgi", "scgi"):
            (root / folder).mkdir(parents=True, exist_ok=True)
        user = "user root;\n" if os.geteuid() == 0 else ""  # workers must reach the temp folders
        (root / "nginx.conf").write_text(
            f"""{user}worker_processes 1;
daemon off;
pid {root}/nginx.pid;
error_log {root}/logs/error.log info;
events {{ worker_connections 1024; }}
http {{
    client_body_temp_path {root}/client_body;
    proxy_temp_path {root}/proxy;
    fastcgi_temp_path {root}/fastcgi;
    uwsgi_temp_path {root}/uwsgi;
    scgi_temp_path {root}/scgi;
    include {root}/token-service.conf;
}}
"""
        )

    @property
    def address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)

    def start(self) -> Nginx:
        binary = nginx_binary()
        args = [
            binary,
            "-p",
            str(self.root),
            "-c",
            str(self.root / "nginx.conf"),
            "-e",
            str(self.root / "logs/error.log"),
        ]

        def launch(port: int) -> subprocess.Popen[bytes]:
            (self.root / "token-service.conf").write_text(
                shipped_server_block(port, self.upstream_port, self.root / "logs")
            )
            test = subprocess.run([*args, "-t"], capture_output=True, text=True, check=False)
            assert test.returncode == 0, test.stderr
            return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        def ready(port: int) -> bool:
            return exchange(("127.0.0.1", port), request_bytes("GET", "/healthz"), 1).status == 200

        self.process, self.port = start_serving(launch, ready, "nginx")
        return self

    def access_log(self) -> str:
        return (self.root / "logs" / "access.log").read_text()

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=20)
