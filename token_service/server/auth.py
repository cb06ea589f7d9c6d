"""Bearer service keys for the backend-facing routes.

Keys are held only as SHA-256 digests (``TOKEN_SERVICE_API_KEYS`` may give
them that way). The presented key is hashed and compared with every
configured digest in constant time, without stopping at the first match, so
neither a key's bytes nor its position leak through timing.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence

from token_service.errors import Unauthorized

__all__ = ["check_service_key"]


def check_service_key(digests: Sequence[str], header: str | None) -> None:
    """Raise Unauthorized unless ``header`` (the Authorization header, if any) holds a configured key."""
    header = header or ""
    scheme, _, presented = header.partition(" ")
    if scheme.lower() != "bearer" or not presented.strip():
        raise Unauthorized("A service key is required: Authorization: Bearer <key>.")
    presented_digest = hashlib.sha256(presented.strip().encode("utf-8", "surrogateescape")).hexdigest()
    matched = False
    for digest in digests:
        matched |= hmac.compare_digest(presented_digest, digest)
    if not matched:
        raise Unauthorized("The service key is not valid.")
