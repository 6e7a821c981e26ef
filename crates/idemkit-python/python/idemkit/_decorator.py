"""``idemkit.idempotent``: a function (sync or async) made a call of the coordinator."""

from __future__ import annotations

import functools
import inspect
import os
import threading
from collections.abc import Callable
from typing import Any, Concatenate, ParamSpec, TypeVar, cast

from ._coordinator import DEFAULT_TTL, Attempt, Call, Coordinator, InFlightMode, OnCancel
from .codecs import JSON, Codec

P = ParamSpec("P")
T = TypeVar("T")


def idempotent(
    operation: str,
    *,
    key: Callable[..., str],
    coordinator: Coordinator | Callable[[], Coordinator],
    ttl: float = DEFAULT_TTL,
    in_flight: InFlightMode = "wait",
    fingerprint: Callable[..., str | bytes] | None = None,
    scope: Callable[..., str] | None = None,
    codec: Codec[Any] = JSON,
    on_cancel: OnCancel | None = None,
) -> Callable[[Callable[Concatenate[Attempt, P], T]], Callable[P, T]]:
    """Makes ``func(attempt, *args, **kwargs)`` a call under ``key(*args, **kwargs)``; its
    callers call it without the attempt: ``func(*args, **kwargs)``.

    A plain function becomes a blocking call (``Call.run_sync``: Celery, RQ and Dramatiq
    tasks, threads); an ``async def`` an awaitable one (``Call.run``). ``key``,
    ``fingerprint`` and ``scope`` get the caller's arguments. ``coordinator`` is the
    coordinator, or a function that returns it at each call: a worker that forks (Celery's
    prefork pool) makes its coordinator after the fork, so the decorator cannot hold one made
    at import. The wrapper's signature is the function's without the attempt, which is what
    task queues check a call's arguments against.
    """

    def coordinator_now() -> Coordinator:
        return coordinator if isinstance(coordinator, Coordinator) else coordinator()

    def call_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Call[Any]:
        return coordinator_now().call(
            operation,
            key(*args, **kwargs),
            ttl=ttl,
            in_flight=in_flight,
            fingerprint=fingerprint(*args, **kwargs) if fingerprint is not None else None,
            scope=scope(*args, **kwargs) if scope is not None else None,
            codec=codec,
            on_cancel=on_cancel,
        )

    def decorate(func: Callable[Concatenate[Attempt, P], T]) -> Callable[P, T]:
        wrapper: Callable[..., Any]
        if inspect.iscoroutinefunction(func):

            async def wrapper(*args: Any, **kwargs: Any) -> Any:
                return await call_of(args, kwargs).run(func, *args, **kwargs)

        else:

            def wrapper(*args: Any, **kwargs: Any) -> Any:
                return call_of(args, kwargs).run_sync(func, *args, **kwargs)

        functools.update_wrapper(wrapper, func)
        signature = inspect.signature(func)
        parameters = list(signature.parameters.values())
        if not parameters or parameters[0].kind not in (
            inspect.Parameter.POSITIONAL_ONLY,
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
        ):
            raise TypeError(f"{func.__qualname__} must take the call's Attempt as its first parameter")
        setattr(wrapper, "__signature__", signature.replace(parameters=parameters[1:]))  # noqa: B010
        return cast(Callable[P, T], wrapper)

    return decorate


def per_process(factory: Callable[[], T]) -> Callable[[], T]:
    """A function that returns this process's ``factory()``, made on its first call in the
    process: after a ``fork()`` the child makes its own.

    For workers that fork (Celery's prefork pool, RQ's work horse, Dramatiq's processes): a
    store connected before a fork stays the parent's, so each worker process connects its own::

        coordinator = idemkit.per_process(lambda: idemkit.Coordinator(idemkit.RedisStore.connect_sync(URL)))

        @idemkit.idempotent("mail.invoice", key=..., coordinator=coordinator)
        def send_invoice(attempt, order_id): ...
    """
    made: list[tuple[int, T]] = []
    lock = threading.Lock()

    def current() -> T:
        pid = os.getpid()
        if made and made[0][0] == pid:
            return made[0][1]
        with lock:
            if not made or made[0][0] != pid:
                made[:] = [(pid, factory())]
            return made[0][1]

    def after_fork() -> None:
        nonlocal lock
        lock = threading.Lock()  # a thread of the parent may have held it at the fork

    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=after_fork)
    return current


__all__ = ["Attempt", "idempotent", "per_process"]
