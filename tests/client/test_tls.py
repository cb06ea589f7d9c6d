"""The HTTP clients over TLS: the SDK's own pool opens every connection through its deadline
backend, and an ``https://`` URL's handshake goes through the stream's ``start_tls`` (rewritten
for both httpcore kinds in e1fa2c0, and held by no other test: the others speak plain HTTP).

The service is the in-process app on fakeredis behind werkzeug's TLS server, its certificate
self-signed for 127.0.0.1 and trusted through ``SSL_CERT_FILE`` (httpx's ``trust_env``).
"""

from __future__ import annotations

import datetime
import ipaddress
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from werkzeug.serving import make_server

from tests.support.sdk import inproc_app
from tests.support.service import API_KEY
from token_service.client import AsyncTokenClient, TokenClient

x509 = pytest.importorskip("cryptography.x509")
from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.x509.oid import NameOID  # noqa: E402

SCOPE = "payment.create"


def _self_signed(folder: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    address = x509.IPAddress(ipaddress.ip_address("127.0.0.1"))
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([address]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = folder / "cert.pem", folder / "key.pem"
    cert_file.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_file, key_file


@pytest.fixture
def https_url(tmp_path: Path, fake_redis: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    cert_file, key_file = _self_signed(tmp_path)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_file, key_file)
    server = make_server("127.0.0.1", 0, inproc_app(fake_redis), threaded=True, ssl_context=context)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("SSL_CERT_FILE", str(cert_file))  # read as each client builds its pool
    try:
        yield f"https://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        thread.join()


def test_the_sync_client_speaks_tls(https_url: str) -> None:
    with TokenClient(https_url, API_KEY) as client:
        token = client.generate(SCOPE).token
        assert client.consume(token, SCOPE).replayed is False


async def test_the_async_client_speaks_tls(https_url: str) -> None:
    async with AsyncTokenClient(https_url, API_KEY) as client:
        token = (await client.generate(SCOPE)).token
        assert (await client.consume(token, SCOPE)).replayed is False
