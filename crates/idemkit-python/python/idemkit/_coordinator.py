"""The coordinator: reserve the key, run the action once, store its result, replay it."""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import select
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Generic, Literal, TypeVar, cast

from . import _native
from ._errors import DecodeError, IdemkitError
from .codecs import JSON, Codec

T = TypeVar("T")

InFlightMode = Literal["wait", "reject", "raise", "run"]
OnCancel = Literal["keep", "release"]

logger = logging.getLogger("idemkit")

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

    TLS: a ``rediss://`` URL, the server's certificate checked against the system's roots,
    or only against ``ssl_ca_certs`` (a PEM file) when given; ``ssl_certfile`` and
    ``ssl_keyfile`` present a client certificate to a server that asks for one. TLS options
    with a plain ``redis://`` URL are refused, never sent in plain text. Auth: an ACL user's
    ``username`` and ``password`` (or ``redis://user:password@host``), or ``password`` alone
    for the default user. A refused certificate or login raises ``StoreError`` (not
    ``StoreUnavailable``): nothing to wait out.
    """

    __slots__ = ()

    @classmethod
    async def connect(
        cls,
        url: str = "redis://127.0.0.1:6379",
        *,
        prefix: str | None = None,
        ssl_ca_certs: str | None = None,
        ssl_certfile: str | None = None,
        ssl_keyfile: str | None = None,
        username: str | None = None,
        password: str | None = None,
    ) -> RedisStore:
        """Connects to one Redis (or Valkey) server; raises ``StoreUnavailable`` if it cannot."""
        auth = _redis_auth(ssl_ca_certs, ssl_certfile, ssl_keyfile, username, password)
        return cls(await _reply(_native.redis_store, url, prefix, auth))

    @classmethod
    async def connect_cluster(
        cls,
        urls: Sequence[str],
        *,
        prefix: str | None = None,
        ssl_ca_certs: str | None = None,
        ssl_certfile: str | None = None,
        ssl_keyfile: str | None = None,
        username: str | None = None,
        password: str | None = None,
    ) -> RedisStore:
        """Connects to a Redis Cluster through any of ``urls`` (``rediss://`` for TLS)."""
        auth = _redis_auth(ssl_ca_certs, ssl_certfile, ssl_keyfile, username, password)
        return cls(await _reply(_native.redis_cluster_store, list(urls), prefix, auth))

    @classmethod
    def connect_sync(
        cls,
        url: str = "redis://127.0.0.1:6379",
        *,
        prefix: str | None = None,
        ssl_ca_certs: str | None = None,
        ssl_certfile: str | None = None,
        ssl_keyfile: str | None = None,
        username: str | None = None,
        password: str | None = None,
    ) -> RedisStore:
        """``connect`` for code outside an event loop: blocks this thread (not the GIL)."""
        auth = _redis_auth(ssl_ca_certs, ssl_certfile, ssl_keyfile, username, password)
        return cls(_reply_sync(_native.redis_store, url, prefix, auth))

    @classmethod
    def connect_cluster_sync(
        cls,
        urls: Sequence[str],
        *,
        prefix: str | None = None,
        ssl_ca_certs: str | None = None,
        ssl_certfile: str | None = None,
        ssl_keyfile: str | None = None,
        username: str | None = None,
        password: str | None = None,
    ) -> RedisStore:
        """``connect_cluster`` for code outside an event loop."""
        auth = _redis_auth(ssl_ca_certs, ssl_certfile, ssl_keyfile, username, password)
        return cls(_reply_sync(_native.redis_cluster_store, list(urls), prefix, auth))


def _redis_auth(
    ssl_ca_certs: str | None,
    ssl_certfile: str | None,
    ssl_keyfile: str | None,
    username: str | None,
    password: str | None,
) -> _native._RedisAuth | None:
    if ssl_ca_certs is None and ssl_certfile is None and ssl_keyfile is None and username is None and password is None:
        return None
    return {
        "ssl_ca_certs": None if ssl_ca_certs is None else os.fspath(ssl_ca_certs),
        "ssl_certfile": None if ssl_certfile is None else os.fspath(ssl_certfile),
        "ssl_keyfile": None if ssl_keyfile is None else os.fspath(ssl_keyfile),
        "username": username,
        "password": password,
    }


class PostgresStore(Store):
    """PostgreSQL: one table (default ``idemkit_records``), migrated on connect.

    TLS follows the URL's ``sslmode``, as libpq's: ``prefer`` (the default), ``require``,
    ``verify-ca`` and ``verify-full``, with ``sslrootcert`` (and ``sslcert``/``sslkey`` for a
    client certificate): ``postgres://app:pw@db.example.com/app?sslmode=verify-full&sslrootcert=/etc/ca.pem``.
    """

    __slots__ = ()

    @classmethod
    async def connect(cls, url: str, *, table: str | None = None) -> PostgresStore:
        """Connects and migrates the table; raises ``StoreUnavailable`` if it cannot connect."""
        return cls(await _reply(_native.postgres_store, url, table))

    @classmethod
    def connect_sync(cls, url: str, *, table: str | None = None) -> PostgresStore:
        """``connect`` for code outside an event loop: blocks this thread (not the GIL)."""
        return cls(_reply_sync(_native.postgres_store, url, table))


class ExactFingerprint(bytes):
    """A fingerprint's 16 bytes, used as they are (not hashed again): the ASGI middleware's,
    computed as the Rust HTTP layer computes it, so both read each other's records."""

    __slots__ = ()


class Coordinator:
    """Runs actions at most once per ``(operation, key)``: one per process and store.

    ``lease`` (seconds) is how long a reservation outlives a crashed owner (it is renewed
    while the action runs); ``wait_timeout`` bounds how long ``in_flight="wait"`` waits in
    all; ``fail_open=True`` runs the action unprotected when the store is *unreachable*
    (never for a corrupt record); the default refuses with ``StoreUnavailable``.

    ``on_cancel`` is what a call whose action does not finish leaves behind (its task
    cancelled, ``KeyboardInterrupt`` or ``SystemExit`` raised in it, its coroutine closed,
    its event loop closed): ``"keep"`` (the default) keeps the reservation until its lease
    ends, as a crash does, because the effect may be half done; ``"release"`` releases the
    key at once, for actions that are safe to run again. ``abandoned_waits`` counts the
    calls that found a reservation this process abandoned so (each also logs a warning).
    """

    __slots__ = ("_native", "store", "on_cancel", "abandoned_waits", "_abandoned")

    def __init__(
        self,
        store: Store,
        *,
        lease: float | None = None,
        wait_timeout: float | None = None,
        fail_open: bool = False,
        holder_name: str | None = None,
        on_cancel: OnCancel = "keep",
        max_result_bytes: int | None = None,
    ) -> None:
        self.store = store
        self._native = _native.Coordinator(
            store._native,
            lease=lease,
            wait_timeout=wait_timeout,
            fail_open=fail_open,
            holder_name=holder_name,
            on_cancel=on_cancel,
            max_result_bytes=max_result_bytes,
        )
        self.on_cancel = on_cancel
        self.abandoned_waits = 0
        # (operation, key, scope) -> when (time.monotonic) its abandoned reservation's lease ends.
        self._abandoned: dict[tuple[str, str, str | None], float] = {}

    def _abandon(self, operation: str, key: str, scope: str | None, lease_left: float | None) -> None:
        if lease_left is None:
            return
        now = time.monotonic()
        if len(self._abandoned) > 1024:
            self._abandoned = {k: end for k, end in self._abandoned.items() if end > now}
        self._abandoned[(operation, key, scope)] = now + lease_left

    def _check_abandoned(self, operation: str, key: str, scope: str | None) -> None:
        end = self._abandoned.get((operation, key, scope))
        if end is None:
            return
        left = end - time.monotonic()
        if left <= 0:
            del self._abandoned[(operation, key, scope)]
            return
        self.abandoned_waits += 1
        logger.warning(
            "%s %r: its reservation was left by a call of this process that did not finish "
            "(cancelled); it is free when its lease ends, in %.1f s at most (on_cancel=%r)",
            operation,
            key,
            left,
            self.on_cancel,
            extra={"operation": operation, "idempotency_key": key, "lease_left": left},
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
        on_cancel: OnCancel | None = None,
    ) -> Call[Any]:
        """A call of ``operation`` under ``key``; ``await call.run(action)`` runs it.

        ``ttl`` is how long the result is replayed, in seconds (exact, not rounded): longer
        than the latest redelivery. ``fingerprint`` is what the request is: a later call under
        the key with another fingerprint gets ``KeyReused``. ``scope`` is a tenant.
        ``on_cancel`` overrides the coordinator's for this call.
        """
        return Call(self, operation, key, ttl, in_flight, fingerprint, scope, codec, on_cancel)

    def __repr__(self) -> str:
        return f"Coordinator({self.store!r})"


class Call(Generic[T]):
    """One call: ``await coordinator.call(op, key).run(action, *args)``."""

    __slots__ = (
        "_coordinator",
        "operation",
        "key",
        "ttl",
        "in_flight",
        "fingerprint",
        "scope",
        "codec",
        "on_cancel",
        "_stored",
    )

    def __init__(
        self,
        coordinator: Coordinator,
        operation: str,
        key: str,
        ttl: float,
        in_flight: InFlightMode,
        fingerprint: str | bytes | None,
        scope: str | None,
        codec: Codec[T],
        on_cancel: OnCancel | None = None,
    ) -> None:
        self._coordinator = coordinator
        self.operation = operation
        self.key = key
        self.ttl = ttl
        self.in_flight = in_flight
        self.fingerprint = fingerprint.encode() if isinstance(fingerprint, str) else fingerprint
        self.scope = scope
        self.codec = codec
        self.on_cancel = on_cancel
        self._stored: bool | None = None

    def _begin(self, bridge: _Bridge | _SyncBridge, id: int) -> _native.Pending:
        """Starts the call on the runtime; its first reply goes to ``bridge`` under ``id``."""
        coordinator = self._coordinator
        if coordinator._abandoned:
            coordinator._check_abandoned(self.operation, self.key, self.scope)
        try:
            return coordinator._native.begin(
                bridge.native,
                id,
                self.operation,
                self.key,
                self.ttl,
                self.in_flight,
                self.fingerprint,
                self.scope,
                self.on_cancel,
                type(self.fingerprint) is ExactFingerprint,
            )
        except BaseException:
            bridge.forget(id)
            raise

    def _replayed(self, stored: bytes) -> T:
        try:
            return self.codec.decode(stored)
        except Exception as e:
            error = DecodeError(f"the stored result of {self.operation} {self.key!r} is not {self.codec!r}: {e}")
            error.operation, error.key = self.operation, self.key
            raise error from e

    async def run(self, action: Callable[..., Awaitable[T] | T], /, *args: Any, **kwargs: Any) -> T:
        """Runs ``action(attempt, *args, **kwargs)`` at most once for the key, or replays its value.

        ``action`` is an async function; a plain function works too (its return value is the
        result), but it runs in the event loop's thread and blocks it: for blocking work use
        ``run_sync`` from a thread.

        An ``Exception`` from the action releases the key (a retry runs it again) and is
        raised as it is. An action that does not finish (its task cancelled,
        ``KeyboardInterrupt`` or ``SystemExit`` raised in it, its coroutine closed, its event
        loop closed) leaves what ``on_cancel`` says: by default the reservation until its
        lease ends, as a crash does. Raises ``InProgress``, ``KeyReused``,
        ``StoreUnavailable`` ... (see ``idemkit.IdemkitError``), each meaning nothing ran.
        """
        coordinator = self._coordinator
        bridge = _bridge()
        id, waiting = bridge.future()
        pending = self._begin(bridge, id)
        try:
            begun = await waiting
        except IdemkitError as e:
            e.operation, e.key = self.operation, self.key
            raise
        except BaseException:
            # Cancelled, or the coroutine closed: the call stops where it is (a reservation
            # it has already taken is released: its action never started).
            bridge.forget(id)
            pending.abort()
            _release_unstarted(waiting)
            raise
        if type(begun) is bytes:
            return self._replayed(begun)
        pending.hand_over(begun)
        try:
            produced = action(begun.attempt, *args, **kwargs)
            # A plain function given to `await call.run(fn)` has run already: its return
            # value is the result (kept and stored), never a TypeError after the effect that
            # would release the key and send again on every delivery.
            value = cast(T, await produced) if inspect.isawaitable(produced) else produced
        except Exception:
            # Released before the exception goes on, so an immediate retry runs again.
            id, waiting = bridge.future()
            begun.fail(id)
            await _settled(waiting)
            raise
        except GeneratorExit:
            # A closed coroutine may not await: the call is dropped, and on_cancel applies.
            begun.cancel()
            raise
        except BaseException:
            # Cancelled, KeyboardInterrupt, SystemExit: the effect may be half done.
            if (self.on_cancel or coordinator.on_cancel) == "release":
                id, waiting = bridge.future()
                begun.fail(id)
                await _settled(waiting)
            else:
                coordinator._abandon(self.operation, self.key, self.scope, begun.attempt.lease_left())
                begun.cancel()
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
            # Whether the result was stored (False: the store failed after the action, which
            # the caller's value does not show; the ASGI middleware reads it).
            self._stored = bool(await _settled(waiting))
        except IdemkitError as e:
            e.operation, e.key = self.operation, self.key
            raise
        return value


    def run_sync(self, action: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """``run`` for code outside an event loop (a Celery, RQ or Dramatiq task, a thread):
        runs ``action(attempt, *args, **kwargs)``, a plain function, in this thread, at most
        once for the key, or returns the stored value.

        The same semantics as ``run`` (in-flight modes, fingerprints, scope, codec, typed
        errors; the lease renewed while the function runs). While the store is awaited this
        thread waits with the GIL released, so other threads run. ``KeyboardInterrupt`` or
        ``SystemExit`` raised in the function leave what ``on_cancel`` says, as a cancelled
        ``run`` does; one raised while the call waits takes no key. Called from a running
        event loop it raises ``RuntimeError`` (it would block the loop: ``await run``).
        """
        if asyncio._get_running_loop() is not None:
            raise RuntimeError("run_sync blocks its thread: in a running event loop, use `await call.run(...)`")
        coordinator = self._coordinator
        bridge = _sync_bridge()
        pending = self._begin(bridge, id := bridge.new_id())
        try:
            begun = bridge.wait(id)
        except IdemkitError as e:
            e.operation, e.key = self.operation, self.key
            raise
        except BaseException:
            # Interrupted before the action: the call stops where it is. One that reached its
            # action already is sending its Begun: taken here and released (nothing ran).
            if not pending.abort():
                bridge.release(id)
            bridge.forget(id)
            raise
        if type(begun) is bytes:
            return self._replayed(begun)
        pending.hand_over(begun)
        try:
            value = action(begun.attempt, *args, **kwargs)
        except Exception:
            id = bridge.new_id()
            begun.fail(id)
            bridge.wait(id)
            raise
        except BaseException:
            # KeyboardInterrupt, SystemExit, a gevent kill: the effect may be half done.
            if (self.on_cancel or coordinator.on_cancel) == "release":
                id = bridge.new_id()
                begun.fail(id)
                bridge.wait(id)
            else:
                coordinator._abandon(self.operation, self.key, self.scope, begun.attempt.lease_left())
                begun.cancel()
            raise
        id = bridge.new_id()
        try:
            encoded = self.codec.encode(value)
        except Exception as e:
            begun.unencodable(id, f"{self.codec!r} could not encode the result: {e}")
            bridge.wait(id)
            return value
        begun.complete(id, encoded)
        try:
            bridge.wait(id)
        except IdemkitError as e:
            e.operation, e.key = self.operation, self.key
            raise
        return value


def _release_unstarted(waiting: asyncio.Future[Any]) -> None:
    """A call whose caller stopped waiting just as its ``Begun`` arrived: its action never
    started, so the key is released."""
    if waiting.done() and not waiting.cancelled() and waiting.exception() is None:
        begun = waiting.result()
        if type(begun) is _native.Begun:
            begun.fail(0)


async def _reply(start: Callable[..., None], *args: Any) -> Any:
    """Starts ``start(bridge, id, *args)`` on the runtime and waits for its reply."""
    bridge = _bridge()
    id, waiting = bridge.future()
    try:
        start(bridge.native, id, *args)
    except BaseException:
        bridge.forget(id)
        raise
    try:
        return await waiting
    except BaseException:
        bridge.forget(id)
        raise


async def _settled(waiting: asyncio.Future[Any]) -> Any:
    """Waits for a completion or a release. Either goes on in the runtime without us if we
    are cancelled (the result of an action that returned is stored whatever happens to its
    caller): the future is only how the reply reaches us, so nothing needs shielding."""
    return await waiting


class _Bridge:
    """One per event loop: the futures of this loop's calls, settled when the runtime replies.

    The runtime's threads do not take the GIL to reply: they queue their replies and wake the loop
    through a socket it watches (one wake-up for however many replies are queued).
    """

    __slots__ = ("native", "pending", "next_id", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.native = _native.Bridge(weakref.ref(loop))
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
                # Its caller stopped waiting. A call that reached its action meanwhile is
                # released: its action never started.
                if ok and type(value) is _native.Begun:
                    value.fail(0)
                continue
            if ok:
                waiting.set_result(value)
            else:
                waiting.set_exception(value)


class _SyncBridge:
    """One per thread, for the blocking calls: the thread waits for its own replies on the
    bridge's socket with ``select`` (the GIL released, signals handled), then drains them.

    Calls of one thread are sequential, but may nest (an action that makes a call of its
    own), so a reply for another call of the thread is kept until that call asks for it.
    """

    __slots__ = ("native", "next_id", "waiting", "arrived", "__weakref__")

    def __init__(self) -> None:
        self.native = _native.Bridge(None)
        self.next_id = 0
        self.waiting: set[int] = set()
        self.arrived: dict[int, tuple[bool, Any]] = {}

    def new_id(self) -> int:
        self.next_id += 1
        self.waiting.add(self.next_id)
        return self.next_id

    def wait(self, id: int) -> Any:
        fd = self.native.fileno()
        while id not in self.arrived:
            select.select([fd], [], [])
            for rid, ok, value in self.native.drain():
                if rid in self.waiting:
                    self.arrived[rid] = (ok, value)
                elif ok and type(value) is _native.Begun:
                    value.fail(0)  # its caller was interrupted: nothing ran
        self.waiting.discard(id)
        ok, value = self.arrived.pop(id)
        if ok:
            return value
        raise value

    def release(self, id: int) -> None:
        """Takes the ``Begun`` on its way to an interrupted caller and releases it."""
        try:
            value = self.wait(id)
        except Exception:
            return
        if type(value) is _native.Begun:
            value.fail(0)

    def forget(self, id: int) -> None:
        self.waiting.discard(id)
        ok, value = self.arrived.pop(id, (False, None))
        if ok and type(value) is _native.Begun:
            value.fail(0)


_threads = threading.local()


def _sync_bridge() -> _SyncBridge:
    bridge: _SyncBridge | None = getattr(_threads, "bridge", None)
    if bridge is None:
        bridge = _threads.bridge = _SyncBridge()
    return bridge


def _reply_sync(start: Callable[..., None], *args: Any) -> Any:
    """``_reply`` for a blocking caller."""
    if asyncio._get_running_loop() is not None:
        raise RuntimeError("a *_sync method blocks its thread: in a running event loop, await the async one")
    bridge = _sync_bridge()
    id = bridge.new_id()
    try:
        start(bridge.native, id, *args)
        return bridge.wait(id)
    except BaseException:
        bridge.forget(id)
        raise


_bridges: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Bridge] = weakref.WeakKeyDictionary()


def _bridge() -> _Bridge:
    loop = asyncio.get_running_loop()
    bridge = _bridges.get(loop)
    if bridge is None:
        bridge = _bridges[loop] = _Bridge(loop)
    return bridge


def _after_fork_in_child() -> None:
    # The parent's loops and threads (and their bridges: a socket shared with the parent) are
    # not this process's; the native runtime is started again on first use (it is the
    # process's, by pid).
    global _threads
    _bridges.clear()
    _threads = threading.local()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
