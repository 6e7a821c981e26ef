"""Redis behind Sentinel from Python: a master and a sentinel of the test's own
(``redis-server --sentinel``), reached by a ``redis+sentinel://`` URL and by the drop-in
given a redis-py ``Sentinel(...).master_for(...)`` client. The failover itself is the Rust
suite's (``crates/idemkit-redis/tests/sentinel.rs``): the store is the same.

Before: the drop-in replaced a Sentinel client with 127.0.0.1:6379, so the records landed on
another Redis (or, without one, every action ran unprotected).
"""

import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from conftest import Mailer, unique

import idemkit


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ping(client: redis.Redis) -> None:
    for _ in range(400):
        try:
            if client.ping():
                return
        except redis.RedisError:
            pass
        time.sleep(0.025)
    pytest.fail("a server of the test's own did not start")


@pytest.fixture(scope="module")
def group() -> Iterator[tuple[int, int]]:
    """A master and one sentinel (quorum 1) that knows it: (master port, sentinel port)."""
    server = shutil.which("redis-server")
    if server is None:
        pytest.fail("redis-server is needed for the Sentinel tests")
    master_port, sentinel_port = free_port(), free_port()
    with tempfile.TemporaryDirectory() as d:
        conf = Path(d) / "sentinel.conf"
        conf.write_text(
            f"port {sentinel_port}\nbind 127.0.0.1\ndir {d}\n"
            f"sentinel monitor mymaster 127.0.0.1 {master_port} 1\n"
        )
        master = subprocess.Popen(
            [server, "--port", str(master_port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL,
        )
        sentinel = subprocess.Popen([server, str(conf), "--sentinel"], stdout=subprocess.DEVNULL)
        try:
            wait_ping(redis.Redis(port=master_port))
            wait_ping(redis.Redis(port=sentinel_port))
            yield master_port, sentinel_port
        finally:
            for p in (sentinel, master):
                p.terminate()
                p.wait()


async def runs_once(store: idemkit.Store) -> None:
    coordinator, mailer, key = idemkit.Coordinator(store), Mailer(), unique("order")
    first = await coordinator.call("mail.invoice", key).run(mailer.send_invoice, key)
    again = await coordinator.call("mail.invoice", key).run(mailer.send_invoice, key)
    assert first == again and mailer.sent == [key]


async def test_a_sentinel_url_finds_the_master(group):
    master_port, sentinel_port = group
    prefix = unique("sentinel")
    store = await idemkit.RedisStore.connect(f"redis+sentinel://127.0.0.1:{sentinel_port}/mymaster", prefix=prefix)
    await runs_once(store)
    assert redis.Redis(port=master_port).keys(f"{prefix}:*") != []


async def test_the_drop_in_follows_a_redis_py_sentinel_client(group):
    from redis.asyncio.sentinel import Sentinel

    master_port, sentinel_port = group
    prefix = unique("dropin-sentinel")
    client = Sentinel([("127.0.0.1", sentinel_port)]).master_for("mymaster")
    repo = idemkit.RedisAsyncIdempotencyRepository(client, key_prefix=prefix + ":")
    c, sent = idemkit.AsyncIdempotencyCoordinator(repo, on_storage_error="raise"), []

    async def send() -> dict:
        sent.append(1)
        return {"n": len(sent)}

    for _ in range(2):
        assert await c.coordinate("mail.invoice", "order-9", 60, idemkit.JsonResultAdapter(), send) == {"n": 1}
    assert sent == [1]
    # The records are on the master the sentinel names, not on a default address.
    assert redis.Redis(port=master_port).keys(f"{prefix}:*") != []


async def test_a_master_name_the_sentinel_does_not_know_is_refused(group):
    _, sentinel_port = group
    with pytest.raises(idemkit.StoreError) as refused:
        await idemkit.RedisStore.connect(f"redis+sentinel://127.0.0.1:{sentinel_port}/nosuchmaster")
    assert not isinstance(refused.value, idemkit.StoreUnavailable)
    assert "nosuchmaster" in str(refused.value)
