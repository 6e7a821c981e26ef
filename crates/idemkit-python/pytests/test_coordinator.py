"""The native API on every store: once, replay, wait, reject, run, release, errors."""

import asyncio
import socket
import subprocess

import pytest
from conftest import Mailer, make_store, unique

import idemkit


async def test_a_key_runs_its_action_once_and_replays_its_value(store_kind):
    coordinator = idemkit.Coordinator(await make_store(store_kind))
    mailer = Mailer()
    key = unique("order-9.invoice")
    first = await coordinator.call("mail.invoice", key, ttl=3600).run(mailer.send_invoice, 9)
    second = await coordinator.call("mail.invoice", key, ttl=3600).run(mailer.send_invoice, 9)
    assert (first, second, mailer.sent) == ("em_1", "em_1", [9])


async def test_concurrent_duplicates_wait_for_the_first_result(store_kind):
    coordinator = idemkit.Coordinator(await make_store(store_kind))
    mailer = Mailer(delay=0.3)
    key = unique("k")
    results = await asyncio.gather(
        *(coordinator.call("mail.invoice", key).run(mailer.send_invoice, 9) for _ in range(5))
    )
    assert results == ["em_1"] * 5
    assert mailer.sent == [9]


async def test_reject_mode_raises_in_progress_with_a_retry_after(store_kind):
    coordinator = idemkit.Coordinator(await make_store(store_kind), lease=20)
    mailer = Mailer(delay=0.3)
    key = unique("k")
    first = asyncio.create_task(coordinator.call("mail.invoice", key).run(mailer.send_invoice, 9))
    await asyncio.sleep(0.1)
    with pytest.raises(idemkit.InProgress) as raised:
        await coordinator.call("mail.invoice", key, in_flight="reject").run(mailer.send_invoice, 9)
    assert 0 < raised.value.retry_after <= 20
    assert (raised.value.operation, raised.value.key) == ("mail.invoice", key)
    assert isinstance(raised.value, idemkit.IdempotencyInProgressError)
    assert await first == "em_1"
    assert mailer.sent == [9]


async def test_run_mode_runs_a_duplicate_unprotected(store_kind):
    coordinator = idemkit.Coordinator(await make_store(store_kind))
    mailer = Mailer(delay=0.2)
    key = unique("k")
    seen = []

    async def send(attempt, order):
        seen.append(attempt.is_protected)
        return await mailer.send_invoice(attempt, order)

    first = asyncio.create_task(coordinator.call("op", key).run(send, 1))
    await asyncio.sleep(0.05)
    await coordinator.call("op", key, in_flight="run").run(send, 1)
    await first
    assert sorted(seen) == [False, True]
    assert len(mailer.sent) == 2


async def test_an_action_that_raises_releases_the_key(store_kind):
    coordinator = idemkit.Coordinator(await make_store(store_kind))
    key = unique("k")
    calls = []

    async def flaky(_attempt):
        calls.append(1)
        if len(calls) == 1:
            raise ConnectionError("smtp down")
        return "sent"

    with pytest.raises(ConnectionError):
        await coordinator.call("op", key).run(flaky)
    assert await coordinator.call("op", key).run(flaky) == "sent"
    assert await coordinator.call("op", key).run(flaky) == "sent"
    assert len(calls) == 2


async def test_the_attempt_carries_fencing_token_and_downstream_key(store_kind):
    coordinator = idemkit.Coordinator(await make_store(store_kind))
    key = unique("k")
    seen = []

    async def act(attempt):
        seen.append((attempt.fencing_token, attempt.downstream_key, attempt.is_lease_lost(), attempt.lease_left()))
        return None

    await coordinator.call("op", key).run(act)
    (fencing, downstream, lost, left), = seen
    assert fencing is not None and fencing > 0
    assert isinstance(downstream, str) and len(downstream) > 0
    assert lost is False
    assert left is not None and left > 0


async def test_a_key_reused_with_another_fingerprint_is_refused(store_kind):
    coordinator = idemkit.Coordinator(await make_store(store_kind))
    key = unique("k")
    mailer = Mailer()
    await coordinator.call("charge", key, fingerprint="amount=100").run(mailer.send_invoice, 1)
    with pytest.raises(idemkit.KeyReused):
        await coordinator.call("charge", key, fingerprint="amount=200").run(mailer.send_invoice, 2)
    assert await coordinator.call("charge", key, fingerprint="amount=100").run(mailer.send_invoice, 1) == "em_1"
    assert mailer.sent == [1]


async def test_scopes_keep_tenants_apart(store_kind):
    coordinator = idemkit.Coordinator(await make_store(store_kind))
    key = unique("k")
    mailer = Mailer()
    a = await coordinator.call("op", key, scope="tenant-a").run(mailer.send_invoice, 1)
    b = await coordinator.call("op", key, scope="tenant-b").run(mailer.send_invoice, 2)
    assert (a, b) == ("em_1", "em_2")


async def test_a_cancelled_caller_leaves_the_key_reserved_until_its_lease_ends():
    coordinator = idemkit.Coordinator(idemkit.MemoryStore(), lease=1)
    key = unique("k")
    started = asyncio.Event()

    async def slow(_attempt):
        started.set()
        await asyncio.sleep(30)

    task = asyncio.create_task(coordinator.call("op", key).run(slow))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    with pytest.raises(idemkit.InProgress):
        await coordinator.call("op", key, in_flight="reject").run(slow)
    await asyncio.sleep(1.3)

    async def quick(_attempt):
        return "after the lease"

    assert await coordinator.call("op", key).run(quick) == "after the lease"


async def test_invalid_input_is_refused_before_the_action_runs():
    coordinator = idemkit.Coordinator(idemkit.MemoryStore())
    mailer = Mailer()
    for operation, key in [("op", ""), ("", "k"), ("op", "x" * 600), ("op", "bad\nkey")]:
        with pytest.raises(idemkit.InvalidKey):
            await coordinator.call(operation, key).run(mailer.send_invoice, 1)
    with pytest.raises(ValueError):
        await coordinator.call("op", "k", ttl=0).run(mailer.send_invoice, 1)
    with pytest.raises(ValueError):
        await coordinator.call("op", "k", in_flight="maybe").run(mailer.send_invoice, 1)
    assert mailer.sent == []


async def test_a_colon_in_a_key_is_protected_not_refused():
    # The seed's bug: 'order-9:invoice' failed validation and ran unprotected.
    coordinator = idemkit.Coordinator(idemkit.MemoryStore())
    mailer = Mailer()
    for _ in range(2):
        await coordinator.call("mail.invoice", "order-9:invoice").run(mailer.send_invoice, 9)
    assert mailer.sent == [9]


async def test_a_store_that_is_down_refuses_by_default_and_runs_when_fail_open(tmp_path):
    with pytest.raises(idemkit.StoreUnavailable):
        await idemkit.RedisStore.connect("redis://127.0.0.1:1")  # nothing listens on port 1
    # A server of the test's own, stopped under a connected store.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        ["redis-server", "--port", str(port), "--save", "", "--appendonly", "no", "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL,
    )
    try:
        for _ in range(100):
            try:
                store = await idemkit.RedisStore.connect(f"redis://127.0.0.1:{port}")
                break
            except idemkit.StoreUnavailable:
                await asyncio.sleep(0.05)
        closed = idemkit.Coordinator(store)
        open_ = idemkit.Coordinator(store, fail_open=True)
    finally:
        server.kill()
        server.wait()
    mailer = Mailer()
    with pytest.raises(idemkit.StoreUnavailable) as raised:
        await closed.call("op", "k").run(mailer.send_invoice, 1)
    assert raised.value.phase == "begin"
    assert mailer.sent == []
    seen = []

    async def send(attempt, order):
        seen.append(attempt.is_protected)
        return await mailer.send_invoice(attempt, order)

    assert await open_.call("op", "k").run(send, 2) == "em_1"
    assert (mailer.sent, seen) == ([2], [False])


async def test_an_unencodable_result_is_returned_once_and_never_rerun():
    coordinator = idemkit.Coordinator(idemkit.MemoryStore())
    calls = []

    async def act(_attempt):
        calls.append(1)
        return {1, 2}  # a set has no JSON form

    assert await coordinator.call("op", "k").run(act) == {1, 2}
    with pytest.raises(idemkit.ResultUnavailable):
        await coordinator.call("op", "k").run(act)
    assert len(calls) == 1


async def test_a_result_stored_by_another_codec_is_a_decode_error_and_nothing_runs():
    coordinator = idemkit.Coordinator(idemkit.MemoryStore())

    async def raw(_attempt):
        return b"\xff\x00not json"

    async def never(_attempt):
        raise AssertionError("ran")

    await coordinator.call("op", "k", codec=idemkit.BYTES).run(raw)
    assert await coordinator.call("op", "k", codec=idemkit.BYTES).run(never) == b"\xff\x00not json"
    with pytest.raises(idemkit.DecodeError):
        await coordinator.call("op", "k").run(never)


async def test_a_pydantic_model_round_trips():
    pydantic = pytest.importorskip("pydantic")

    class Receipt(pydantic.BaseModel):
        id: str
        cents: int

    coordinator = idemkit.Coordinator(idemkit.MemoryStore())
    codec = idemkit.PydanticCodec(Receipt)

    async def act(_attempt):
        return Receipt(id="em_1", cents=500)

    first = await coordinator.call("op", "k", codec=codec).run(act)
    again = await coordinator.call("op", "k", codec=codec).run(act)
    assert first == again == Receipt(id="em_1", cents=500)
    assert isinstance(again, Receipt)


async def test_a_caller_cancelled_after_its_action_returned_still_stores_the_result(store_kind):
    coordinator = idemkit.Coordinator(await make_store(store_kind))
    key = unique("k")
    calls = []
    task = None

    async def act(_attempt):
        calls.append(1)
        # Cancelled at its next await: the completion's, after this return.
        asyncio.get_running_loop().call_soon(task.cancel)
        return "stored anyway"

    task = asyncio.create_task(coordinator.call("op", key).run(act))
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await coordinator.call("op", key).run(act) == "stored anyway"
    assert len(calls) == 1


async def test_a_waiter_cancelled_while_waiting_leaves_the_owner_alone():
    coordinator = idemkit.Coordinator(idemkit.MemoryStore())
    mailer = Mailer(delay=0.3)
    owner = asyncio.create_task(coordinator.call("op", "k").run(mailer.send_invoice, 1))
    await asyncio.sleep(0.05)
    waiter = asyncio.create_task(coordinator.call("op", "k").run(mailer.send_invoice, 1))
    await asyncio.sleep(0.05)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert await owner == "em_1"
    assert await coordinator.call("op", "k").run(mailer.send_invoice, 1) == "em_1"
    assert mailer.sent == [1]
