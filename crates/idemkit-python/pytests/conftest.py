"""Shared fixtures: the real Redis and PostgreSQL the suite runs against.

A test that needs a service fails when ``CI`` is set and the service is down (and is skipped
otherwise). ``async def`` tests run on a fresh event loop each.
"""

import asyncio
import inspect
import os
import uuid

import pytest

import idemkit

REDIS_URL = os.environ.get("IDEMKIT_REDIS_URL", "redis://127.0.0.1:6379")
POSTGRES_URL = os.environ.get("IDEMKIT_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test")


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    if inspect.iscoroutinefunction(pyfuncitem.obj):
        names = pyfuncitem._fixtureinfo.argnames
        kwargs = {name: pyfuncitem.funcargs[name] for name in names}
        asyncio.run(pyfuncitem.obj(**kwargs))
        return True
    return None


def unique(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:12]}"


def _require(service: str, error: Exception) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{service} is required when CI is set: {error}")
    pytest.skip(f"{service} is not running: {error}")


async def redis_store(prefix: str | None = None) -> idemkit.RedisStore:
    try:
        return await idemkit.RedisStore.connect(REDIS_URL, prefix=prefix or unique("pytest"))
    except idemkit.StoreUnavailable as e:
        _require(f"redis at {REDIS_URL}", e)
        raise


async def postgres_store(table: str | None = None) -> idemkit.PostgresStore:
    try:
        return await idemkit.PostgresStore.connect(POSTGRES_URL, table=table)
    except idemkit.StoreError as e:
        _require(f"postgres at {POSTGRES_URL}", e)
        raise


@pytest.fixture(params=["memory", "redis", "postgres"])
def store_kind(request):
    return request.param


async def make_store(kind: str):
    if kind == "memory":
        return idemkit.MemoryStore()
    if kind == "redis":
        return await redis_store()
    return await postgres_store()


class Mailer:
    """An external effect that counts itself: the thing a duplicate would repeat."""

    def __init__(self, delay: float = 0.0) -> None:
        self.sent: list[int] = []
        self.delay = delay

    async def send_invoice(self, _attempt, order_id: int) -> str:
        self.sent.append(order_id)
        if self.delay:
            await asyncio.sleep(self.delay)
        return f"em_{len(self.sent)}"
