"""The idempotency-kit drop-in: its public API on the idemkit core.

The scenarios of idempotency-kit 0.5.0's own suite that apply (the decorator's coordinator
and key lookup, the in-flight modes, fingerprints, adapters, TTL bounds, validation), ported
to a real store instead of mocks; the seed's scenarios are in test_seed.py.
"""

import asyncio
import logging

import pytest
from conftest import REDIS_URL, unique

import idemkit as ik


def coordinator(**options) -> ik.AsyncIdempotencyCoordinator:
    return ik.AsyncIdempotencyCoordinator(ik.MemoryIdempotencyRepository(), ik.IdempotencyDomainService(), **options)


class Counter:
    def __init__(self, delay: float = 0.0) -> None:
        self.calls: list[tuple] = []
        self.delay = delay

    async def __call__(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        if self.delay:
            await asyncio.sleep(self.delay)
        return {"n": len(self.calls)}


async def test_coordinate_runs_once_and_replays_the_adapted_result():
    c, action = coordinator(), Counter()
    first = await c.coordinate("user.create", "k-1", 3600, ik.JsonResultAdapter(), action, 7, name="x")
    again = await c.coordinate("user.create", "k-1", 3600, ik.JsonResultAdapter(), action, 7, name="x")
    assert first == again == {"n": 1}
    assert action.calls == [((7,), {"name": "x"})]


async def test_a_none_key_or_a_disabled_coordinator_runs_the_action_plainly():
    action = Counter()
    await coordinator().coordinate("op", None, 60, ik.JsonResultAdapter(), action)
    await coordinator().coordinate("op", None, 60, ik.JsonResultAdapter(), action)
    off = coordinator(enabled=False)
    await off.coordinate("op", "k", 60, ik.JsonResultAdapter(), action)
    await off.coordinate("op", "k", 60, ik.JsonResultAdapter(), action)
    assert len(action.calls) == 4


async def test_invalid_identifiers_raise_validation_error_before_the_action():
    action = Counter()
    for op, key in [("", "k"), ("op", ""), ("op", "k" * 1000)]:
        with pytest.raises(ik.IdempotencyValidationError):
            await coordinator().coordinate(op, key, 60, ik.JsonResultAdapter(), action)
    assert action.calls == []


async def test_ttl_outside_the_domain_bounds_runs_uncached():
    # test_dropin.py checks the same rules against idempotency-kit; this is the in-memory store.
    action = Counter()
    c = coordinator()
    for _ in range(2):
        await c.coordinate("op", "long", 31 * 86400, ik.JsonResultAdapter(), action)
    assert len(action.calls) == 2
    for _ in range(2):
        await c.coordinate("op", "short", 10, ik.JsonResultAdapter(), action)
    assert len(action.calls) == 3
    with pytest.raises(ik.IdempotencyValidationError):
        ik.IdempotencyDomainService(default_ttl_minutes=0)


async def test_in_flight_wait_gives_both_callers_the_first_result():
    c, action = coordinator(), Counter(delay=0.2)
    a, b = await asyncio.gather(
        c.coordinate("op", "k", 60, ik.JsonResultAdapter(), action),
        c.coordinate("op", "k", 60, ik.JsonResultAdapter(), action),
    )
    assert a == b == {"n": 1}
    assert len(action.calls) == 1


async def test_in_flight_raise_refuses_the_second_caller():
    c, action = coordinator(in_flight="raise"), Counter(delay=0.2)
    first = asyncio.create_task(c.coordinate("op", "k", 60, ik.JsonResultAdapter(), action))
    await asyncio.sleep(0.05)
    with pytest.raises(ik.IdempotencyInProgressError) as raised:
        await c.coordinate("op", "k", 60, ik.JsonResultAdapter(), action)
    assert (raised.value.operation, raised.value.key) == ("op", "k")
    assert await first == {"n": 1}
    assert await c.coordinate("op", "k", 60, ik.JsonResultAdapter(), action) == {"n": 1}


async def test_in_flight_run_runs_the_duplicate_too():
    c, action = coordinator(in_flight="run"), Counter(delay=0.1)
    await asyncio.gather(
        c.coordinate("op", "k", 60, ik.JsonResultAdapter(), action),
        c.coordinate("op", "k", 60, ik.JsonResultAdapter(), action),
    )
    assert len(action.calls) == 2


async def test_an_action_longer_than_the_lease_is_renewed_not_duplicated():
    c, action = coordinator(in_flight="raise", in_flight_lease_seconds=1), Counter(delay=2.5)
    first = asyncio.create_task(c.coordinate("op", "k", 60, ik.JsonResultAdapter(), action))
    await asyncio.sleep(1.8)  # past the first lease: only renewal keeps the key
    with pytest.raises(ik.IdempotencyInProgressError):
        await c.coordinate("op", "k", 60, ik.JsonResultAdapter(), action)
    assert await first == {"n": 1}
    assert len(action.calls) == 1


async def test_a_failed_action_releases_the_key_and_is_not_cached():
    c = coordinator()
    calls = []

    async def flaky():
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("boom")
        return "ok"

    with pytest.raises(RuntimeError):
        await c.coordinate("op", "k", 60, ik.JsonResultAdapter(), flaky)
    assert await c.coordinate("op", "k", 60, ik.JsonResultAdapter(), flaky) == "ok"
    assert await c.coordinate("op", "k", 60, ik.JsonResultAdapter(), flaky) == "ok"
    assert len(calls) == 2


async def test_a_fingerprint_mismatch_raises_key_reuse_with_both_fingerprints_absent_or_equal_passing():
    c, action = coordinator(), Counter()
    a = ik.fingerprint_of(amount=100, currency="EUR")
    assert a == ik.fingerprint_of(currency="EUR", amount=100)
    await c.coordinate("charge", "k", 60, ik.JsonResultAdapter(), action, idempotency_fingerprint=a)
    with pytest.raises(ik.IdempotencyKeyReuseError):
        await c.coordinate(
            "charge", "k", 60, ik.JsonResultAdapter(), action, idempotency_fingerprint=ik.fingerprint_of(amount=200)
        )
    assert await c.coordinate("charge", "k", 60, ik.JsonResultAdapter(), action, idempotency_fingerprint=a) == {"n": 1}
    assert len(action.calls) == 1


async def test_void_and_pydantic_adapters_round_trip():
    pydantic = pytest.importorskip("pydantic")

    class User(pydantic.BaseModel):
        id: int
        name: str

    c = coordinator()

    async def make():
        return User(id=1, name="ann")

    async def nothing():
        return None

    adapter = ik.PydanticResultAdapter(User)
    assert await c.coordinate("u", "k", 60, adapter, make) == await c.coordinate("u", "k", 60, adapter, make)
    assert isinstance(await c.coordinate("u", "k", 60, adapter, make), User)
    assert await c.coordinate("v", "k", 60, ik.VoidResultAdapter(), nothing) is None
    with pytest.raises(ik.IdempotencyValidationError):
        adapter.encode(None)


# -- the decorator (idempotency-kit's tests/unit/core/test_idempotent.py, on a real store) --


async def test_decorator_finds_the_coordinator_among_the_arguments():
    c, calls = coordinator(), []

    @ik.async_idempotent(operation="test.op", adapter=ik.JsonResultAdapter())
    async def my_func(idempotency_key, coord):
        calls.append(idempotency_key)
        return "ok"

    assert await my_func(idempotency_key="test-key", coord=c) == "ok"
    assert await my_func("test-key", c) == "ok"  # a positional key
    assert calls == ["test-key"]


async def test_decorator_finds_the_coordinator_by_infra_param_or_on_self():
    c, calls = coordinator(), []

    class Service:
        def __init__(self, coordinator):
            self._idempotency = coordinator

        @ik.async_idempotent(operation="test.op", adapter=ik.JsonResultAdapter(), infra_param="_idempotency")
        async def named(self, *, idempotency_key=None):
            calls.append("named")
            return "ok"

        @ik.async_idempotent(operation="test.other", adapter=ik.JsonResultAdapter())
        async def by_type(self, idempotency_key=None):
            calls.append("by_type")
            return "ok"

    s = Service(c)
    for _ in range(2):
        await s.named(idempotency_key="k")
        await s.by_type(idempotency_key="k")
    assert calls == ["named", "by_type"]


async def test_decorator_without_key_or_coordinator_runs_directly_and_warns(caplog):
    calls = []

    @ik.async_idempotent(operation="test.op", adapter=ik.JsonResultAdapter())
    async def my_func(payload, *, idempotency_key=None):
        calls.append(payload)
        return "direct"

    with caplog.at_level(logging.WARNING, logger="idemkit"):
        assert await my_func("a") == "direct"
        assert await my_func("b", idempotency_key="k") == "direct"
    assert calls == ["a", "b"]
    assert [r.message for r in caplog.records] == [
        "No idempotency coordinator found; running the operation without idempotency"
    ]


async def test_decorator_fingerprints_the_named_parameters():
    c, calls = coordinator(), []

    @ik.async_idempotent(operation="charge", adapter=ik.JsonResultAdapter(), fingerprint_params=("amount",))
    async def charge(idempotency_key, amount, coord, note="x"):
        calls.append(amount)
        return amount

    assert await charge("k", 100, c) == 100
    assert await charge("k", 100, c, note="other") == 100
    with pytest.raises(ik.IdempotencyKeyReuseError):
        await charge("k", 200, c)
    assert calls == [100]
    with pytest.raises(TypeError):

        @ik.async_idempotent(operation="x", adapter=ik.JsonResultAdapter(), fingerprint_params=("missing",))
        async def bad(idempotency_key):
            return None


async def redis_client():
    """A redis-py asyncio client of the machine's Redis (required under CI)."""
    redis = pytest.importorskip("redis.asyncio")
    client = redis.from_url(REDIS_URL)
    try:
        await client.ping()
    except Exception as e:  # noqa: BLE001
        from conftest import _require

        _require(f"redis at {REDIS_URL}", e)
    return client


async def test_the_redis_repository_takes_a_redis_py_client():
    client = await redis_client()
    repo = ik.RedisAsyncIdempotencyRepository(client, key_prefix=unique("compat") + ":")
    c, action = ik.AsyncIdempotencyCoordinator(repo, ik.IdempotencyDomainService()), Counter()
    assert await c.coordinate("op", "k", 60, ik.JsonResultAdapter(), action) == {"n": 1}
    assert await c.coordinate("op", "k", 60, ik.JsonResultAdapter(), action) == {"n": 1}
    assert len(action.calls) == 1
    await client.aclose()


async def test_a_corrupt_record_raises_storage_error_even_when_failing_open():
    # docs/python.md: a bad record can never switch protection off, in either mode.
    client = await redis_client()
    prefix = unique("corrupt")
    for mode in ("run", "raise"):
        repo = ik.RedisAsyncIdempotencyRepository(client, key_prefix=f"{prefix}-{mode}:")
        c, action = ik.AsyncIdempotencyCoordinator(repo, on_storage_error=mode), Counter()
        await c.coordinate("op", "k", 60, ik.JsonResultAdapter(), action)
        keys = [k async for k in client.scan_iter(match=f"{prefix}-{mode}:*")]
        assert len(keys) == 1, keys
        await client.set(keys[0], b"\x00 not a record", keepttl=True)
        with pytest.raises(ik.IdempotencyStorageError):
            await c.coordinate("op", "k", 60, ik.JsonResultAdapter(), action)
        assert len(action.calls) == 1
    await client.aclose()


def test_a_repository_of_its_own_protocol_is_refused_at_once():
    # docs/python.md: the repository is a store's address, not a protocol to implement.
    class MyRepository:
        async def get(self, operation: str, key: str) -> None:
            return None

    with pytest.raises(TypeError, match="not an idemkit repository"):
        ik.AsyncIdempotencyCoordinator(MyRepository(), ik.IdempotencyDomainService())


def test_the_import_paths_of_idempotency_kit_exist():
    from idemkit.infra.storage.redis.aio.repository import RedisAsyncIdempotencyRepository

    assert RedisAsyncIdempotencyRepository is ik.RedisAsyncIdempotencyRepository
    # Which names core.exceptions has is test_dropin's table; here, that each is the base's.
    from idemkit.core import exceptions

    for name in exceptions.__all__:
        assert issubclass(getattr(ik, name), ik.IdempotencyError)


# -- the drop-in never guesses (issue 49 item 4) ----------------------------------------------


def test_a_sentinel_client_is_translated_to_its_sentinels_and_master():
    # Before: its address was unreadable and the records went to 127.0.0.1:6379 instead.
    from redis.asyncio.sentinel import Sentinel

    from idemkit.compat import _redis_target

    client = Sentinel([("10.0.0.1", 26379), ("10.0.0.2", 26380)]).master_for("mymaster", db=2, password="s3cret")
    target = _redis_target(client)
    assert target.urls == ["redis+sentinel://10.0.0.1:26379,10.0.0.2:26380/mymaster/2"]
    assert target.auth["password"] == "s3cret"
    # What it cannot carry is refused at construction, naming it.
    guarded = Sentinel([("10.0.0.1", 26379)], sentinel_kwargs={"password": "x"}).master_for("mymaster")
    with pytest.raises(ik.ConfigError, match="sentinels' own password"):
        ik.RedisAsyncIdempotencyRepository(guarded)


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"ssl": True, "ssl_cert_reqs": "none"}, "ssl_cert_reqs"),
        ({"ssl": True, "ssl_check_hostname": False}, "ssl_check_hostname"),
        ({"ssl": True, "ssl_ca_data": "-----BEGIN CERTIFICATE-----"}, "ssl_ca_data"),
        ({"ssl": True, "ssl_certfile": "/c.pem"}, "ssl_certfile without ssl_keyfile"),
        ({"username": "worker"}, "username without a password"),
    ],
)
def test_what_cannot_be_carried_is_refused_at_construction(options, named):
    import redis.asyncio

    client = redis.asyncio.Redis(host="127.0.0.1", port=6390, **options)
    with pytest.raises(ik.ConfigError, match=named):
        ik.RedisAsyncIdempotencyRepository(client)


def test_a_client_is_translated_whole():
    import redis.asyncio

    from idemkit.compat import _redis_target

    client = redis.asyncio.Redis(
        host="10.0.0.7", port=6390, db=3, username="worker", password="s3cret",
        ssl=True, ssl_ca_certs="/etc/ca.pem", ssl_certfile="/etc/c.pem", ssl_keyfile="/etc/c.key",
    )
    target = _redis_target(client)
    assert target.urls == ["rediss://10.0.0.7:6390/3"]
    assert target.auth == {
        "username": "worker", "password": "s3cret",
        "ssl_ca_certs": "/etc/ca.pem", "ssl_certfile": "/etc/c.pem", "ssl_keyfile": "/etc/c.key",
    }
    # The same from a URL of redis-py's.
    target = _redis_target(redis.asyncio.Redis.from_url("rediss://worker:s3cret@10.0.0.7:6390/3?ssl_ca_certs=/etc/ca.pem"))
    assert target.urls == ["rediss://10.0.0.7:6390/3"]
    assert target.auth["ssl_ca_certs"] == "/etc/ca.pem" and target.auth["username"] == "worker"


async def test_the_clients_database_is_where_the_records_land():
    client = await redis_client()
    import redis.asyncio

    db3 = redis.asyncio.Redis(host=client.connection_pool.connection_kwargs["host"],
                              port=client.connection_pool.connection_kwargs["port"], db=3)
    prefix = unique("db3")
    c, action = ik.AsyncIdempotencyCoordinator(ik.RedisAsyncIdempotencyRepository(db3, key_prefix=prefix + ":")), Counter()
    await c.coordinate("op", "k", 60, ik.JsonResultAdapter(), action)
    assert [k async for k in db3.scan_iter(match=f"{prefix}:*")] != []
    assert [k async for k in client.scan_iter(match=f"{prefix}:*")] == []  # not in db 0
    await db3.aclose()
    await client.aclose()


async def test_a_fakeredis_client_still_deduplicates(caplog):
    # Before: its address was unreachable, and every action ran unprotected with a warning.
    fakeredis = pytest.importorskip("fakeredis")
    a, b = fakeredis.FakeAsyncRedis(), fakeredis.FakeAsyncRedis()  # one fake server
    action = Counter()
    for client in (a, b):
        c = ik.AsyncIdempotencyCoordinator(ik.RedisAsyncIdempotencyRepository(client), on_storage_error="run")
        assert await c.coordinate("op", "order-9", 60, ik.JsonResultAdapter(), action) == {"n": 1}
    assert len(action.calls) == 1
    assert "without idempotency" not in caplog.text


@pytest.mark.parametrize(
    "value",
    [
        {"at": __import__("datetime").datetime(2026, 12, 6)},
        {"amount": __import__("decimal").Decimal("10.50")},
        {"id": __import__("uuid").UUID(int=9)},
        {"tags": {"a"}},
        {"pair": (1, 2)},
        {"raw": b"\x00"},
        {1: "int key"},
    ],
    ids=["datetime", "Decimal", "UUID", "set", "tuple", "bytes", "int-key"],
)
async def test_a_result_json_would_not_give_back_is_not_replayed_as_another_type(value):
    # Before: a replay returned it as str or list, another type than the first call's.
    c, calls = coordinator(), []

    async def action():
        calls.append(1)
        return value

    key = unique("types")
    assert await c.coordinate("op", key, 3600, ik.JsonResultAdapter(), action) == value
    with pytest.raises(ik.ResultUnavailable):
        await c.coordinate("op", key, 3600, ik.JsonResultAdapter(), action)
    assert len(calls) == 1


async def test_json_values_round_trip_as_they_were():
    c, value = coordinator(), {"list": [1, 2.5, "x", None, True], "nested": {"a": [{"b": False}]}}

    async def action():
        return value

    key = unique("json")
    first = await c.coordinate("op", key, 3600, ik.JsonResultAdapter(), action)
    again = await c.coordinate("op", key, 3600, ik.JsonResultAdapter(), action)
    assert first == again == value and type(again["list"]) is list


async def test_a_plain_function_given_to_an_awaited_run_keeps_its_result():
    # Before: it ran, then `await` failed with TypeError, the key was released, and every
    # delivery sent again.
    import idemkit

    coordinator_, sent = idemkit.Coordinator(idemkit.MemoryStore()), []

    def send(attempt: idemkit.Attempt, order: str) -> str:
        sent.append(order)
        return f"em_{order}"

    for _ in range(3):
        assert await coordinator_.call("mail.invoice", "order-9.invoice").run(send, "order-9") == "em_order-9"
    assert sent == ["order-9"]
    plain, runs = ik.AsyncIdempotencyCoordinator(ik.MemoryIdempotencyRepository()), []

    def run() -> dict:
        runs.append(1)
        return {"n": len(runs)}

    for _ in range(2):
        assert await plain.coordinate("op", "k", 60, ik.JsonResultAdapter(), run) == {"n": 1}
    assert runs == [1]
