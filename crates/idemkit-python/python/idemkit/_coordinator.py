"""The coordinator: reserve the key, run the action once, store its result, replay it."""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Generic, Literal, TypeVar

from . import _native
from ._errors import DecodeError, IdemkitError
from .codecs import JSON, Codec

T = TypeVar("T")

InFlightMode = Literal["wait", "reject", "run"]

#: The TTL of a call that names none: a day, the seed's advice for a queue.
DEFAULT_TTL = 86_400.0

Attempt = _native.Attempt


class Store:
    """A store the coordinator keeps its records in (``MemoryStore``, ``RedisStore``, ``PostgresStore``)."""

    __slots__ = ("_native",)

    def __init__(self, native: Any) -> None:
        self._native = native

    def __repr__(self) -> str:
        return repr(self._native)


class MemoryStore(Store):
    """Records in this process only: tests, and one worker that restarts with an empty table."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__(_native.memory_store())


class RedisStore(Store):
    """Redis, one node or a Cluster, with the Rust crate's key layout and scripts.

    ``prefix`` is the prefix of every Redis key (default ``idemkit``, the Rust crate's): a
    Python worker and a Rust service with the same prefix share records.
    """

    __slots__ = ()

    @classmethod
    async def connect(cls, url: str = "redis://127.0.0.1:6379", *, prefix: str | None = None) -> RedisStore:
        return cls(await _native.redis_store(url, prefix))

    @classmethod
    async def connect_cluster(cls, urls: Sequence[str], *, prefix: str | None = None) -> RedisStore:
        return cls(await _native.redis_cluster_store(list(urls), prefix))


class PostgresStore(Store):
    """PostgreSQL: one table (default ``idemkit_records``), migrated on connect."""

    __slots__ = ()

    @classmethod
    async def connect(cls, url: str, *, table: str | None = None) -> PostgresStore:
        return cls(await _native.postgres_store(url, table))


class Coordinator:
    """Runs actions at most once per ``(operation, key)``: one per process and store.

    ``lease`` (seconds) is how long a reservation outlives a crashed owner (it is renewed
    while the action runs); ``wait_timeout`` bounds how long ``in_flight="wait"`` waits in
    all; ``fail_open=True`` runs the action unprotected when the store is *unreachable*
    (never for a corrupt record); the default refuses with ``StoreUnavailable``.
    """

    __slots__ = ("_native", "store")

    def __init__(
        self,
        store: Store,
        *,
        lease: float | None = None,
        wait_timeout: float | None = None,
        fail_open: bool = False,
        holder_name: str | None = None,
    ) -> None:
        self.store = store
        self._native = _native.Coordinator(
            store._native, lease=lease, wait_timeout=wait_timeout, fail_open=fail_open, holder_name=holder_name
        )

    def call(
        self,
        operation: str,
        key: str,
        *,
        ttl: float = DEFAULT_TTL,
        in_flight: InFlightMode = "wait",
        fingerprint: str | bytes | None = None,
        scope: str | None = None,
        codec: Codec[Any] = JSON,
    ) -> Call[Any]:
        """A call of ``operation`` under ``key``; ``await call.run(action)`` runs it.

        ``ttl`` is how long the result is replayed, in seconds (exact, not rounded): longer
        than the latest redelivery. ``fingerprint`` is what the request is: a later call under
        the key with another fingerprint gets ``KeyReused``. ``scope`` is a tenant.
        """
        return Call(self, operation, key, ttl, in_flight, fingerprint, scope, codec)

    def __repr__(self) -> str:
        return f"Coordinator({self.store!r})"


class Call(Generic[T]):
    """One call: ``await coordinator.call(op, key).run(action, *args)``."""

    __slots__ = ("_coordinator", "operation", "key", "ttl", "in_flight", "fingerprint", "scope", "codec")

    def __init__(
        self,
        coordinator: Coordinator,
        operation: str,
        key: str,
        ttl: float,
        in_flight: str,
        fingerprint: str | bytes | None,
        scope: str | None,
        codec: Codec[T],
    ) -> None:
        self._coordinator = coordinator
        self.operation = operation
        self.key = key
        self.ttl = ttl
        self.in_flight = in_flight
        self.fingerprint = fingerprint.encode() if isinstance(fingerprint, str) else fingerprint
        self.scope = scope
        self.codec = codec

    async def run(self, action: Callable[..., Awaitable[T]], /, *args: Any, **kwargs: Any) -> T:
        """Runs ``action(attempt, *args, **kwargs)`` at most once for the key, or replays its value.

        An exception from the action releases the key (a retry runs it again) and is raised
        as it is. A cancelled caller leaves the key reserved until its lease ends, as a crash
        does: the effect may be half done. Raises ``InProgress``, ``KeyReused``,
        ``StoreUnavailable`` ... (see ``idemkit.IdemkitError``), each meaning nothing ran.
        """
        bridge = _bridge()
        id, waiting = bridge.future()
        try:
            pending = self._coordinator._native.begin(
                bridge.native, id, self.operation, self.key, self.ttl, self.in_flight, self.fingerprint, self.scope
            )
        except BaseException:
            bridge.forget(id)
            raise
        try:
            begun = await waiting
        except asyncio.CancelledError:
            pending.abort()
            raise
        except IdemkitError as e:
            e.operation, e.key = self.operation, self.key
            raise
        if type(begun) is bytes:
            try:
                return self.codec.decode(begun)
            except Exception as e:
                error = DecodeError(f"the stored result of {self.operation} {self.key!r} is not {self.codec!r}: {e}")
                error.operation, error.key = self.operation, self.key
                raise error from e
        pending.hand_over(begun)
        try:
            value = await action(begun.attempt, *args, **kwargs)
        except asyncio.CancelledError:
            begun.cancel()
            raise
        except BaseException:
            # Released before the exception goes on, so an immediate retry runs again.
            id, waiting = bridge.future()
            begun.fail(id)
            await _settled(waiting)
            raise
        id, waiting = bridge.future()
        try:
            encoded = self.codec.encode(value)
        except Exception as e:
            begun.unencodable(id, f"{self.codec!r} could not encode the result: {e}")
            await _settled(waiting)
            return value
        begun.complete(id, encoded)
        try:
            await _settled(waiting)
        except IdemkitError as e:
            e.operation, e.key = self.operation, self.key
            raise
        return value


async def _settled(waiting: asyncio.Future[Any]) -> Any:
    """Waits for a completion or a release that goes on without us if we are cancelled (the
    result of an action that returned is stored whatever happens to its caller)."""
    return await asyncio.shield(waiting)


class _Bridge:
    """One per event loop: the futures of this loop's calls, settled when the runtime replies.

    The runtime's threads never take the GIL: they queue their replies and wake the loop
    through a socket it watches (one wake-up for however many replies are queued).
    """

    __slots__ = ("native", "pending", "next_id", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.native = _native.Bridge()
        self.pending: dict[int, asyncio.Future[Any]] = {}
        self.next_id = 0
        self.loop = loop
        loop.add_reader(self.native.fileno(), self._drain)

    def future(self) -> tuple[int, asyncio.Future[Any]]:
        self.next_id += 1
        waiting = self.loop.create_future()
        self.pending[self.next_id] = waiting
        return self.next_id, waiting

    def forget(self, id: int) -> None:
        self.pending.pop(id, None)

    def _drain(self) -> None:
        pending = self.pending
        for id, ok, value in self.native.drain():
            waiting = pending.pop(id, None)
            if waiting is None or waiting.done():
                continue  # its caller was cancelled; a Begun dropped here aborts its call
            if ok:
                waiting.set_result(value)
            else:
                waiting.set_exception(value)


_bridges: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Bridge] = weakref.WeakKeyDictionary()


def _bridge() -> _Bridge:
    loop = asyncio.get_running_loop()
    bridge = _bridges.get(loop)
    if bridge is None:
        bridge = _bridges[loop] = _Bridge(loop)
    return bridge
