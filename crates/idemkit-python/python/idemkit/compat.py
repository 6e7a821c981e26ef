"""A drop-in for idempotency-kit 0.5.0's public API, on the idemkit core.

Code written for idempotency-kit runs with only its import changed: ``import idemkit as ik``
(or ``from idemkit import AsyncIdempotencyCoordinator, ...``; the Redis repository is also at
``idemkit.infra.storage.redis.aio.repository``). What differs, each safer, is listed in
``docs/python.md`` ("Differences from idempotency-kit").
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
from typing import Any, Literal, TypeVar
from urllib.parse import quote

from ._coordinator import Coordinator, MemoryStore, PostgresStore, RedisStore, Store
from ._errors import ConfigError, IdemkitError, InvalidKey, InvalidTTL, StoreError

T = TypeVar("T")
logger = logging.getLogger("idemkit")

InFlightMode = Literal["wait", "raise", "run"]
StorageErrorMode = Literal["run", "raise"]

DEFAULT_TTL_MINUTES = 60
MIN_TTL_SECONDS = 60
MAX_TTL_SECONDS = 30 * 24 * 3600
DEFAULT_IN_FLIGHT_LEASE_SECONDS = 30


# -- adapters ------------------------------------------------------------------------------


class ResultAdapter:
    """What idempotency-kit calls an adapter: ``encode`` to a JSON value, ``decode`` back."""

    def encode(self, value: Any) -> Any:  # pragma: no cover - protocol
        raise NotImplementedError

    def decode(self, data: Any) -> Any:  # pragma: no cover - protocol
        raise NotImplementedError


class JsonResultAdapter(ResultAdapter):
    """Results that already are JSON values."""

    def encode(self, value: Any) -> Any:
        return value

    def decode(self, data: Any) -> Any:
        return data


class VoidResultAdapter(ResultAdapter):
    """Actions that return ``None``: the record stores JSON ``null``."""

    def encode(self, value: None) -> Any:
        return None

    def decode(self, data: Any) -> None:
        return None


class PydanticResultAdapter(ResultAdapter):
    """Pydantic models, as ``model_dump(mode="json")``; ``None`` is refused (not storable)."""

    def __init__(self, model_class: type) -> None:
        self.model_class = model_class

    def encode(self, value: Any) -> Any:
        if value is None:
            raise InvalidKey(
                f"PydanticResultAdapter({self.model_class.__name__}) cannot encode None. "
                "Use VoidResultAdapter for an action that returns None, or JsonResultAdapter for one that may."
            )
        return value.model_dump(mode="json")

    def decode(self, data: Any) -> Any:
        if data is None:
            raise ValueError("cannot decode a null idempotency payload")
        return self.model_class.model_validate(data)


class _AdapterCodec:
    """An adapter seen as an idemkit codec: the adapter's JSON value, as JSON bytes."""

    __slots__ = ("adapter",)

    def __init__(self, adapter: ResultAdapter) -> None:
        self.adapter = adapter

    def encode(self, value: Any) -> bytes:
        return json.dumps(self.adapter.encode(value), separators=(",", ":"), ensure_ascii=False).encode()

    def decode(self, data: bytes) -> Any:
        return self.adapter.decode(json.loads(data))

    def __repr__(self) -> str:
        return f"{type(self.adapter).__name__}()"


# -- fingerprints --------------------------------------------------------------------------


def _jsonable(value: Any) -> Any:
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, (uuid.UUID, decimal.Decimal)):
        return str(value)
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    raise TypeError(f"{type(value).__name__} has no JSON form")


def fingerprint_of(**values: Any) -> str:
    """The SHA-256 hex digest of the named values as canonical JSON (keys sorted)."""
    canonical = json.dumps(values, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=_jsonable)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


# -- the domain service and the repositories ----------------------------------------------


class IdempotencyDomainService:
    """TTL bounds and the default TTL (only its TTL settings matter to idemkit)."""

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
                f"Default TTL ({default_ttl_minutes * 60}s) is outside allowed range [{min_ttl_seconds}s, {max_ttl_seconds}s]"
            )
        self.default_ttl_minutes = default_ttl_minutes
        self.min_ttl_seconds = min_ttl_seconds
        self.max_ttl_seconds = max_ttl_seconds

    def ttl_for(self, ttl_seconds: float | None) -> float:
        """The TTL of a record: exactly ``ttl_seconds``, or the default; out of bounds raises."""
        ttl = float(self.default_ttl_minutes * 60) if ttl_seconds is None else float(ttl_seconds)
        if not self.min_ttl_seconds <= ttl <= self.max_ttl_seconds:
            raise InvalidTTL(ttl, float(self.min_ttl_seconds), float(self.max_ttl_seconds))
        return ttl


class _Repository:
    """Where the drop-in's coordinator keeps records: an idemkit store, connected on first use."""

    def __init__(self) -> None:
        self._store: Store | None = None
        self._lock: asyncio.Lock | None = None

    async def _connect(self) -> Store:  # pragma: no cover - overridden
        raise NotImplementedError

    async def store(self) -> Store:
        if self._store is not None:
            return self._store
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._store is None:
                self._store = await self._connect()
        return self._store


def _url_of(client: Any) -> str:
    """The URL a redis-py client connects to, from its pool's connection arguments."""
    if isinstance(client, str):
        return client
    pool = getattr(client, "connection_pool", None)
    kwargs = dict(getattr(pool, "connection_kwargs", {}) or {})
    if "path" in kwargs:
        return f"unix://{kwargs['path']}?db={kwargs.get('db', 0)}"
    scheme = "rediss" if kwargs.get("ssl") or "SSL" in type(getattr(pool, "connection_class", "")).__name__ else "redis"
    auth = ""
    if kwargs.get("password"):
        user = quote(kwargs.get("username") or "", safe="")
        auth = f"{user}:{quote(kwargs['password'], safe='')}@"
    host, port, db = kwargs.get("host", "127.0.0.1"), kwargs.get("port", 6379), kwargs.get("db", 0)
    return f"{scheme}://{auth}{host}:{port}/{db}"


class RedisAsyncIdempotencyRepository(_Repository):
    """idempotency-kit's Redis repository: give it your ``redis.asyncio`` client (only its
    address is used; idemkit keeps connections of its own) or a URL.

    ``key_prefix`` becomes the idemkit prefix (without its trailing ``:``). A
    ``redis.asyncio.RedisCluster`` client connects to the Cluster.
    """

    def __init__(self, redis: Any, *, key_prefix: str = "idempotency:", metrics: Any = None) -> None:
        super().__init__()
        self._client = redis
        self._prefix = key_prefix.rstrip(":") or "idempotency"
        self._metrics = metrics

    async def _connect(self) -> Store:
        nodes = getattr(self._client, "get_nodes", None)
        if callable(nodes) and not isinstance(self._client, str):
            urls = [f"redis://{n.host}:{n.port}" for n in nodes()] or [
                f"redis://{self._client.get_default_node().host}:{self._client.get_default_node().port}"
            ]
            return await RedisStore.connect_cluster(urls, prefix=self._prefix)
        return await RedisStore.connect(_url_of(self._client), prefix=self._prefix)


class PostgresIdempotencyRepository(_Repository):
    """Records in PostgreSQL (idemkit's table), for code that wants the drop-in there."""

    def __init__(self, url: str, *, table: str | None = None) -> None:
        super().__init__()
        self._url, self._table = url, table

    async def _connect(self) -> Store:
        return await PostgresStore.connect(self._url, table=self._table)


class MemoryIdempotencyRepository(_Repository):
    """Records in this process (tests)."""

    async def _connect(self) -> Store:
        return MemoryStore()


AsyncIdempotencyRepository = _Repository


class NoOpIdempotencyMetrics:
    """idempotency-kit's metrics protocol, recording nothing; idemkit's own counters are
    the Rust core's (``docs/metrics.md``)."""

    def record_hit(self, operation: str) -> None: ...
    def record_miss(self, operation: str) -> None: ...
    def record_collision(self, operation: str) -> None: ...
    def record_error(self, operation: str, error_type: str) -> None: ...
    def record_latency(self, operation: str, phase: str, seconds: float) -> None: ...


IdempotencyMetricsProtocol = NoOpIdempotencyMetrics


# -- the coordinator -----------------------------------------------------------------------


class AsyncIdempotencyCoordinator:
    """idempotency-kit's coordinator, run by idemkit: reserve, renew, complete, replay.

    ``in_flight`` is ``"wait"`` (the default), ``"raise"`` (``IdempotencyInProgressError`` at
    once) or ``"run"``. ``on_storage_error="run"`` (idempotency-kit's default) runs the
    action unprotected only when the store is unreachable; a corrupt record always raises.
    """

    def __init__(
        self,
        repository: _Repository,
        domain_service: IdempotencyDomainService | None = None,
        operation_ttls: dict[str, int] | None = None,
        metrics: Any = None,
        enabled: bool = True,
        in_flight: InFlightMode = "wait",
        in_flight_lease_seconds: int = DEFAULT_IN_FLIGHT_LEASE_SECONDS,
        on_storage_error: StorageErrorMode = "run",
    ) -> None:
        if in_flight not in ("wait", "raise", "run"):
            raise InvalidKey(f"in_flight must be one of ('wait', 'raise', 'run'), got {in_flight!r}")
        if in_flight_lease_seconds < 1:
            raise InvalidKey(f"in_flight_lease_seconds must be >= 1, got {in_flight_lease_seconds}")
        if on_storage_error not in ("run", "raise"):
            raise InvalidKey(f"on_storage_error must be one of ('run', 'raise'), got {on_storage_error!r}")
        self._repo = repository
        self._svc = domain_service or IdempotencyDomainService()
        self._operation_ttls = operation_ttls or {}
        self._metrics = metrics or NoOpIdempotencyMetrics()
        self._enabled = enabled
        self._in_flight = "reject" if in_flight == "raise" else in_flight
        self._lease = in_flight_lease_seconds
        self._fail_open = on_storage_error == "run"
        self._coordinator: Coordinator | None = None

    async def _get(self) -> Coordinator:
        if self._coordinator is None:
            store = await self._repo.store()
            if self._coordinator is None:
                self._coordinator = Coordinator(
                    store, lease=float(self._lease), wait_timeout=float(self._lease), fail_open=self._fail_open
                )
        return self._coordinator

    async def coordinate(
        self,
        operation: str,
        idempotency_key: str | None,
        ttl_seconds: int | None,
        adapter: ResultAdapter,
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
        service's default, in exact seconds.
        """
        if not self._enabled or idempotency_key is None:
            return await action(*args, **kwargs)
        ttl = self._svc.ttl_for(self._operation_ttls.get(operation) or ttl_seconds)
        coordinator = await self._get()
        call = coordinator.call(
            operation,
            idempotency_key,
            ttl=ttl,
            in_flight=self._in_flight,  # type: ignore[arg-type]
            fingerprint=idempotency_fingerprint,
            codec=_AdapterCodec(adapter),
        )
        return await call.run(_without_attempt, action, args, kwargs)


async def _without_attempt(_attempt: Any, action: Callable[..., Awaitable[T]], args: Any, kwargs: Any) -> T:
    return await action(*args, **kwargs)


# -- the decorator -------------------------------------------------------------------------

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def async_idempotent(
    operation: str,
    adapter: ResultAdapter,
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
                    extra={"operation": operation, "idempotency_key": key},
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


def _find_coordinator(args: tuple, kwargs: dict, infra_param: str | None) -> AsyncIdempotencyCoordinator | None:
    if infra_param:
        named = kwargs.get(infra_param)
        if named is None and args:
            named = getattr(args[0], infra_param, None)
        if named is not None:
            return named
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

# idempotency-kit's exception names.
IdempotencyError = IdemkitError
IdempotencyValidationError = InvalidKey
IdempotencyInvalidTTLError = InvalidTTL
IdempotencyStorageError = StoreError
_ = ConfigError
