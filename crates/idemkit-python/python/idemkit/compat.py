"""A drop-in for idempotency-kit 0.5.0's public API, on the idemkit core.

Code written for idempotency-kit runs with only the package name changed in its imports:
``import idemkit as ik`` for ``import idempotency_kit as ik``, and every module path under it
(``idemkit.core.services.aio.coordinator``, ``idemkit.infra.storage.redis.aio``,
``idemkit.settings``, ``idemkit.dishka`` ...). What differs, each on purpose, is listed in
``docs/python.md`` ("Differences that remain") and checked against idempotency-kit itself by
``pytests/test_dropin.py``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import decimal
import enum
import functools
import hashlib
import inspect
import json
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Generic, Literal, Protocol, TypeVar, cast, runtime_checkable

from . import _native
from ._coordinator import Coordinator, MemoryStore, PostgresStore, RedisStore, Store
from ._errors import (
    ConfigError,
    DecodeError,
    IdemkitError,
    InProgress,
    InvalidKey,
    InvalidTTL,
    KeyReused,
    RecordExpired,
    StoreError,
    StoreUnavailable,
)

if TYPE_CHECKING:
    from .core.models.entities import IdempotencyRecord

T = TypeVar("T")
logger = logging.getLogger("idemkit")

InFlightMode = Literal["wait", "raise", "run"]
StorageErrorMode = Literal["run", "raise"]

DEFAULT_TTL_MINUTES = 60
MIN_TTL_SECONDS = 60
MAX_TTL_SECONDS = 30 * 24 * 3600
DEFAULT_IN_FLIGHT_MODE: InFlightMode = "wait"
DEFAULT_IN_FLIGHT_LEASE_SECONDS = 30
DEFAULT_ON_STORAGE_ERROR: StorageErrorMode = "run"
#: The core's limits, in UTF-8 bytes (idempotency-kit: 255 and 100 characters).
MAX_KEY_LENGTH = 512
MAX_OPERATION_LENGTH = 128


# -- adapters ------------------------------------------------------------------------------


class ResultAdapter(Protocol[T]):
    """What idempotency-kit calls an adapter: ``encode`` a result to a JSON value, ``decode``
    it back. Generic: ``class OrderAdapter(ResultAdapter[Order])``."""

    def encode(self, value: T) -> Any:
        """The result as a JSON value."""
        ...

    def decode(self, data: Any) -> T:
        """The result back from its JSON value."""
        ...


class JsonResultAdapter(ResultAdapter[Any]):
    """Results that already are JSON values."""

    def encode(self, value: Any) -> Any:
        return value

    def decode(self, data: Any) -> Any:
        return data


class VoidResultAdapter(ResultAdapter[None]):
    """Actions that return ``None``: the record stores JSON ``null``."""

    def encode(self, value: None) -> Any:
        return None

    def decode(self, data: Any) -> None:
        return None


M = TypeVar("M")


class PydanticResultAdapter(ResultAdapter[M], Generic[M]):
    """Pydantic models, as ``model_dump(mode="json")``; ``None`` is refused (not storable)."""

    def __init__(self, model_class: type[M]) -> None:
        self.model_class = model_class

    def encode(self, value: M) -> Any:
        if value is None:
            raise InvalidKey(
                f"{type(self).__name__}({self.model_class.__name__}) cannot encode None. "
                "Use VoidResultAdapter for an action that returns None, or JsonResultAdapter for one that may."
            )
        return value.model_dump(mode="json")  # type: ignore[attr-defined]

    def decode(self, data: Any) -> M:
        if data is None:
            raise ValueError("cannot decode a null idempotency payload")
        return self.model_class.model_validate(data)  # type: ignore[attr-defined, no-any-return]


# -- fingerprints --------------------------------------------------------------------------


def _iso_duration(span: datetime.timedelta) -> str:
    seconds = span.total_seconds()
    sign, seconds = ("-", -seconds) if seconds < 0 else ("", seconds)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, rest = divmod(rest, 60)
    out = f"{sign}P{int(days)}D" if days else f"{sign}P"
    time = (f"{int(hours)}H" if hours else "") + (f"{int(minutes)}M" if minutes else "")
    if rest or not (days or time):
        time += f"{rest:g}S"
    return out + ("T" + time if time else "")


def _jsonable(value: Any) -> Any:
    """JSON forms for what ``json`` cannot write, as pydantic writes them (``Z`` for UTC)."""
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, (uuid.UUID, decimal.Decimal)):
        return str(value)
    if isinstance(value, datetime.datetime):
        text = value.isoformat()
        return text[:-6] + "Z" if text.endswith("+00:00") else text
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return _iso_duration(value)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    raise TypeError(f"{type(value).__name__} has no JSON form")


def fingerprint_of(**values: Any) -> str:
    """The SHA-256 hex digest of the named values as canonical JSON (keys sorted), the same
    digest idempotency-kit's ``fingerprint_of`` gives: pydantic's JSON forms (its
    ``to_jsonable_python`` when pydantic is installed), so a datetime in UTC ends in ``Z``."""
    try:
        from pydantic_core import to_jsonable_python
    except ImportError:  # pragma: no cover - pydantic is optional
        plain: Any = values
    else:
        plain = to_jsonable_python(values)
    canonical = json.dumps(plain, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=_jsonable)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


# -- the domain service --------------------------------------------------------------------


class IdempotencyDomainService:
    """TTL bounds and the default TTL; it also builds idempotency-kit's record models."""

    def __init__(
        self,
        *,
        default_ttl_minutes: int = DEFAULT_TTL_MINUTES,
        min_ttl_seconds: int = MIN_TTL_SECONDS,
        max_ttl_seconds: int = MAX_TTL_SECONDS,
    ) -> None:
        if default_ttl_minutes < 1:
            raise InvalidKey(f"default_ttl_minutes must be >= 1, got {default_ttl_minutes}")
        if min_ttl_seconds < 1:
            raise InvalidKey(f"min_ttl_seconds must be >= 1, got {min_ttl_seconds}")
        if max_ttl_seconds < min_ttl_seconds:
            raise InvalidKey(f"max_ttl_seconds ({max_ttl_seconds}) must be >= min_ttl_seconds ({min_ttl_seconds})")
        if not min_ttl_seconds <= default_ttl_minutes * 60 <= max_ttl_seconds:
            raise InvalidKey(
                f"Default TTL ({float(default_ttl_minutes * 60)}s) is outside allowed range "
                f"[{min_ttl_seconds}s, {max_ttl_seconds}s]"
            )
        self.default_ttl_minutes = default_ttl_minutes
        self.min_ttl_seconds = min_ttl_seconds
        self.max_ttl_seconds = max_ttl_seconds

    def ttl_of(self, ttl_seconds: float | None) -> tuple[float, bool]:
        """The TTL a call's record gets, and whether it may be stored at all.

        ``None`` is the default TTL. A TTL below a minute (0 included) is a minute, as in
        idempotency-kit; above it the seconds are kept exactly (idempotency-kit floors them to
        whole minutes). A TTL outside ``[min_ttl_seconds, max_ttl_seconds]`` cannot be
        stored: the call runs its action uncached, as idempotency-kit does.
        """
        if ttl_seconds is None:
            ttl = float(self.default_ttl_minutes * 60)
        else:
            ttl = max(float(ttl_seconds), 60.0)
        return ttl, self.min_ttl_seconds <= ttl <= self.max_ttl_seconds

    def create_record(
        self,
        operation: str,
        idempotency_key: str,
        result: Any,
        *,
        ttl_minutes: int | None = None,
        fingerprint: str | None = None,
    ) -> IdempotencyRecord:
        """A completed ``IdempotencyRecord`` (the model needs pydantic); the TTL is checked."""
        from .core.models.entities import IdempotencyRecord

        ttl = float((ttl_minutes if ttl_minutes is not None else self.default_ttl_minutes) * 60)
        if not self.min_ttl_seconds <= ttl <= self.max_ttl_seconds:
            raise InvalidTTL(ttl, float(self.min_ttl_seconds), float(self.max_ttl_seconds))
        return _validated(
            lambda: IdempotencyRecord.create(operation, idempotency_key, result, ttl, fingerprint=fingerprint)
        )

    def create_pending_record(
        self, operation: str, idempotency_key: str, *, lease_seconds: int, fingerprint: str | None = None
    ) -> IdempotencyRecord:
        """A pending ``IdempotencyRecord`` (an in-flight reservation) for ``lease_seconds``."""
        from .core.models.entities import IdempotencyRecord

        if lease_seconds < 1:
            raise InvalidKey(f"lease_seconds must be >= 1, got {lease_seconds}")
        return _validated(
            lambda: IdempotencyRecord.pending(operation, idempotency_key, lease_seconds, fingerprint=fingerprint)
        )

    def validate_record(self, record: IdempotencyRecord) -> None:
        """Raises ``IdempotencyRecordExpiredError`` for an expired record."""
        if record.is_expired:
            raise RecordExpired(record.operation, record.idempotency_key)


def _validated(build: Callable[[], T]) -> T:
    from pydantic import ValidationError

    try:
        return build()
    except ValidationError as e:
        raise InvalidKey(str(e), errors=e.errors()) from e


# -- metrics -------------------------------------------------------------------------------


@runtime_checkable
class IdempotencyMetricsProtocol(Protocol):
    """idempotency-kit's metrics protocol: the drop-in's coordinator tells it of hits, misses,
    collisions and errors (idemkit's own counters are the Rust core's: ``docs/metrics.md``)."""

    def record_hit(self, operation: str) -> None: ...
    def record_miss(self, operation: str) -> None: ...
    def record_collision(self, operation: str) -> None: ...
    def record_error(self, operation: str, error_type: str) -> None: ...
    def record_latency(self, operation: str, method: str, duration_seconds: float) -> None: ...
    def record_bulk_hit(self, operation: str, count: int) -> None: ...
    def record_bulk_miss(self, operation: str, count: int) -> None: ...


class NoOpIdempotencyMetrics(IdempotencyMetricsProtocol):
    """Records nothing."""

    def record_hit(self, operation: str) -> None:
        pass

    def record_miss(self, operation: str) -> None:
        pass

    def record_collision(self, operation: str) -> None:
        pass

    def record_error(self, operation: str, error_type: str) -> None:
        pass

    def record_latency(self, operation: str, method: str, duration_seconds: float) -> None:
        pass

    def record_bulk_hit(self, operation: str, count: int) -> None:
        pass

    def record_bulk_miss(self, operation: str, count: int) -> None:
        pass


# -- the repositories ----------------------------------------------------------------------


class AsyncIdempotencyRepository:
    """Where the drop-in's coordinator keeps records: an idemkit store, connected on first use.

    Not idempotency-kit's repository protocol (``get``, ``save``, ``replace`` ...): idemkit's
    coordinator reserves, renews and completes through the store's own atomic operations, so
    a repository is a store's address. Use ``RedisAsyncIdempotencyRepository``,
    ``PostgresIdempotencyRepository`` or ``MemoryIdempotencyRepository``.
    """

    def __init__(self) -> None:
        self._store: Store | None = None
        self._lock: asyncio.Lock | None = None

    async def _connect(self) -> Store:  # pragma: no cover - overridden
        raise NotImplementedError

    async def store(self) -> Store:
        """The store, connected on the first call (and again after a failed connect)."""
        if self._store is not None:
            return self._store
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._store is None:
                self._store = await self._connect()
        return self._store


class _RedisTarget:
    """Where a redis-py client keeps its data, as idemkit's store connects there: URLs (one,
    or a Cluster's nodes) and the TLS files and credentials. ``memory``: a fakeredis client,
    whose data lives in this process."""

    __slots__ = ("urls", "cluster", "memory", "auth")

    def __init__(
        self,
        urls: list[str],
        *,
        cluster: bool = False,
        memory: tuple[Any, Any] | None = None,
        auth: dict[str, Any] | None = None,
    ) -> None:
        self.urls, self.cluster, self.memory, self.auth = urls, cluster, memory, auth or {}


# One MemoryStore per fakeredis server and database: fakeredis clients of one server share its
# data, so repositories on them share records, as on a real server.
_FAKE_STORES: dict[tuple[int, Any], tuple[Any, MemoryStore]] = {}


def _fake_store(server: Any, db: Any) -> MemoryStore:
    found = _FAKE_STORES.get((id(server), db))
    if found is None or found[0] is not server:
        found = _FAKE_STORES[(id(server), db)] = (server, MemoryStore())
    return found[1]


# redis-py connection settings that decide nothing about where records live (timeouts,
# retries, encodings, client names, protocol, health checks, driver bookkeeping).
_IGNORED_KWARGS = {
    "socket_timeout", "socket_connect_timeout", "socket_keepalive", "socket_keepalive_options",
    "socket_read_size", "socket_type", "encoding", "encoding_errors", "decode_responses",
    "retry_on_error", "retry_on_timeout", "retry", "health_check_interval", "client_name",
    "lib_name", "lib_version", "driver_info", "redis_connect_func", "protocol", "legacy_responses",
    "himport_registry", "maint_notifications_pool_handler", "maint_notifications_config",
    "orig_host_address", "orig_socket_timeout", "orig_socket_connect_timeout", "connection_pool",
    "connection_class", "cache_config", "cache", "event_dispatcher", "credential_provider",
    "ssl_min_version", "ssl_ciphers", "ssl_include_verify_flags", "ssl_exclude_verify_flags",
    "max_connections", "single_connection_client", "ssl_validate_ocsp", "ssl_validate_ocsp_stapled",
    "ssl_ocsp_context", "ssl_ocsp_expected_cert",
}


def _refuse(what: str) -> ConfigError:
    return ConfigError(
        f"the redis client's {what} cannot be carried to idemkit's store, and records would land "
        "elsewhere or unprotected: give RedisAsyncIdempotencyRepository a URL, or an "
        "idemkit.RedisStore (RedisStore.connect takes ssl_ca_certs, ssl_certfile, ssl_keyfile, "
        "username and password)"
    )


def _tls_and_auth(kwargs: dict[str, Any], tls: bool) -> dict[str, Any]:
    """The TLS files and credentials of a client's connection settings, or a refusal of what
    idemkit cannot do as the client would (skip the certificate or host name check, a CA
    directory or in-memory CA, a key's password, a credential provider)."""
    if kwargs.get("credential_provider") is not None:
        raise _refuse("credential_provider")
    auth: dict[str, Any] = {"username": kwargs.get("username"), "password": kwargs.get("password")}
    if auth["username"] is not None and auth["password"] is None:
        raise _refuse("username without a password")
    if not tls:
        return auth
    reqs = kwargs.get("ssl_cert_reqs", "required")
    if reqs not in ("required", None, 2) and str(reqs).lower() not in ("required", "cert_required", "verifymode.cert_required"):
        raise _refuse(f"ssl_cert_reqs={reqs!r} (idemkit always checks the server's certificate)")
    if kwargs.get("ssl_check_hostname") is False:
        raise _refuse("ssl_check_hostname=False (idemkit always checks the host name)")
    for unsupported in ("ssl_ca_path", "ssl_ca_data", "ssl_password"):
        if kwargs.get(unsupported):
            raise _refuse(unsupported)
    auth.update(
        ssl_ca_certs=kwargs.get("ssl_ca_certs"),
        ssl_certfile=kwargs.get("ssl_certfile"),
        ssl_keyfile=kwargs.get("ssl_keyfile"),
    )
    if (auth["ssl_certfile"] is None) != (auth["ssl_keyfile"] is None):
        raise _refuse("ssl_certfile without ssl_keyfile (or the other way round)")
    return auth


def _redis_target(client: Any) -> _RedisTarget:
    """What a redis-py client (sync or asyncio), a fakeredis client or a URL says about where
    records live, all of it, or a ``ConfigError`` naming what cannot be carried. Never a guess:
    a default address for a client whose address it cannot read would put the records on
    another server."""
    if isinstance(client, str):
        return _RedisTarget([client])
    module = type(client).__module__ or ""
    if module.split(".")[0] == "fakeredis":
        # Its data is this process's: so is MemoryStore's, which still deduplicates.
        kwargs = dict(getattr(getattr(client, "connection_pool", None), "connection_kwargs", {}) or {})
        return _RedisTarget([], memory=(kwargs.get("server", client), kwargs.get("db", 0)))
    if callable(getattr(client, "get_nodes", None)) and hasattr(client, "startup_nodes"):
        kwargs = dict(getattr(client, "connection_kwargs", {}) or {})
        connection_class = kwargs.get("connection_class")
        tls = bool(kwargs.get("ssl")) or "SSL" in getattr(connection_class, "__name__", "")
        auth = _tls_and_auth(kwargs, tls)
        nodes = list(client.get_nodes()) or list(getattr(client, "startup_nodes", {}).values())
        if not nodes:
            raise _refuse("Cluster without nodes")
        scheme = "rediss" if tls else "redis"
        return _RedisTarget([f"{scheme}://{n.host}:{n.port}" for n in nodes], cluster=True, auth=auth)
    pool = getattr(client, "connection_pool", None)
    if pool is None:
        raise ConfigError(
            f"{type(client).__name__} is not a redis-py client (no connection_pool): give "
            "RedisAsyncIdempotencyRepository a redis.Redis, redis.asyncio.Redis, RedisCluster or a URL"
        )
    connection_class = getattr(pool, "connection_class", None)
    class_name = getattr(connection_class, "__name__", "")
    if "Sentinel" in type(pool).__name__ or "Sentinel" in class_name:
        return _sentinel_target(pool, class_name)
    kwargs = dict(getattr(pool, "connection_kwargs", {}) or {})
    unknown = sorted(k for k in kwargs if k not in _IGNORED_KWARGS and not k.startswith("ssl") and k not in ("host", "port", "db", "path", "username", "password"))
    if unknown:
        raise _refuse(f"settings {unknown}")
    if "path" in kwargs:
        if class_name != "UnixDomainSocketConnection":
            raise _refuse(f"connection class {class_name}")
        return _RedisTarget([f"unix://{kwargs['path']}?db={kwargs.get('db', 0)}"], auth=_tls_and_auth(kwargs, False))
    if class_name not in ("Connection", "SSLConnection"):
        raise _refuse(f"connection class {class_name or type(pool).__name__}")
    tls = class_name == "SSLConnection"
    auth = _tls_and_auth(kwargs, tls)
    host, port, db = kwargs.get("host", "localhost"), kwargs.get("port", 6379), kwargs.get("db", 0)
    return _RedisTarget([f"{'rediss' if tls else 'redis'}://{host}:{port}/{db}"], auth=auth)


def _sentinel_target(pool: Any, class_name: str) -> _RedisTarget:
    """A ``Sentinel(...).master_for(name)`` client: the sentinels' addresses, the master's
    name, database, credentials and TLS, as a ``redis+sentinel://`` URL the store follows
    through failovers."""
    service = getattr(pool, "service_name", None)
    manager = getattr(pool, "sentinel_manager", None)
    sentinels = list(getattr(manager, "sentinels", []) or [])
    if not service or not sentinels:
        raise _refuse("Sentinel pool without a master name or sentinels")
    sentinel_kwargs = [dict(getattr(x.connection_pool, "connection_kwargs", {}) or {}) for x in sentinels]
    if any(k.get("password") or k.get("username") for k in sentinel_kwargs):
        raise _refuse("sentinels' own password (sentinel_kwargs): idemkit's store connects to sentinels without one")
    tls = "SSL" in class_name
    sentinel_tls = any("SSL" in getattr(x.connection_pool.connection_class, "__name__", "") for x in sentinels)
    if tls != sentinel_tls:
        raise _refuse("TLS to the master but not to the sentinels, or the other way round (idemkit's store uses TLS for both or neither)")
    kwargs = dict(getattr(pool, "connection_kwargs", {}) or {})
    auth = _tls_and_auth(kwargs, tls)
    hosts = ",".join(f"{k.get('host', 'localhost')}:{k.get('port', 26379)}" for k in sentinel_kwargs)
    scheme = "rediss+sentinel" if tls else "redis+sentinel"
    return _RedisTarget([f"{scheme}://{hosts}/{service}/{kwargs.get('db', 0)}"], auth=auth)


def _url_of(client: Any) -> str:
    """The URL a redis-py client connects to (without its credentials and TLS files: see
    ``_redis_target``)."""
    return _redis_target(client).urls[0]


class RedisAsyncIdempotencyRepository(AsyncIdempotencyRepository):
    """idempotency-kit's Redis repository: give it your ``redis.asyncio`` (or ``redis``)
    client, or a URL. idemkit keeps connections of its own, made with everything that decides
    where the client's data lives: host, port and database (or its Unix socket), user and
    password, TLS (``rediss``, ``ssl_ca_certs``, ``ssl_certfile``, ``ssl_keyfile``), a
    ``RedisCluster``'s nodes, a ``Sentinel(...).master_for(name)`` client's sentinels and
    master name (the store follows the master through failovers). What it cannot carry (a
    certificate check switched off, a credential provider, a password for the sentinels
    themselves, settings it does not know) raises ``ConfigError``
    here, at construction: a client is never replaced by a guess. A fakeredis client gets
    idemkit's in-memory store (its data is this process's too), which still deduplicates.

    ``key_prefix`` becomes the idemkit prefix (without its trailing ``:``).
    """

    def __init__(self, redis: Any, *, key_prefix: str = "idempotency:", metrics: Any = None) -> None:
        super().__init__()
        self._client = redis
        self._target = _redis_target(redis)
        self._prefix = key_prefix.rstrip(":") or "idempotency"
        self._metrics = metrics

    async def _connect(self) -> Store:
        target = self._target
        if target.memory is not None:
            return _fake_store(*target.memory)
        if target.cluster:
            return await RedisStore.connect_cluster(target.urls, prefix=self._prefix, **target.auth)
        return await RedisStore.connect(target.urls[0], prefix=self._prefix, **target.auth)


class PostgresIdempotencyRepository(AsyncIdempotencyRepository):
    """Records in PostgreSQL (idemkit's table), for code that wants the drop-in there."""

    def __init__(self, url: str, *, table: str | None = None) -> None:
        super().__init__()
        self._url, self._table = url, table

    async def _connect(self) -> Store:
        return await PostgresStore.connect(self._url, table=self._table)


class MemoryIdempotencyRepository(AsyncIdempotencyRepository):
    """Records in this process (tests)."""

    async def _connect(self) -> Store:
        return MemoryStore()


# -- the coordinator -----------------------------------------------------------------------

# A record made with a fingerprint starts with it: MARK, the fingerprint as a JSON string, a
# newline, then the result's JSON. A JSON text never starts with this byte, so a record made
# without one (the bare JSON) is never mistaken for it.
_FP_MARK = b"\x1eidempotency-fingerprint "


class _Bytes:
    """The core's codec for the drop-in: the coordinator encodes and decodes itself (the
    fingerprint rides in the record); anything but bytes is a result it could not encode."""

    __slots__ = ()

    def encode(self, value: Any) -> bytes:
        if isinstance(value, bytes):
            return value
        raise TypeError(f"the adapter could not encode the result: {value}")

    def decode(self, data: bytes) -> bytes:
        return data

    def __repr__(self) -> str:
        return "the drop-in's adapter"


_BYTES = _Bytes()


class _Unencodable:
    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def __str__(self) -> str:
        return f"{type(self.error).__name__}: {self.error}"


class _Uncached(Exception):
    """Raised out of the action so that the core releases the key: the result is returned
    but not stored (a TTL outside the domain service's bounds)."""


class _Outcome:
    __slots__ = ("ran", "value", "protected", "encoded")

    def __init__(self) -> None:
        self.ran = False
        self.value: Any = None
        self.protected = True
        self.encoded: bytes | None = None


class AsyncIdempotencyCoordinator:
    """idempotency-kit's coordinator, run by idemkit: reserve, renew, complete, replay.

    ``in_flight`` is ``"wait"`` (the default), ``"raise"`` (``IdempotencyInProgressError`` at
    once) or ``"run"`` (the duplicate runs too; its caller gets the stored result when the
    first one's is there by then). ``on_storage_error="run"`` (the default) runs the action
    unprotected when the store is unreachable, from the first call on; a corrupt record always
    raises. ``metrics`` is told of hits, misses, collisions and errors. ``on_cancel`` (an
    idemkit addition) is what a cancelled action leaves: ``"keep"`` its reservation until the
    lease (``in_flight_lease_seconds``) ends, as a crash does; ``"release"`` the key at once.
    """

    def __init__(
        self,
        repository: AsyncIdempotencyRepository,
        domain_service: IdempotencyDomainService | None = None,
        operation_ttls: dict[str, int] | None = None,
        metrics: IdempotencyMetricsProtocol | None = None,
        enabled: bool = True,
        in_flight: InFlightMode = DEFAULT_IN_FLIGHT_MODE,
        in_flight_lease_seconds: int = DEFAULT_IN_FLIGHT_LEASE_SECONDS,
        on_storage_error: StorageErrorMode = DEFAULT_ON_STORAGE_ERROR,
        *,
        on_cancel: Literal["keep", "release"] = "keep",
    ) -> None:
        if in_flight not in ("wait", "raise", "run"):
            raise InvalidKey(f"in_flight must be one of ('wait', 'raise', 'run'), got {in_flight!r}")
        if in_flight_lease_seconds < 1:
            raise InvalidKey(f"in_flight_lease_seconds must be >= 1, got {in_flight_lease_seconds}")
        if on_storage_error not in ("run", "raise"):
            raise InvalidKey(f"on_storage_error must be one of ('run', 'raise'), got {on_storage_error!r}")
        if not isinstance(repository, AsyncIdempotencyRepository):
            raise TypeError(
                f"{type(repository).__name__} is not an idemkit repository: idemkit's coordinator keeps its "
                "records through an idemkit store (RedisAsyncIdempotencyRepository, PostgresIdempotencyRepository, "
                "MemoryIdempotencyRepository), not through a repository's get/save/replace"
            )
        self._repo = repository
        self._svc = domain_service or IdempotencyDomainService()
        self._operation_ttls = operation_ttls or {}
        self._metrics: IdempotencyMetricsProtocol = metrics or NoOpIdempotencyMetrics()
        self._enabled = enabled
        self._mode = in_flight
        self._lease = in_flight_lease_seconds
        self._fail_open = on_storage_error == "run"
        self._on_cancel = on_cancel
        self._coordinator: Coordinator | None = None

    async def _get(self) -> Coordinator:
        if self._coordinator is None:
            store = await self._repo.store()
            if self._coordinator is None:
                self._coordinator = Coordinator(
                    store,
                    lease=float(self._lease),
                    wait_timeout=float(self._lease),
                    fail_open=self._fail_open,
                    on_cancel=self._on_cancel,
                )
        return self._coordinator

    async def coordinate(
        self,
        operation: str,
        idempotency_key: str | None,
        ttl_seconds: int | None,
        adapter: ResultAdapter[T],
        action: Callable[..., Awaitable[T]],
        /,
        *args: Any,
        idempotency_fingerprint: str | None = None,
        **kwargs: Any,
    ) -> T:
        """Runs ``action(*args, **kwargs)`` at most once for ``(operation, idempotency_key)``.

        A ``None`` key, or ``enabled=False``, runs the action plainly. An invalid operation or
        key raises ``IdempotencyValidationError`` before anything runs: never an unprotected
        run. The TTL is ``operation_ttls[operation]``, else ``ttl_seconds``, else the domain
        service's default: exact seconds, a minute at least; one outside the domain service's
        bounds runs the action uncached. ``idempotency_fingerprint`` is stored with the
        record; a later call with another one raises ``IdempotencyKeyReuseError``, and a call
        without one (or a record without one) is not compared.
        """
        if not self._enabled or idempotency_key is None:
            return await _maybe_await(action(*args, **kwargs))
        _native.validate(operation, idempotency_key)
        ttl, storable = self._svc.ttl_of(self._operation_ttls.get(operation) or ttl_seconds)
        try:
            coordinator = await self._get()
        except StoreUnavailable as e:
            self._metrics.record_error(operation, "storage_reserve_error")
            if not self._fail_open:
                e.operation, e.key = operation, idempotency_key
                raise
            logger.warning(
                "Idempotency store unreachable; running the operation without idempotency",
                extra={"operation": operation, "idempotency_key": idempotency_key, "error": str(e)},
            )
            return await _maybe_await(action(*args, **kwargs))
        if not storable:
            self._metrics.record_error(operation, "record_validation_error")
            logger.error(
                "Idempotency record rejected; this operation will not be cached",
                extra={"operation": operation, "idempotency_key": idempotency_key, "ttl_seconds": ttl},
            )
        outcome = _Outcome()
        fingerprint = idempotency_fingerprint

        async def run(attempt: Any, *_: Any) -> Any:
            value: Any = await _maybe_await(action(*args, **kwargs))
            outcome.ran, outcome.value, outcome.protected = True, value, attempt.is_protected
            if not storable:
                raise _Uncached
            try:
                outcome.encoded = _encode(adapter, value, fingerprint)
            except Exception as e:  # noqa: BLE001 - any adapter failure: the result is not storable
                self._metrics.record_error(operation, "record_validation_error")
                logger.exception(
                    "Idempotency record rejected; the key stays completed without a result",
                    extra={"operation": operation, "idempotency_key": idempotency_key},
                )
                return _Unencodable(e)
            return outcome.encoded

        call = coordinator.call(
            operation,
            idempotency_key,
            ttl=ttl if storable else float(self._lease),
            in_flight="reject" if self._mode == "raise" else self._mode,
            codec=_BYTES,
        )
        try:
            replayed = await call.run(run)
        except _Uncached:
            self._metrics.record_miss(operation)
            return outcome.value  # type: ignore[no-any-return]
        except InProgress:
            self._metrics.record_collision(operation)
            raise
        except StoreError:
            self._metrics.record_error(operation, "storage_error")
            raise
        if outcome.ran:
            if not outcome.protected and self._mode == "run":
                self._metrics.record_collision(operation)
                return await self._stored_winner(coordinator, call.ttl, operation, idempotency_key, adapter, outcome, fingerprint)
            self._metrics.record_miss(operation)
            return outcome.value  # type: ignore[no-any-return]
        self._metrics.record_hit(operation)
        return self._decode(adapter, replayed, fingerprint, operation, idempotency_key)

    async def _stored_winner(
        self,
        coordinator: Coordinator,
        ttl: float,
        operation: str,
        key: str,
        adapter: ResultAdapter[T],
        outcome: _Outcome,
        fingerprint: str | None,
    ) -> T:
        """``in_flight="run"``: the duplicate ran beside a live owner; its caller gets the
        owner's stored result if it is there by now (as idempotency-kit's ``SET NX`` loser
        does), stores its own if the key is free, and keeps its own otherwise."""
        mine: Any = outcome.value
        if outcome.encoded is None:
            return mine  # type: ignore[no-any-return]
        encoded = outcome.encoded
        stored_ours = False

        async def ours(_attempt: Any) -> bytes:
            nonlocal stored_ours
            stored_ours = True
            return encoded

        try:
            replayed = await coordinator.call(operation, key, ttl=ttl, in_flight="reject", codec=_BYTES).run(ours)
            if stored_ours:
                return mine  # type: ignore[no-any-return]
            return self._decode(adapter, replayed, fingerprint, operation, key)
        except IdemkitError as e:
            logger.info(
                "Idempotency key still in flight or unreadable after an unprotected run; keeping our own result",
                extra={"operation": operation, "idempotency_key": key, "error": type(e).__name__},
            )
            return mine  # type: ignore[no-any-return]

    def _decode(self, adapter: ResultAdapter[T], data: bytes, fingerprint: str | None, operation: str, key: str) -> T:
        body = data
        if data.startswith(_FP_MARK):
            head, _, body = data[len(_FP_MARK) :].partition(b"\n")
            stored = json.loads(head)
            if fingerprint is not None and stored != fingerprint:
                self._metrics.record_error(operation, "key_reuse")
                logger.warning(
                    "Idempotency key reused for a different request",
                    extra={"operation": operation, "idempotency_key": key},
                )
                raise KeyReused(operation, key, stored, fingerprint)
        try:
            return adapter.decode(json.loads(body))
        except Exception as e:
            self._metrics.record_error(operation, "decode_error")
            error = DecodeError(f"the stored result of {operation} {key!r} is not {type(adapter).__name__}'s: {e}")
            error.operation, error.key = operation, key
            raise error from e


async def _maybe_await(value: Awaitable[T] | T) -> T:
    """An async action's value, or a plain function's (already computed)."""
    if inspect.isawaitable(value):
        return cast(T, await value)
    return value


def _json_value(value: Any, path: str = "result") -> None:
    """Refuses what JSON would not give back as it was: a value comes back from a replay as
    the type it had, or is not stored at all. ``json`` writes a tuple as a list and would give
    a ``datetime``, ``Decimal``, ``UUID``, ``set`` or ``bytes`` back as ``str`` or ``list``
    through a ``default=``; a dict key that is not a ``str`` comes back as one."""
    if value is None or type(value) in (str, int, float, bool):
        return
    if type(value) is list:
        for i, item in enumerate(value):
            _json_value(item, f"{path}[{i}]")
        return
    if type(value) is dict:
        for k, item in value.items():
            if type(k) is not str:
                raise TypeError(f"{path} has a key {k!r} of type {type(k).__name__}: JSON gives it back as a str")
            _json_value(item, f"{path}[{k!r}]")
        return
    raise TypeError(
        f"{path} is a {type(value).__name__}, which JSON does not give back as it was "
        "(a replay would return another type): convert it in the action or use an adapter that encodes it"
    )


def _encode(adapter: ResultAdapter[Any], value: Any, fingerprint: str | None) -> bytes:
    encoded = adapter.encode(value)
    _json_value(encoded)
    body = json.dumps(encoded, separators=(",", ":"), ensure_ascii=False).encode()
    if fingerprint is None:
        return body
    return _FP_MARK + json.dumps(fingerprint).encode() + b"\n" + body


# -- the decorator -------------------------------------------------------------------------

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def async_idempotent(
    operation: str,
    adapter: ResultAdapter[T],
    ttl_seconds: int | None = None,
    key_param: str = "idempotency_key",
    infra_param: str | None = None,
    fingerprint_params: tuple[str, ...] | None = None,
) -> Callable[[Callable[..., Awaitable[T]]], Callable[..., Awaitable[T]]]:
    """idempotency-kit's decorator: the key from the ``key_param`` argument, the coordinator
    from ``infra_param`` (an argument, or an attribute of ``self``) or found by type among the
    arguments and ``self``'s attributes; ``fingerprint_params`` name the arguments that make
    the request's fingerprint. A missing parameter in ``fingerprint_params`` fails at decoration.
    """

    def decorator(func: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
        try:
            signature: inspect.Signature | None = inspect.signature(func)
        except (TypeError, ValueError):
            # A callable inspect cannot describe: the key is read from the keyword arguments.
            signature = None
        parameters = list(signature.parameters.values()) if signature is not None else []
        names = [p.name for p in parameters]
        key_index = next((i for i, p in enumerate(parameters) if p.name == key_param and p.kind in _POSITIONAL), None)
        if fingerprint_params:
            if signature is None:
                raise TypeError(f"fingerprint_params needs a signature inspect can describe; {func!r} has none")
            unknown = [n for n in fingerprint_params if n not in names]
            if unknown:
                raise TypeError(f"fingerprint_params names parameters {func.__qualname__} does not have: {unknown}")

        @functools.wraps(func)
        async def wrapper(*args: Any, **kwargs: Any) -> T:
            if key_param in kwargs:
                key = kwargs[key_param]
            elif key_index is not None and key_index < len(args):
                key = args[key_index]
            else:
                key = None
            if key is None:
                return await func(*args, **kwargs)
            coordinator = _find_coordinator(args, kwargs, infra_param)
            if coordinator is None:
                logger.warning(
                    "No idempotency coordinator found; running the operation without idempotency",
                    extra={"operation": operation, "idempotency_key": key, "infra_param": infra_param},
                )
                return await func(*args, **kwargs)
            fingerprint = None
            if fingerprint_params and signature is not None:
                bound = signature.bind(*args, **kwargs)
                bound.apply_defaults()
                fingerprint = fingerprint_of(**{n: bound.arguments[n] for n in fingerprint_params})
            return await coordinator.coordinate(
                operation, key, ttl_seconds, adapter, func, *args, idempotency_fingerprint=fingerprint, **kwargs
            )

        return wrapper

    return decorator


def _find_coordinator(
    args: tuple[Any, ...], kwargs: dict[str, Any], infra_param: str | None
) -> AsyncIdempotencyCoordinator | None:
    if infra_param:
        named = kwargs.get(infra_param)
        if named is None and args:
            named = getattr(args[0], infra_param, None)
        if named is not None:
            return named  # type: ignore[no-any-return]
    for value in kwargs.values():
        if isinstance(value, AsyncIdempotencyCoordinator):
            return value
    for arg in args:
        if isinstance(arg, AsyncIdempotencyCoordinator):
            return arg
        if hasattr(arg, "__dict__"):
            for attr in vars(arg).values():
                if isinstance(attr, AsyncIdempotencyCoordinator):
                    return attr
    return None


__all__ = [
    "AsyncIdempotencyCoordinator",
    "AsyncIdempotencyRepository",
    "IdempotencyDomainService",
    "IdempotencyMetricsProtocol",
    "JsonResultAdapter",
    "MemoryIdempotencyRepository",
    "NoOpIdempotencyMetrics",
    "PostgresIdempotencyRepository",
    "PydanticResultAdapter",
    "RedisAsyncIdempotencyRepository",
    "ResultAdapter",
    "VoidResultAdapter",
    "async_idempotent",
    "fingerprint_of",
]
