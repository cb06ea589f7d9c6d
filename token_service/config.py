"""Settings from ``TOKEN_SERVICE_*`` environment variables, validated once at start.

Every bad value stops start-up with :class:`ConfigError`, a one-line message
naming the variable (the CLI prints it without a traceback). ``create_app``
also accepts a mapping of the same names (lower-case, without the prefix), so
tests pass configuration in instead of patching the environment.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import parse_qs, unquote, urlsplit

from token_service import defaults
from token_service.tokens import SCOPE_RE

__all__ = [
    "DEVELOPMENT_API_KEY",
    "DEVELOPMENT_WARNING",
    "MAX_METRIC_SCOPES",
    "PREFIX",
    "ConfigError",
    "RateLimit",
    "RedisTarget",
    "Settings",
    "masked_url",
    "parse_redis_url",
    "unknown_variables",
    "variable_names",
    "written",
]

PREFIX = "TOKEN_SERVICE_"
_DAY_SECONDS = 86400
_YEAR_SECONDS = 365 * _DAY_SECONDS
_HEX_DIGEST = re.compile(r"[0-9a-f]{64}\Z")
_RATE = re.compile(r"(\d+)\s*/\s*(second|minute|hour|day)\Z")
_PERIOD_SECONDS = {"second": 1, "minute": 60, "hour": 3600, "day": 86400}
_PERIOD_NAMES = {seconds: name for name, seconds in _PERIOD_SECONDS.items()}


# The key make run and docker-compose.yml start with, so the walk-through works as written. Everyone
# who has read the README knows it: accepted on the embedded store (one process, nothing kept), and
# on a real Redis only where TOKEN_SERVICE_ENVIRONMENT=development says this is not production.
DEVELOPMENT_API_KEY = "dev-service-key-change-me"
_DEVELOPMENT_KEY_DIGEST = hashlib.sha256(DEVELOPMENT_API_KEY.encode()).hexdigest()
DEVELOPMENT_WARNING = (
    "TOKEN_SERVICE_ENVIRONMENT=development on a real Redis: the development key "
    f"{DEVELOPMENT_API_KEY} is accepted. Never run this in production; unset "
    "TOKEN_SERVICE_ENVIRONMENT and set keys of your own."
)


class ConfigError(ValueError):
    """A configuration value is wrong; the message names the variable."""


@dataclass(frozen=True, slots=True)
class RateLimit:
    limit: int
    period_seconds: int

    def __str__(self) -> str:
        """As the docs and TOKEN_SERVICE_RATE_LIMIT write it: ``60/minute``."""
        period = _PERIOD_NAMES.get(self.period_seconds)
        return f"{self.limit}/{period}" if period else f"{self.limit}/{self.period_seconds}s"


def _int(low: int, high: int | None = None) -> Callable[[str], int]:
    def parse(raw: str) -> int:
        try:
            value = int(raw)
        except ValueError:
            raise ValueError(f"must be an integer, got {raw!r}") from None
        if value < low or (high is not None and value > high):
            bounds = f"between {low} and {high}" if high is not None else f"at least {low}"
            raise ValueError(f"must be {bounds}, got {value}")
        return value

    return parse


def _float(low: float) -> Callable[[str], float]:
    def parse(raw: str) -> float:
        try:
            value = float(raw)
        except ValueError:
            raise ValueError(f"must be a number, got {raw!r}") from None
        if not value >= low:
            raise ValueError(f"must be at least {low}, got {raw}")
        return value

    return parse


def _list(raw: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in raw.split(",") if part.strip())


def _api_key_digests(raw: str) -> tuple[str, ...]:
    """Keys are kept only as SHA-256 hex digests; ``sha256:<hex>`` entries are taken as given."""
    digests = []
    for entry in _list(raw):
        if not (entry.isascii() and entry.isprintable()):
            # HTTP header values arrive as Latin-1: a key with other characters could never match
            raise ValueError(
                "each key must be printable ASCII (HTTP headers carry no other text reliably); "
                "a key with other characters could never authenticate"
            )
        if entry.startswith("sha256:"):
            digest = entry.removeprefix("sha256:").lower()
            if not _HEX_DIGEST.match(digest):
                raise ValueError("a sha256: entry must be followed by 64 hex digits")
            digests.append(digest)
        else:
            if len(entry) < 16:
                raise ValueError("each key must be at least 16 characters (or a sha256:<hex> digest)")
            digests.append(hashlib.sha256(entry.encode()).hexdigest())
    return tuple(digests)


def _rate_limit(raw: str) -> RateLimit | None:
    text = raw.strip().lower()
    if text in ("off", "none", "0"):
        return None
    match = _RATE.match(text.replace("per ", "/"))
    if not match or int(match.group(1)) < 1:
        raise ValueError(f"must look like '60/minute' (N/second|minute|hour|day) or 'off', got {raw!r}")
    return RateLimit(int(match.group(1)), _PERIOD_SECONDS[match.group(2)])


@dataclass(frozen=True, slots=True)
class RedisTarget:
    """Where Redis is: one server (``redis://``, ``rediss://``, ``unix://``), a Sentinel-
    managed master (``redis+sentinel://``) or a Cluster (``redis+cluster://``).

    ``nodes`` are the sentinels or the cluster's startup nodes; credentials, ``db``
    and TLS apply to the data nodes (sentinels are asked without a password).
    """

    kind: Literal["standalone", "sentinel", "cluster"]
    url: str
    nodes: tuple[tuple[str, int], ...] = ()
    service_name: str = ""
    username: str | None = None
    password: str | None = None
    db: int = 0
    ssl: bool = False


_NODE = re.compile(
    r"\[(?P<ip6>[0-9A-Fa-f:.]+)\](?::(?P<port6>\d+))?\Z|(?P<host>[^:\[\]]+)(?::(?P<port>\d+))?\Z"
)
_TOPOLOGY_SCHEMES: dict[str, tuple[Literal["sentinel", "cluster"], bool, int]] = {
    "redis+sentinel": ("sentinel", False, 26379),
    "rediss+sentinel": ("sentinel", True, 26379),
    "redis+cluster": ("cluster", False, 6379),
    "rediss+cluster": ("cluster", True, 6379),
}


def parse_redis_url(raw: str) -> RedisTarget:
    """Validate a Redis URL; ValueError names what is wrong (without echoing a password)."""
    url = raw.strip()
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme in ("redis", "rediss", "unix"):
        return RedisTarget("standalone", url)
    if scheme not in _TOPOLOGY_SCHEMES:
        raise ValueError(
            "must start with redis://, rediss://, unix://, redis+sentinel:// or redis+cluster://"
        )
    kind, ssl, default_port = _TOPOLOGY_SCHEMES[scheme]
    parts = urlsplit(url)
    userinfo, _, hostlist = parts.netloc.rpartition("@")
    username, _, password = userinfo.partition(":") if userinfo else ("", "", "")
    nodes = []
    for entry in hostlist.split(","):
        match = _NODE.match(entry.strip())
        if not match:
            raise ValueError(f"{scheme}: {entry.strip()!r} is not host[:port]")
        host = match.group("ip6") or match.group("host")
        port = int(match.group("port6") or match.group("port") or default_port)
        if not 0 < port < 65536:
            raise ValueError(f"{scheme}: port {port} is out of range")
        nodes.append((host, port))
    path = [unquote(part) for part in parts.path.split("/") if part]
    service_name, db = "", 0
    if kind == "sentinel":
        if not path or len(path) > 2:
            raise ValueError(f"{scheme}: the path must be /<master-name>[/<db>]")
        service_name = path[0]
        db = _db_number(scheme, path[1]) if len(path) == 2 else 0
    elif path:
        raise ValueError(f"{scheme}: a cluster has only database 0; drop the path")
    if parts.query:
        unknown = sorted(parse_qs(parts.query, keep_blank_values=True))
        raise ValueError(f"{scheme}: unknown option(s) {', '.join(unknown)}")
    return RedisTarget(
        kind,
        url,
        tuple(nodes),
        service_name,
        unquote(username) or None,
        unquote(password) or None,
        db,
        ssl,
    )


def _db_number(scheme: str, raw: str) -> int:
    if not raw.isdigit():
        raise ValueError(f"{scheme}: the database must be a number, got {raw!r}")
    return int(raw)


def _redis_url(raw: str) -> str:
    url = raw.strip()
    if url:
        parse_redis_url(url)
    return url


def _key_prefix(raw: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9_.:{}-]{0,32}", raw):
        raise ValueError("must be at most 32 characters of A-Za-z0-9_.:{}-")
    return raw


def _header_name(raw: str) -> str | None:
    if not raw:
        return None
    if not re.fullmatch(r"[A-Za-z0-9-]{1,64}", raw):
        raise ValueError(f"must be an HTTP header name, got {raw!r}")
    return raw


_ORIGIN = re.compile(r"https?://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?)(:\d{1,5})?\Z")


def _origins(raw: str) -> tuple[str, ...]:
    """Exact origins only: a wildcard or a pattern would let any site mint tokens."""
    origins = _list(raw)
    for origin in origins:
        if not _ORIGIN.match(origin):
            raise ValueError(
                f"each origin must be scheme://host[:port] exactly (no '*', path or pattern), got {origin!r}"
            )
    return tuple(origin.lower() for origin in origins)


# the metrics' per-scope label slots (token_service/server/metrics.py MAX_SCOPES)
MAX_METRIC_SCOPES = 50


def _scopes(raw: str) -> tuple[str, ...]:
    scopes = tuple(dict.fromkeys(_list(raw)))
    for scope in scopes:
        if not SCOPE_RE.match(scope):
            raise ValueError(
                f"each scope must be 1-64 characters of A-Za-z0-9._:- (first A-Za-z0-9), got {scope!r}"
            )
    if len(scopes) > MAX_METRIC_SCOPES:
        raise ValueError(f"at most {MAX_METRIC_SCOPES} scopes (the metrics' label slots), got {len(scopes)}")
    return scopes


def _one_of(*choices: str) -> Callable[[str], str]:
    """The parser of a setting that is one of ``choices``: any case in, the choice's own case out."""
    by_folded = {choice.lower(): choice for choice in choices}

    def parse(raw: str) -> str:
        choice = by_folded.get(raw.strip().lower())
        if choice is None:
            raise ValueError(f"must be one of {', '.join(choices)}, got {raw!r}")
        return choice

    return parse


# The HTTP server `token-service serve` runs the app under (token_service/server/cli.py).
SERVERS = ("gunicorn", "granian")


def _bool(raw: str) -> bool:
    text = raw.strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"must be true or false, got {raw!r}")


@dataclass(frozen=True, slots=True)
class Settings:
    """The effective configuration; field names are the variables without the prefix."""

    redis_url: str = field(default="", metadata={"parse": _redis_url})
    api_keys: tuple[str, ...] = field(default=(), metadata={"parse": _api_key_digests, "secret": True})
    # The admin routes' own keys (/admin/…): never accepted on the backend routes, nor the reverse.
    admin_keys: tuple[str, ...] = field(default=(), metadata={"parse": _api_key_digests, "secret": True})
    # Upper bounds keep every expiry a date Python can print and an exact integer in Lua.
    default_ttl_seconds: int = field(
        default=defaults.DEFAULT_TTL_SECONDS, metadata={"parse": _int(1, _YEAR_SECONDS)}
    )
    max_ttl_seconds: int = field(default=defaults.MAX_TTL_SECONDS, metadata={"parse": _int(1, _YEAR_SECONDS)})
    result_ttl_seconds: int = field(
        default=defaults.RESULT_TTL_SECONDS, metadata={"parse": _int(1, _YEAR_SECONDS)}
    )
    default_lease_seconds: int = field(
        default=defaults.DEFAULT_LEASE_SECONDS, metadata={"parse": _int(1, _DAY_SECONDS)}
    )
    max_lease_seconds: int = field(
        default=defaults.MAX_LEASE_SECONDS, metadata={"parse": _int(1, _DAY_SECONDS)}
    )
    key_prefix: str = field(default=defaults.KEY_PREFIX, metadata={"parse": _key_prefix})
    cors_origins: tuple[str, ...] = field(default=(), metadata={"parse": _origins})
    subject_header: str | None = field(default=None, metadata={"parse": _header_name})
    rate_limit: RateLimit | None = field(default=RateLimit(60, 60), metadata={"parse": _rate_limit})
    max_outstanding_per_subject: int = field(default=100, metadata={"parse": _int(0)})
    # A client without a trusted subject is its address's network: one IPv6 host holds a whole /64.
    client_ipv4_prefix: int = field(default=32, metadata={"parse": _int(8, 32)})
    client_ipv6_prefix: int = field(default=64, metadata={"parse": _int(16, 128)})
    # What anonymous issuance may hold across all clients (0: no such limit), and the share of
    # Redis's maxmemory above which it is refused (0: off): room kept for consumes.
    anonymous_max_outstanding: int = field(default=1_000_000, metadata={"parse": _int(0)})
    anonymous_max_outstanding_bytes: int = field(default=256 * 1024 * 1024, metadata={"parse": _int(0)})
    anonymous_max_memory_percent: int = field(default=90, metadata={"parse": _int(0, 100)})
    # consume and begin without a request_id are refused (a retry of them cannot be made safe)
    require_request_id: bool = field(default=False, metadata={"parse": _bool})
    trusted_proxy_hops: int = field(default=0, metadata={"parse": _int(0, 10)})
    max_body_bytes: int = field(default=65536, metadata={"parse": _int(256, 16 * 1024 * 1024)})
    # A request body not in within this many seconds is answered 408 (token_service/server/body.py).
    body_timeout_seconds: float = field(default=10.0, metadata={"parse": _float(0.1)})
    # A reply the client has not taken within this many seconds closes its connection (a slow
    # reader would otherwise hold a worker's connection slot; token_service/server/connections.py).
    send_timeout_seconds: float = field(default=15.0, metadata={"parse": _float(0.1)})
    max_result_bytes: int = field(default=defaults.MAX_RESULT_BYTES, metadata={"parse": _int(2)})
    redis_timeout_seconds: float = field(default=2.0, metadata={"parse": _float(0.01)})
    # Connections to Redis one worker opens at most (per node of a cluster), and how long one
    # stays open unused (token_service.connection.BoundedPool).
    redis_max_connections: int = field(
        default=defaults.REDIS_MAX_CONNECTIONS, metadata={"parse": _int(1, 10000)}
    )
    redis_idle_seconds: float = field(default=defaults.REDIS_IDLE_SECONDS, metadata={"parse": _float(0.1)})
    cors_max_age_seconds: int = field(default=600, metadata={"parse": _int(0, 86400)})
    log_level: str = field(default="INFO", metadata={"parse": _one_of("DEBUG", "INFO", "WARNING", "ERROR")})
    # Scopes with a metric label of their own from the start (others: once a consume or begin,
    # which need a service key, names them; never an anonymous generate).
    metric_scopes: tuple[str, ...] = field(default=(), metadata={"parse": _scopes})
    # json in production (what log collectors parse); console for a person at a terminal (make run)
    log_format: str = field(default="json", metadata={"parse": _one_of("json", "console")})
    # development: the development key is accepted on a real Redis too (with a loud warning)
    environment: str = field(default="production", metadata={"parse": _one_of("production", "development")})
    # Graceful shutdown: on SIGTERM /readyz fails for this long before gunicorn stops taking requests.
    drain_seconds: int = field(default=0, metadata={"parse": _int(0, 300)})
    # While this file exists /readyz answers 503 (set by the gunicorn config; operators may touch it).
    drain_file: str = field(default="", metadata={"parse": str.strip})
    # The server `token-service serve` runs: gunicorn (gevent workers) or granian (the granian extra).
    server: str = field(default="gunicorn", metadata={"parse": _one_of(*SERVERS)})
    # Not from the environment: tests and embedders may hand a client in.
    redis_client: Any = field(default=None, metadata={"env": False})

    @property
    def embedded(self) -> bool:
        return not self.redis_url and self.redis_client is None

    @property
    def redis_target(self) -> RedisTarget:
        return parse_redis_url(self.redis_url)

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Settings:
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            name = PREFIX + f.name.upper()
            if f.metadata.get("env", True) and name in environ:
                values[f.name] = _parse(f, name, environ[name])
        return cls._checked(values)

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any]) -> Settings:
        """Like from_env, for tests: strings are parsed, other values taken as they are."""
        known = {f.name: f for f in dataclasses.fields(cls)}
        values: dict[str, Any] = {}
        for key, value in mapping.items():
            name = key.lower().removeprefix(PREFIX.lower())
            if name not in known:
                raise ConfigError(f"{PREFIX}{name.upper()}: unknown setting")
            f = known[name]
            is_text = isinstance(value, str) and f.metadata.get("env", True)
            values[name] = _parse(f, PREFIX + name.upper(), value) if is_text else value
        return cls._checked(values)

    @classmethod
    def _checked(cls, values: dict[str, Any]) -> Settings:
        settings = cls(**values)
        if set(settings.admin_keys) & set(settings.api_keys):
            raise ConfigError(f"{PREFIX}ADMIN_KEYS: a key must not also be in {PREFIX}API_KEYS")
        if settings.default_ttl_seconds > settings.max_ttl_seconds:
            raise ConfigError(
                f"{PREFIX}DEFAULT_TTL_SECONDS: must not exceed "
                f"{PREFIX}MAX_TTL_SECONDS ({settings.max_ttl_seconds})"
            )
        if settings.default_lease_seconds > settings.max_lease_seconds:
            raise ConfigError(
                f"{PREFIX}DEFAULT_LEASE_SECONDS: must not exceed "
                f"{PREFIX}MAX_LEASE_SECONDS ({settings.max_lease_seconds})"
            )
        for name in ("api_keys", "admin_keys"):
            if _DEVELOPMENT_KEY_DIGEST in getattr(settings, name) and not settings.development_allowed:
                raise ConfigError(
                    f"{PREFIX}{name.upper()}: {DEVELOPMENT_API_KEY} is the development key, known to "
                    "everyone, and is refused with a real Redis; set a key of your own "
                    f"(or {PREFIX}ENVIRONMENT=development on a development machine)"
                )
        return settings

    @property
    def development_allowed(self) -> bool:
        """Whether the development key may be used: on the embedded store, or where
        ``TOKEN_SERVICE_ENVIRONMENT=development`` says so."""
        return self.embedded or self.environment == "development"

    @property
    def development_warning(self) -> str | None:
        """What to say loudly at start: the development setting on a real Redis."""
        return DEVELOPMENT_WARNING if self.environment == "development" and not self.embedded else None

    def describe(self) -> dict[str, str]:
        """The effective configuration for ``token-service check``, secrets masked."""
        shown: dict[str, str] = {}
        for f in dataclasses.fields(self):
            if not f.metadata.get("env", True):
                continue
            value = getattr(self, f.name)
            if f.metadata.get("secret"):
                text = f"<{len(value)} configured>"
            elif f.name == "redis_url":
                text = masked_url(value) or "(embedded in-memory store)"
            elif isinstance(value, tuple):
                text = ",".join(value)
            elif f.name == "rate_limit":
                text = str(value) if value else "off"
            else:
                text = written(value)
            shown[PREFIX + f.name.upper()] = text
        return shown


def written(value: object) -> str:
    """A value as configuration.md (and the environment) writes it: ``false``, ``10``, ``0.5``.

    Python's ``str`` gives ``False`` and ``10.0``, which a reader copying ``check``'s output
    back into the environment would have to translate.
    """
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def variable_names() -> list[str]:
    """Every TOKEN_SERVICE_* variable the service reads."""
    return [PREFIX + f.name.upper() for f in dataclasses.fields(Settings) if f.metadata.get("env", True)]


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """A message for each TOKEN_SERVICE_* variable that is set but is no setting (a typo is
    otherwise ignored in silence, leaving the default in force), naming the closest valid name."""
    known = variable_names()
    messages = []
    for name in sorted(environ):
        if name.upper().startswith(PREFIX) and name not in known:
            # compared without the prefix they all share, which would make anything look close
            suffixes = [known_name.removeprefix(PREFIX) for known_name in known]
            close = difflib.get_close_matches(name.upper().removeprefix(PREFIX), suffixes, n=1, cutoff=0.6)
            hint = f" (did you mean {PREFIX}{close[0]}?)" if close else ""
            messages.append(f"{name}: not a setting of token-service{hint}")
    return messages


def _parse(f: dataclasses.Field[Any], name: str, raw: str) -> Any:
    try:
        return f.metadata["parse"](raw)
    except ValueError as exc:
        raise ConfigError(f"{name}: {exc}") from None


def masked_url(url: str) -> str:
    """The URL with its password hidden, for printing: redis://user:password@host → redis://user:***@host."""
    return re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", url)
