"""The drop-in, checked against idempotency-kit 0.5.0 itself.

Every test runs twice, once on ``idempotency_kit`` and once on ``idemkit``, through the same
code: idempotency-kit's public API as its README and docstrings describe it, on the machine's
Redis, with only the package name changed. Where idemkit differs on purpose, the test says
what each library does and names the entry of docs/python.md ("Differences that remain"); a
difference that is not listed there fails here.
"""

import asyncio
import dataclasses
import datetime
import decimal
import enum
import importlib
import logging
import uuid
from typing import Any

import pydantic
import pytest
import redis.asyncio as aioredis
from conftest import REDIS_URL, _require, unique

import idemkit

LIBS = ["idempotency_kit", "idemkit"]


@pytest.fixture(params=LIBS)
def lib(request):
    return importlib.import_module(request.param)


def is_idemkit(lib) -> bool:
    return lib.__name__ == "idemkit"


async def redis_client() -> Any:
    client = aioredis.from_url(REDIS_URL)
    try:
        await client.ping()
    except Exception as e:  # noqa: BLE001
        _require(f"redis at {REDIS_URL}", e)
    return client


async def coordinator(lib, client=None, **options):
    client = client or await redis_client()
    repository = importlib.import_module(f"{lib.__name__}.infra.storage.redis.aio").RedisAsyncIdempotencyRepository
    repo = repository(client, key_prefix=unique("dropin") + ":")
    return lib.AsyncIdempotencyCoordinator(repo, lib.IdempotencyDomainService(), **options)


class Counter:
    def __init__(self, delay: float = 0.0, value: Any = None) -> None:
        self.calls = 0
        self.delay = delay
        self.value = value

    async def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        if self.delay:
            await asyncio.sleep(self.delay)
        return {"n": self.calls} if self.value is None else self.value


# -- names and module paths ---------------------------------------------------------------


def test_every_name_of_idempotency_kits_all_is_in_idemkit():
    import idempotency_kit

    missing = [name for name in idempotency_kit.__all__ if not hasattr(idemkit, name)]
    assert missing == []
    assert set(idempotency_kit.__all__) <= set(idemkit.__all__)


MODULE_NAMES = [
    ("core.models.entities", ["IdempotencyRecord", "IdempotencyIdentifiers"]),
    ("core.models", ["IdempotencyRecord"]),
    ("core.protocols.adapter", ["ResultAdapter"]),
    ("core.protocols.aio.repository", ["AsyncIdempotencyRepository"]),
    ("core.protocols.aio", ["AsyncIdempotencyRepository"]),
    ("core.protocols.metrics", ["IdempotencyMetricsProtocol", "NoOpIdempotencyMetrics"]),
    ("core.services.aio.coordinator", ["AsyncIdempotencyCoordinator"]),
    ("core.services.domain", ["IdempotencyDomainService"]),
    ("core.services", ["IdempotencyDomainService"]),
    ("core.decorators.aio.idempotent", ["async_idempotent"]),
    ("core.adapters", ["JsonResultAdapter", "PydanticResultAdapter", "VoidResultAdapter"]),
    ("core.adapters.basic", ["JsonResultAdapter", "PydanticResultAdapter", "VoidResultAdapter"]),
    ("core.fingerprint", ["fingerprint_of"]),
    (
        "core.exceptions",
        [
            "IdempotencyError",
            "IdempotencyInProgressError",
            "IdempotencyInvalidTTLError",
            "IdempotencyKeyCollisionError",
            "IdempotencyKeyReuseError",
            "IdempotencyRecordExpiredError",
            "IdempotencyStorageError",
            "IdempotencyValidationError",
        ],
    ),
    (
        "core.constants",
        [
            "DEFAULT_TTL_MINUTES",
            "MIN_TTL_SECONDS",
            "MAX_TTL_SECONDS",
            "DEFAULT_IN_FLIGHT_MODE",
            "DEFAULT_IN_FLIGHT_LEASE_SECONDS",
            "DEFAULT_ON_STORAGE_ERROR",
        ],
    ),
    ("infra.storage.redis.aio.repository", ["RedisAsyncIdempotencyRepository"]),
    ("infra.storage.redis.aio", ["RedisAsyncIdempotencyRepository"]),
    ("infra.metrics.prometheus", ["PrometheusIdempotencyMetrics", "get_idempotency_metrics"]),
    ("settings", ["BaseIdempotencySettings"]),
    (
        "dishka",
        [
            "IdempotencyProvider",
            "IdempotencySettingsProtocol",
            "AsyncIdempotencyCoordinatorProvider",
            "AsyncRedisIdempotencyProvider",
        ],
    ),
    ("dishka.aio", ["AsyncIdempotencyCoordinatorProvider", "AsyncRedisIdempotencyProvider"]),
]


@pytest.mark.parametrize(("module", "names"), MODULE_NAMES, ids=[m for m, _ in MODULE_NAMES])
def test_module_paths(lib, module, names):
    loaded = importlib.import_module(f"{lib.__name__}.{module}")
    assert [n for n in names if not hasattr(loaded, n)] == []


def test_the_same_classes_under_every_path(lib):
    entities = importlib.import_module(f"{lib.__name__}.core.services.aio.coordinator")
    assert entities.AsyncIdempotencyCoordinator is lib.AsyncIdempotencyCoordinator
    protocols = importlib.import_module(f"{lib.__name__}.core.protocols.adapter")
    assert protocols.ResultAdapter is lib.ResultAdapter


# -- adapters -----------------------------------------------------------------------------


class Order(pydantic.BaseModel):
    id: int
    total: decimal.Decimal


async def test_adapters_are_generic(lib):
    class OrderAdapter(lib.ResultAdapter[Order]):
        def encode(self, value: Order) -> Any:
            return value.model_dump(mode="json")

        def decode(self, data: Any) -> Order:
            return Order.model_validate(data)

    typed = lib.PydanticResultAdapter[Order](Order)
    c, calls = await coordinator(lib), []

    async def make() -> Order:
        calls.append(1)
        return Order(id=9, total=decimal.Decimal("10.50"))

    for adapter in (OrderAdapter(), typed):
        key = unique("order")
        first = await c.coordinate("order.make", key, 3600, adapter, make)
        again = await c.coordinate("order.make", key, 3600, adapter, make)
        assert first == again == Order(id=9, total=decimal.Decimal("10.50"))
        assert isinstance(again, Order)
    assert len(calls) == 2


# -- storage trouble ----------------------------------------------------------------------


async def test_fail_open_covers_a_store_that_is_down_at_first_use(lib):
    down = aioredis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.5)
    action = Counter(value="sent")
    c = await coordinator(lib, client=down)
    assert await c.coordinate("mail.send", "k", 3600, lib.JsonResultAdapter(), action) == "sent"
    assert await c.coordinate("mail.send", "k", 3600, lib.JsonResultAdapter(), action) == "sent"
    assert action.calls == 2  # unprotected, as asked: availability over exactly-once

    closed = await coordinator(lib, client=down, on_storage_error="raise")
    with pytest.raises(lib.IdempotencyStorageError):
        await closed.coordinate("mail.send", "k", 3600, lib.JsonResultAdapter(), action)
    assert action.calls == 2


# -- TTLs ---------------------------------------------------------------------------------


@pytest.mark.parametrize("ttl", [0, 1, 30, 59, 60, 90])
async def test_short_ttls_deduplicate(lib, ttl):
    c, action = await coordinator(lib), Counter()
    key = unique("ttl")
    assert await c.coordinate("op", key, ttl, lib.JsonResultAdapter(), action) == {"n": 1}
    assert await c.coordinate("op", key, ttl, lib.JsonResultAdapter(), action) == {"n": 1}
    assert action.calls == 1


async def test_a_ttl_above_the_maximum_runs_uncached(lib, caplog):
    c, action = await coordinator(lib), Counter()
    key = unique("ttl")
    with caplog.at_level(logging.ERROR):
        assert await c.coordinate("op", key, 31 * 86400, lib.JsonResultAdapter(), action) == {"n": 1}
        assert await c.coordinate("op", key, 31 * 86400, lib.JsonResultAdapter(), action) == {"n": 2}
    assert action.calls == 2
    assert any("will not be cached" in r.getMessage() for r in caplog.records)


async def test_operation_ttls_win_over_the_call(lib):
    c, action = await coordinator(lib, operation_ttls={"op": 31 * 86400}), Counter()
    key = unique("ttl")
    await c.coordinate("op", key, 3600, lib.JsonResultAdapter(), action)
    await c.coordinate("op", key, 3600, lib.JsonResultAdapter(), action)
    assert action.calls == 2  # the operation's TTL is above the maximum: uncached


# -- fingerprints -------------------------------------------------------------------------


async def test_calls_with_and_without_a_fingerprint_share_the_record(lib):
    c, action = await coordinator(lib), Counter()
    fp = lib.fingerprint_of(amount=100)
    for first, second in [(fp, None), (None, fp)]:
        key = unique("fp")
        a = await c.coordinate("charge", key, 3600, lib.JsonResultAdapter(), action, idempotency_fingerprint=first)
        b = await c.coordinate("charge", key, 3600, lib.JsonResultAdapter(), action, idempotency_fingerprint=second)
        assert a == b
    assert action.calls == 2


async def test_a_different_fingerprint_raises_key_reuse_with_both(lib):
    c, action = await coordinator(lib), Counter()
    key = unique("fp")
    a, b = lib.fingerprint_of(amount=100), lib.fingerprint_of(amount=200)
    await c.coordinate("charge", key, 3600, lib.JsonResultAdapter(), action, idempotency_fingerprint=a)
    with pytest.raises(lib.IdempotencyKeyReuseError) as raised:
        await c.coordinate("charge", key, 3600, lib.JsonResultAdapter(), action, idempotency_fingerprint=b)
    e = raised.value
    assert (e.operation, e.key, e.stored_fingerprint, e.fingerprint) == ("charge", key, a, b)
    assert action.calls == 1


class Colour(enum.Enum):
    RED = "red"


@dataclasses.dataclass
class Line:
    sku: str
    qty: int


FINGERPRINTED = {
    "utc": datetime.datetime(2026, 12, 4, 10, 30, tzinfo=datetime.timezone.utc),
    "naive": datetime.datetime(2026, 12, 4, 10, 30, 1, 500),
    "offset": datetime.datetime(2026, 12, 4, 10, 30, tzinfo=datetime.timezone(datetime.timedelta(hours=2))),
    "day": datetime.date(2026, 12, 4),
    "time": datetime.time(10, 30),
    "span": datetime.timedelta(seconds=90.5),
    "amount": decimal.Decimal("10.50"),
    "id": uuid.UUID("12345678-1234-5678-1234-567812345678"),
    "colour": Colour.RED,
    "line": Line("sku-1", 2),
    "order": Order(id=1, total=decimal.Decimal("1.5")),
    "tuple": (1, "a"),
    "bytes": b"abc",
    "nested": {"b": [1, 2.5, None, True], "a": "ü"},
}


@pytest.mark.parametrize("name", list(FINGERPRINTED))
def test_fingerprint_of_agrees_with_idempotency_kit(name):
    import idempotency_kit

    value = {name: FINGERPRINTED[name]}
    assert idemkit.fingerprint_of(**value) == idempotency_kit.fingerprint_of(**value)


# -- in flight ----------------------------------------------------------------------------


async def test_in_flight_run_gives_the_second_caller_the_stored_winner(lib):
    c = await coordinator(lib, in_flight="run")
    key, results = unique("run"), iter(["first", "second"])

    async def action(delay: float) -> str:
        value = next(results)
        await asyncio.sleep(delay)
        return value

    first = asyncio.create_task(c.coordinate("op", key, 3600, lib.JsonResultAdapter(), action, 0.1))
    await asyncio.sleep(0.02)
    second = await c.coordinate("op", key, 3600, lib.JsonResultAdapter(), action, 0.3)
    assert await first == "first"
    assert second == "first"  # the duplicate ran, but its caller gets the stored result


async def test_wait_and_raise(lib):
    for mode in ("wait", "raise"):
        c, action = await coordinator(lib, in_flight=mode), Counter(delay=0.3)
        key = unique(mode)
        first = asyncio.create_task(c.coordinate("op", key, 3600, lib.JsonResultAdapter(), action))
        await asyncio.sleep(0.05)
        if mode == "wait":
            assert await c.coordinate("op", key, 3600, lib.JsonResultAdapter(), action) == {"n": 1}
        else:
            with pytest.raises(lib.IdempotencyInProgressError) as raised:
                await c.coordinate("op", key, 3600, lib.JsonResultAdapter(), action)
            assert (raised.value.operation, raised.value.key) == ("op", key)
        assert await first == {"n": 1}
        assert action.calls == 1


# -- exceptions ---------------------------------------------------------------------------


def test_exceptions_are_built_as_idempotency_kit_builds_them(lib):
    cause = OSError("down")
    assert lib.IdempotencyInProgressError("op", "k").key == "k"
    assert "still in flight" in str(lib.IdempotencyInProgressError("op", "k"))
    reuse = lib.IdempotencyKeyReuseError("op", "k", "aaa", "bbb")
    assert (reuse.operation, reuse.key, reuse.stored_fingerprint, reuse.fingerprint) == ("op", "k", "aaa", "bbb")
    storage = lib.IdempotencyStorageError("it failed", operation="op", original_error=cause)
    assert (str(storage), storage.operation, storage.original_error) == ("it failed", "op", cause)
    assert lib.IdempotencyValidationError("bad", errors=[1]).errors == [1]
    ttl = lib.IdempotencyInvalidTTLError(5.0, 60.0, 120.0)
    assert (ttl.ttl_seconds, ttl.min_ttl, ttl.max_ttl) == (5.0, 60.0, 120.0)
    assert lib.IdempotencyKeyCollisionError("op", "k").key == "k"
    assert lib.IdempotencyRecordExpiredError("op", "k").operation == "op"
    for name in ("IdempotencyInProgressError", "IdempotencyKeyReuseError", "IdempotencyStorageError"):
        assert issubclass(getattr(lib, name), lib.IdempotencyError)


# -- models and settings ------------------------------------------------------------------


def test_the_record_model(lib):
    record = lib.IdempotencyRecord.create("user.create", "k-1", {"id": 1}, 120.0, fingerprint="f")
    assert (record.operation, record.idempotency_key, record.result, record.fingerprint) == (
        "user.create",
        "k-1",
        {"id": 1},
        "f",
    )
    assert record.status == "completed" and not record.is_pending and not record.is_expired
    assert 119.0 < record.ttl_seconds <= 120.0
    pending = lib.IdempotencyRecord.pending("user.create", "k-1", 30.0)
    assert pending.is_pending and pending.result is None
    with pytest.raises(pydantic.ValidationError):
        lib.IdempotencyIdentifiers(operation="", idempotency_key="k")
    assert lib.IdempotencyIdentifiers(operation="op", idempotency_key="k").idempotency_key == "k"


def test_a_key_with_a_colon(lib):
    # docs/python.md, "A key with `:` is protected".
    if is_idemkit(lib):
        assert lib.IdempotencyIdentifiers(operation="op", idempotency_key="order-9:invoice")
    else:
        with pytest.raises(pydantic.ValidationError):
            lib.IdempotencyIdentifiers(operation="op", idempotency_key="order-9:invoice")


def test_settings(lib):
    settings_module = importlib.import_module(f"{lib.__name__}.settings")
    s = settings_module.BaseIdempotencySettings(key_prefix="svc:")
    assert (s.enabled, s.metrics_enabled, s.default_ttl_minutes, s.min_ttl_seconds, s.max_ttl_seconds) == (
        True,
        False,
        60,
        60,
        30 * 24 * 3600,
    )
    assert (s.operation_ttls, s.in_flight, s.in_flight_lease_seconds, s.on_storage_error) == ({}, "wait", 30, "run")


async def test_dishka_providers_build_a_working_coordinator(lib):
    from dishka import Provider, Scope, make_async_container, provide
    from redis.asyncio import Redis, RedisCluster

    dishka_module = importlib.import_module(f"{lib.__name__}.dishka")
    settings_module = importlib.import_module(f"{lib.__name__}.settings")
    client = await redis_client()
    settings = settings_module.BaseIdempotencySettings(key_prefix=unique("dishka") + ":")

    class Infra(Provider):
        scope = Scope.APP

        @provide
        def get_settings(self) -> dishka_module.IdempotencySettingsProtocol:
            return settings

        @provide
        def get_redis(self) -> Redis | RedisCluster:
            return client

    container = make_async_container(
        Infra(),
        dishka_module.IdempotencyProvider(),
        dishka_module.AsyncRedisIdempotencyProvider(),
        dishka_module.AsyncIdempotencyCoordinatorProvider(),
    )
    c = await container.get(lib.AsyncIdempotencyCoordinator)
    action = Counter()
    key = unique("k")
    await c.coordinate("op", key, 3600, lib.JsonResultAdapter(), action)
    await c.coordinate("op", key, 3600, lib.JsonResultAdapter(), action)
    assert action.calls == 1
    await container.close()


async def test_metrics_are_told_of_hits_and_misses(lib):
    class Recorder(lib.NoOpIdempotencyMetrics):
        def __init__(self) -> None:
            self.seen: list[str] = []

        def record_hit(self, operation: str) -> None:
            self.seen.append("hit")

        def record_miss(self, operation: str) -> None:
            self.seen.append("miss")

    metrics = Recorder()
    c, key = await coordinator(lib, metrics=metrics), unique("m")
    await c.coordinate("op", key, 3600, lib.JsonResultAdapter(), Counter())
    await c.coordinate("op", key, 3600, lib.JsonResultAdapter(), Counter())
    assert metrics.seen == ["miss", "hit"]


def test_prometheus_metrics(lib):
    from prometheus_client import CollectorRegistry

    module = importlib.import_module(f"{lib.__name__}.infra.metrics.prometheus")
    registry = CollectorRegistry()
    m = module.PrometheusIdempotencyMetrics(prefix="t", registry=registry)
    m.record_hit("op")
    m.record_miss("op")
    m.record_latency("op", "get", 0.01)
    assert registry.get_sample_value("t_idempotency_operations_total", {"operation": "op", "status": "hit"}) == 1.0
    prefix = f"cached_{lib.__name__}"  # the default registry takes each name once per process
    assert module.get_idempotency_metrics(prefix) is module.get_idempotency_metrics(prefix)


# -- the differences docs/python.md lists -------------------------------------------------


async def test_a_cancelled_action(lib):
    # docs/python.md, "A cancelled action keeps its reservation until its lease ends".
    c, action = await coordinator(lib, in_flight="raise"), Counter(delay=1.0)
    key = unique("cancel")
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(c.coordinate("op", key, 3600, lib.JsonResultAdapter(), action), 0.1)
    if is_idemkit(lib):
        with pytest.raises(lib.IdempotencyInProgressError):
            await c.coordinate("op", key, 3600, lib.JsonResultAdapter(), action)
    else:
        assert await c.coordinate("op", key, 3600, lib.JsonResultAdapter(), action) == {"n": 2}


async def test_a_result_the_adapter_cannot_encode(lib):
    # docs/python.md, "A result the adapter cannot encode is not run again".
    c, calls = await coordinator(lib), []

    async def returns_none() -> None:
        calls.append(1)
        return None

    key, adapter = unique("enc"), lib.PydanticResultAdapter(Order)
    assert await c.coordinate("op", key, 3600, adapter, returns_none) is None
    if is_idemkit(lib):
        with pytest.raises(idemkit.ResultUnavailable):
            await c.coordinate("op", key, 3600, adapter, returns_none)
        assert len(calls) == 1
    else:
        assert await c.coordinate("op", key, 3600, adapter, returns_none) is None
        assert len(calls) == 2


async def test_a_stored_result_the_adapter_cannot_decode(lib):
    # docs/python.md, "An unreadable record is not overwritten by running again".
    c, action = await coordinator(lib), Counter()
    key = unique("dec")
    await c.coordinate("op", key, 3600, lib.JsonResultAdapter(), action)
    strict = lib.PydanticResultAdapter(Order)
    if is_idemkit(lib):
        with pytest.raises(idemkit.DecodeError):
            await c.coordinate("op", key, 3600, strict, action)
        assert action.calls == 1
    else:
        await c.coordinate("op", key, 3600, strict, action)
        assert action.calls == 2
