"""The blocking API (``Call.run_sync``, ``idemkit.idempotent`` on a plain function, the
``*_sync`` connects and the inbox's ``claim_sync``): the same semantics as ``run``, for code
outside an event loop (Celery, RQ and Dramatiq tasks, threads, forked workers).

Leases here are a second, and the actions outlast them with ``time.sleep``: a renewal that
did not happen would show as a second owner.
"""

import asyncio
import inspect
import multiprocessing
import os
import signal
import sys
import threading
import time

import psycopg
import pytest
import redis
from conftest import POSTGRES_URL, REDIS_URL, _require, unique

import idemkit


def sync_store(kind: str) -> idemkit.Store:
    if kind == "memory":
        return idemkit.MemoryStore()
    try:
        if kind == "redis":
            return idemkit.RedisStore.connect_sync(REDIS_URL, prefix=unique("sync"))
        return idemkit.PostgresStore.connect_sync(POSTGRES_URL)
    except idemkit.StoreError as e:
        _require(f"{kind} for the sync tests", e)
        raise


class Effect:
    """A plain function with an effect that counts itself (thread-safe)."""

    def __init__(self, delay: float = 0.0) -> None:
        self.calls: list[object] = []
        self.delay = delay
        self.lock = threading.Lock()

    def __call__(self, attempt: idemkit.Attempt, value: object = None) -> dict:
        with self.lock:
            self.calls.append(value)
            n = len(self.calls)
        if self.delay:
            time.sleep(self.delay)
        return {"n": n, "token": attempt.fencing_token}


def test_run_sync_runs_once_and_replays(store_kind):
    coordinator, effect, key = idemkit.Coordinator(sync_store(store_kind)), Effect(), unique("k")
    first = coordinator.call("op", key).run_sync(effect, 1)
    again = coordinator.call("op", key).run_sync(effect, 2)
    assert first == again and first["n"] == 1
    assert effect.calls == [1]


def test_threads_racing_one_key_get_one_effect_and_its_value():
    coordinator, effect, key = idemkit.Coordinator(sync_store("redis")), Effect(delay=0.3), unique("race")
    results: list[dict] = []

    def worker() -> None:
        results.append(coordinator.call("op", key).run_sync(effect))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(effect.calls) == 1
    assert len(results) == 8 and all(r == results[0] for r in results)


def test_a_blocked_call_releases_the_gil():
    # A waiter blocked on another owner's reservation: this thread keeps running Python.
    coordinator, key = idemkit.Coordinator(sync_store("memory")), unique("gil")
    owner = threading.Thread(target=lambda: coordinator.call("op", key).run_sync(Effect(delay=1.0)))
    owner.start()
    time.sleep(0.2)
    waiter = threading.Thread(target=lambda: coordinator.call("op", key).run_sync(Effect()))
    waiter.start()
    count = 0
    while waiter.is_alive():
        count += 1  # pure Python: it only advances while this thread holds the GIL
    owner.join()
    assert count > 10_000


def test_reject_while_another_thread_runs():
    coordinator, key = idemkit.Coordinator(sync_store("redis")), unique("reject")
    started = threading.Event()

    def slow(attempt: idemkit.Attempt) -> int:
        started.set()
        time.sleep(0.5)
        return 1

    owner = threading.Thread(target=lambda: coordinator.call("op", key).run_sync(slow))
    owner.start()
    started.wait()
    with pytest.raises(idemkit.InProgress) as raised:
        coordinator.call("op", key, in_flight="reject").run_sync(Effect())
    assert raised.value.key == key and raised.value.retry_after is not None
    owner.join()


@pytest.mark.parametrize("kind", ["redis", "postgres"])
def test_a_function_longer_than_its_lease_is_renewed_not_duplicated(kind):
    coordinator, key = idemkit.Coordinator(sync_store(kind), lease=1.0), unique("lease")
    effect, started = Effect(), threading.Event()

    def long(attempt: idemkit.Attempt) -> dict:
        started.set()
        time.sleep(2.5)  # two and a half leases
        return effect(attempt)

    owner = threading.Thread(target=lambda: coordinator.call("op", key).run_sync(long))
    owner.start()
    started.wait()
    time.sleep(2.0)  # the first lease is long over: only renewals keep the key
    with pytest.raises(idemkit.InProgress):
        coordinator.call("op", key, in_flight="reject").run_sync(effect)
    owner.join()
    assert len(effect.calls) == 1


def test_an_exception_releases_the_key():
    coordinator, key = idemkit.Coordinator(sync_store("redis")), unique("exc")

    def fails(attempt: idemkit.Attempt) -> None:
        raise ValueError("the provider said no")

    with pytest.raises(ValueError, match="provider"):
        coordinator.call("op", key).run_sync(fails)
    effect = Effect()
    assert coordinator.call("op", key, in_flight="reject").run_sync(effect)["n"] == 1


@pytest.mark.parametrize("raised", [KeyboardInterrupt, SystemExit])
def test_keyboard_interrupt_and_system_exit_keep_the_reservation(raised):
    coordinator, key = idemkit.Coordinator(sync_store("redis"), lease=1.0), unique("kbi")

    def interrupted(attempt: idemkit.Attempt) -> None:
        raise raised()

    with pytest.raises(raised):
        coordinator.call("op", key).run_sync(interrupted)
    with pytest.raises(idemkit.InProgress):
        coordinator.call("op", key, in_flight="reject").run_sync(Effect())
    assert coordinator.abandoned_waits == 1
    time.sleep(1.2)  # the lease ends (no renewals): the key is taken over
    assert coordinator.call("op", key, in_flight="reject").run_sync(Effect())["n"] == 1


def test_on_cancel_release_frees_the_key_at_once():
    coordinator, key = idemkit.Coordinator(sync_store("redis"), on_cancel="release"), unique("rel")

    def interrupted(attempt: idemkit.Attempt) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        coordinator.call("op", key).run_sync(interrupted)
    assert coordinator.call("op", key, in_flight="reject").run_sync(Effect())["n"] == 1


def _waiting_in_select(thread: threading.Thread) -> bool:
    """Whether ``thread`` is blocked in the sync bridge's ``select`` (a caller waiting)."""
    frame = sys._current_frames().get(thread.ident or 0)
    while frame is not None:
        if frame.f_code.co_name == "wait" and "select" in frame.f_code.co_names:
            return True
        frame = frame.f_back
    return False


def test_ctrl_c_while_waiting_takes_no_key():
    # The main thread waits on another thread's reservation; a real SIGINT (Ctrl-C) stops it.
    # No race with a timer: the owner holds its reservation until the interrupt has been
    # raised, and the signal is sent once the main thread is seen blocked in the bridge's
    # `select`. The handler is Python's default one whatever an earlier test (a worker, a
    # server) installed: `_thread.interrupt_main` does nothing under SIG_IGN or SIG_DFL, and
    # does not wake a blocking `select`, so the test sends the signal itself.
    coordinator, key = idemkit.Coordinator(sync_store("redis")), unique("ctrlc")
    effect, started, finish = Effect(), threading.Event(), threading.Event()

    def owner_action(attempt: idemkit.Attempt) -> dict:
        started.set()
        finish.wait(30)
        return effect(attempt)

    def interrupt_when_waiting() -> None:
        main = threading.main_thread()
        deadline = time.monotonic() + 30
        while not _waiting_in_select(main) and time.monotonic() < deadline:
            time.sleep(0.01)
        signal.pthread_kill(main.ident, signal.SIGINT)

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    owner = threading.Thread(target=lambda: coordinator.call("op", key).run_sync(owner_action))
    owner.start()
    try:
        started.wait(30)
        threading.Thread(target=interrupt_when_waiting, daemon=True).start()
        with pytest.raises(KeyboardInterrupt):
            coordinator.call("op", key).run_sync(effect)
    finally:
        finish.set()
        owner.join()
        signal.signal(signal.SIGINT, previous)
    assert len(effect.calls) == 1
    # The owner's result is there; the interrupted caller left nothing behind.
    assert coordinator.call("op", key, in_flight="reject").run_sync(effect)["n"] == 1
    assert coordinator.abandoned_waits == 0


def test_errors_are_typed_and_nothing_runs():
    coordinator, effect = idemkit.Coordinator(sync_store("memory")), Effect()
    with pytest.raises(idemkit.InvalidKey):
        coordinator.call("op", "bad\nkey").run_sync(effect)
    with pytest.raises(idemkit.StoreUnavailable):
        idemkit.RedisStore.connect_sync("redis://127.0.0.1:1")
    assert effect.calls == []


def test_run_sync_refuses_a_running_event_loop():
    coordinator = idemkit.Coordinator(idemkit.MemoryStore())

    async def inside() -> None:
        with pytest.raises(RuntimeError, match="await call.run"):
            coordinator.call("op", "k").run_sync(Effect())

    asyncio.run(inside())


# -- the decorator ----------------------------------------------------------------------


def test_the_decorator_on_a_plain_function():
    coordinator, sent = idemkit.Coordinator(sync_store("redis")), []

    @idemkit.idempotent("mail.invoice", key=lambda order_id: f"{order_id}.invoice", coordinator=coordinator)
    def send_invoice(attempt: idemkit.Attempt, order_id: str) -> str:
        sent.append(order_id)
        return f"receipt for {order_id} ({attempt.downstream_key})"

    order = unique("order")
    assert send_invoice(order) == send_invoice(order)
    assert sent == [order]
    # What a task queue checks a call's arguments against: the function without its attempt.
    assert list(inspect.signature(send_invoice).parameters) == ["order_id"]
    assert send_invoice.__name__ == "send_invoice"


def test_the_decorator_on_an_async_function_and_a_lazy_coordinator():
    made: list[idemkit.Coordinator] = []

    def coordinator() -> idemkit.Coordinator:
        if not made:
            made.append(idemkit.Coordinator(idemkit.MemoryStore()))
        return made[0]

    @idemkit.idempotent("op", key=lambda n, *, scope: f"k-{n}", scope=lambda n, *, scope: scope, coordinator=coordinator)
    async def work(attempt: idemkit.Attempt, n: int, *, scope: str) -> int:
        return n * 10

    async def main() -> list[int]:
        return [await work(1, scope="a"), await work(1, scope="a"), await work(2, scope="b")]

    assert asyncio.run(main()) == [10, 10, 20]
    assert len(made) == 1


def test_the_decorator_needs_the_attempt_parameter():
    with pytest.raises(TypeError, match="Attempt"):

        @idemkit.idempotent("op", key=lambda: "k", coordinator=idemkit.Coordinator(idemkit.MemoryStore()))
        def nothing() -> None:
            return None


# -- the inbox --------------------------------------------------------------------------


def test_claim_sync_in_a_psycopg_transaction():
    inbox = idemkit.Inbox(table="idemkit_inbox_sync")
    try:
        inbox.migrate_sync(POSTGRES_URL)
        conn = psycopg.connect(POSTGRES_URL)
    except (idemkit.StoreError, psycopg.OperationalError) as e:
        _require(f"postgres at {POSTGRES_URL}", e)
        raise
    message = unique("msg")
    with conn:
        with conn.transaction(force_rollback=True):
            assert inbox.claim_sync(conn, "orders", message) is True
        # Rolled back with the effect: the redelivery claims it again.
        with conn.transaction():
            assert inbox.claim_sync(conn, "orders", message) is True
        with conn.transaction():
            assert inbox.claim_sync(conn.cursor(), "orders", message) is False
        with pytest.raises(idemkit.InvalidKey):
            inbox.claim_sync(conn, "orders", " ")


# -- processes --------------------------------------------------------------------------


def _racer(key: str, prefix: str, counter: str, out: "multiprocessing.Queue[object]") -> None:
    client = redis.Redis.from_url(REDIS_URL)
    coordinator = idemkit.Coordinator(idemkit.RedisStore.connect_sync(REDIS_URL, prefix=prefix))

    def effect(attempt: idemkit.Attempt) -> int:
        n = int(client.incr(counter))
        time.sleep(0.3)
        return n

    out.put(coordinator.call("op", key).run_sync(effect))


def test_two_processes_racing_one_key_get_one_effect():
    sync_store("redis")  # fails (under CI) when Redis is not there
    ctx = multiprocessing.get_context("spawn")
    key, prefix, counter = unique("proc"), unique("sync-proc"), unique("sync-counter")
    out = ctx.Queue()
    racers = [ctx.Process(target=_racer, args=(key, prefix, counter, out)) for _ in range(2)]
    for p in racers:
        p.start()
    results = [out.get(timeout=30) for _ in racers]
    for p in racers:
        p.join(timeout=30)
    assert results == [1, 1]
    assert int(redis.Redis.from_url(REDIS_URL).get(counter)) == 1


def test_fork_after_a_sync_call():
    sync_store("redis")  # fails (under CI) when Redis is not there
    prefix = unique("sync-fork")
    coordinator = idemkit.Coordinator(idemkit.RedisStore.connect_sync(REDIS_URL, prefix=prefix))
    coordinator.call("op", unique("before-fork")).run_sync(Effect())
    key = unique("fork")
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, then leave without running the parent's atexit
        code = 0
        try:
            try:
                coordinator.call("op", key).run_sync(Effect())
                code = 1  # the parent's store must be refused
            except idemkit.ConfigError:
                pass
            mine = idemkit.Coordinator(idemkit.RedisStore.connect_sync(REDIS_URL, prefix=prefix))
            value = mine.call("op", key).run_sync(Effect())
            os.write(write, f"{code} {value['n']}".encode())
        finally:
            os._exit(0)
    os.close(write)
    _, status = os.waitpid(pid, 0)
    report = os.read(read, 100).decode().split()
    os.close(read)
    assert os.waitstatus_to_exitcode(status) == 0 and report == ["0", "1"]
    # The child's value is the parent's too: one record, written by the child.
    assert coordinator.call("op", key, in_flight="reject").run_sync(Effect())["n"] == 1



GEVENT_RACE = """
from gevent import monkey
monkey.patch_all()
import os, sys
import gevent
import idemkit
coordinator = idemkit.Coordinator(idemkit.RedisStore.connect_sync(sys.argv[1], prefix=sys.argv[2]))
sent, ticks = [], []
def send(attempt, i):
    sent.append(i)
    gevent.sleep(0.3)
    return f"em_{len(sent)}"
def ticker():
    for _ in range(20):
        ticks.append(1)
        gevent.sleep(0.01)
callers = [gevent.spawn(lambda: coordinator.call("mail", "order-9.invoice").run_sync(send, i)) for i in range(8)]
others = gevent.spawn(ticker)
gevent.joinall([*callers, others], timeout=30)
print(len(sent), sorted({c.value for c in callers}), len(ticks))
"""


def test_gevent_greenlets_racing_one_key():
    # Under gevent's monkey patching, a waiting run_sync yields to the other greenlets (the
    # ticker keeps ticking) and eight greenlets on one key get one effect and its value.
    if not os.environ.get("CI"):
        pytest.importorskip("gevent")
    sync_store("redis")  # fails (under CI) when Redis is not there
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", GEVENT_RACE, REDIS_URL, unique("gevent")], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split(maxsplit=1) == ["1", "['em_1'] 20\n"]
