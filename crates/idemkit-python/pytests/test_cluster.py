"""Redis Cluster from Python: a three-master cluster of the test's own, from redis-server."""

import asyncio
import socket
import subprocess
import time

import pytest
from conftest import Mailer, unique

import idemkit


def free_port() -> int:
    """A free loopback port whose cluster-bus port (+10000) exists and is free too."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port > 55000:
            continue
        with socket.socket() as bus:
            try:
                bus.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    ports, servers = [free_port() for _ in range(3)], []
    try:
        for port in ports:
            d = tmp_path_factory.mktemp(f"node-{port}")
            servers.append(
                subprocess.Popen(
                    ["redis-server", "--port", str(port), "--cluster-enabled", "yes", "--save", "",
                     "--appendonly", "no", "--dir", str(d), "--cluster-config-file", str(d / "nodes.conf")],
                    stdout=subprocess.DEVNULL,
                )
            )
        for port in ports:
            for _ in range(100):
                if subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True, text=True).stdout.strip() == "PONG":
                    break
                time.sleep(0.05)
        created = subprocess.run(
            ["redis-cli", "--cluster", "create", *[f"127.0.0.1:{p}" for p in ports], "--cluster-replicas", "0", "--cluster-yes"],
            capture_output=True,
            text=True,
        )
        assert created.returncode == 0, f"redis-cli --cluster create: {created.stdout}{created.stderr}"
        for _ in range(200):
            info = subprocess.run(["redis-cli", "-p", str(ports[0]), "cluster", "info"], capture_output=True, text=True).stdout
            if "cluster_state:ok" in info:
                break
            time.sleep(0.05)
        yield [f"redis://127.0.0.1:{p}" for p in ports]
    finally:
        for server in servers:
            server.kill()
            server.wait()


def test_a_cluster_port_leaves_room_for_its_bus_port():
    # Each node also listens on port + 10000 (the cluster bus); a port above 55535 has no
    # bus port and the node cannot join (CI's failure of stop 32).
    for _ in range(300):
        port = free_port()
        assert port + 10000 <= 65535, port
        with socket.socket() as s:
            s.bind(("127.0.0.1", port + 10000))


async def test_a_cluster_runs_each_key_once_and_wakes_its_waiters(cluster):
    store = await idemkit.RedisStore.connect_cluster(cluster, prefix=unique("pytest"))
    coordinator = idemkit.Coordinator(store)
    mailer = Mailer(delay=0.2)
    # Keys on every master: each is one effect, its duplicates wait for it.
    keys = [unique(f"order-{i}.invoice") for i in range(12)]
    results = await asyncio.gather(
        *(coordinator.call("mail.invoice", k).run(mailer.send_invoice, i) for i, k in enumerate(keys) for _ in range(3))
    )
    assert sorted(mailer.sent) == list(range(12))
    for i in range(12):
        assert len(set(results[3 * i : 3 * i + 3])) == 1
    replays = await asyncio.gather(*(coordinator.call("mail.invoice", k).run(mailer.send_invoice, 99) for k in keys))
    assert replays == results[::3]
    assert len(mailer.sent) == 12


def test_the_blocking_api_on_a_cluster(cluster):
    # connect_cluster_sync and run_sync from threads: keys on every master, one effect each.
    import threading

    coordinator = idemkit.Coordinator(idemkit.RedisStore.connect_cluster_sync(cluster, prefix=unique("pytest-sync")))
    sent: list[int] = []

    def send(attempt: idemkit.Attempt, i: int) -> str:
        sent.append(i)
        time.sleep(0.1)
        return f"em_{i}"

    keys = [unique(f"order-{i}.invoice") for i in range(6)]
    results: dict[int, list[str]] = {i: [] for i in range(6)}

    def worker(i: int) -> None:
        results[i].append(coordinator.call("mail.invoice", keys[i]).run_sync(send, i))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(sent) == list(range(6))
    assert all(results[i] == [f"em_{i}"] * 2 for i in range(6))
