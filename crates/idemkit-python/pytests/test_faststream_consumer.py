"""The seed's consumer on FastStream and RabbitMQ, killed at each point:
examples/faststream_consumer.py as a real process on the machine's RabbitMQ and PostgreSQL,
SIGKILL after the commit, after the email and before the ack, then a second process:
(invoices, emails) = (1, 1) each time, and the message acked (the queue empty). The seed's
trap (the email skipped when the inbox says duplicate) is caught: (1, 0)."""

import asyncio
import os
import pathlib
import subprocess
import sys
import time

import psycopg
import pytest
from conftest import POSTGRES_URL, _require, unique
from test_kafka_consumer import counts

EXAMPLE = pathlib.Path(__file__).resolve().parents[1] / "examples" / "faststream_consumer.py"
AMQP_URL = os.environ.get("IDEMKIT_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")

if not os.environ.get("CI"):
    pytest.importorskip("faststream")


async def publish(queue: str, order: dict) -> None:
    import aio_pika

    try:
        connection = await aio_pika.connect(AMQP_URL)
    except OSError as e:
        _require(f"RabbitMQ at {AMQP_URL}", e)
    async with connection:
        channel = await connection.channel()
        await channel.declare_queue(queue, durable=True)  # as FastStream declares it
        await channel.default_exchange.publish(aio_pika.Message(body=__import__("json").dumps(order).encode(), content_type="application/json"), routing_key=queue)


async def ready(queue: str) -> int:
    import aio_pika

    async with await aio_pika.connect(AMQP_URL) as connection:
        channel = await connection.channel()
        declared = await channel.declare_queue(queue, passive=True)
        count = declared.declaration_result.message_count
        await declared.delete(if_unused=False, if_empty=False)
        return count


def killed_then_restarted(kill_at: str, mutant: bool = False) -> tuple[int, int, int]:
    queue, schema, order = unique("orders.paid"), unique("billing").replace("-", "_"), {"id": unique("order")}
    once = f"/tmp/{unique('kill-once')}"
    env = {
        **os.environ,
        "IDEMKIT_AMQP_URL": AMQP_URL,
        "IDEMKIT_POSTGRES_URL": POSTGRES_URL,
        "QUEUE": queue,
        "SCHEMA": schema,
        "LEASE": "1",
        "KILL_AT": kill_at,
        "KILL_ONCE": once,
        **({"MUTANT": "1"} if mutant else {}),
    }
    asyncio.run(publish(queue, order))
    first = subprocess.run([sys.executable, str(EXAMPLE)], env=env, capture_output=True, text=True, timeout=120)
    assert first.returncode == -9, f"the first consumer was not killed at {kill_at}:\n{first.stdout}{first.stderr}"
    second = subprocess.Popen([sys.executable, str(EXAMPLE)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert second.stdout is not None
        deadline = time.monotonic() + 90
        line = ""
        while time.monotonic() < deadline and not line.startswith("handled"):
            assert second.poll() is None, second.stderr.read() if second.stderr else ""
            line = second.stdout.readline()
        assert line.startswith("handled"), "the redelivered order was not handled"
        time.sleep(0.5)  # the ack follows the subscriber's return
    finally:
        second.terminate()
        second.wait(timeout=30)
    try:
        os.unlink(once)
    except FileNotFoundError:
        pass
    return (*counts(schema, order["id"]), asyncio.run(ready(queue)))


@pytest.mark.parametrize("kill_at", ["after-commit", "after-email", "before-ack"])
def test_killed_at_each_point_one_invoice_and_one_email(kill_at):
    try:
        psycopg.connect(POSTGRES_URL).close()
    except psycopg.OperationalError as e:
        _require(f"postgres at {POSTGRES_URL}", e)
    assert killed_then_restarted(kill_at) == (1, 1, 0)


def test_the_seeds_trap_is_caught():
    assert killed_then_restarted("after-commit", mutant=True) == (1, 0, 0)
