"""JSON text for every reply and log line, from one C encoder made once per format.

``json.dumps(value)`` (and ``JSONEncoder.encode``) makes a new C encoder on every
call, through two Python frames, before it writes a character: for generate's
reply of six fields, 27.6 k instructions (callgrind) where the writing alone
takes 19.9 k. These functions call one encoder made at import,
with ``json.dumps``'s options, and give the same text for every value
``json.dumps`` writes.

One difference, on values none of our documents hold: no check for circular
references (``check_circular=False``), as the encoder's record of the objects
it is inside would be shared by every thread. A structure that contains itself
raises RecursionError instead of ValueError.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from json.encoder import encode_basestring_ascii
from typing import Any

# the C encoder json.encoder uses when it has one (None on a Python built without _json)
_c_make_encoder: Any = getattr(json.encoder, "c_make_encoder", None)

__all__ = ["compact", "spaced"]


def _one_shot(item_separator: str, key_separator: str) -> Callable[[Any], str]:
    fallback = json.JSONEncoder(separators=(item_separator, key_separator), check_circular=False)
    if _c_make_encoder is None:  # a Python built without _json: the library's own path
        return fallback.encode
    # c_make_encoder(markers, default, encoder, indent, key_separator, item_separator, sort_keys,
    # skipkeys, allow_nan): what JSONEncoder.iterencode passes it, markers None (no circular check)
    markers, indent, sort_keys, skip_keys, allow_nan = None, None, False, False, True
    encoder = _c_make_encoder(
        markers,
        fallback.default,
        encode_basestring_ascii,
        indent,
        key_separator,
        item_separator,
        sort_keys,
        skip_keys,
        allow_nan,
    )

    def dumps(value: Any) -> str:
        if isinstance(value, str):
            return encode_basestring_ascii(value)
        return "".join(encoder(value, 0))

    return dumps


# json.dumps(value, separators=(",", ":")): replies
compact = _one_shot(",", ":")
# json.dumps(value): log lines, as python-json-logger writes them
spaced = _one_shot(", ", ": ")
