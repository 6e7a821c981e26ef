"""The seed's consumer in Python, in one piece: orders.paid from Kafka (aiokafka), the invoice
row and the inbox's claim in one PostgreSQL transaction, then the invoice email under the
order's key with its downstream key, and the offset committed only after.

    IDEMKIT_KAFKA_BROKERS=127.0.0.1:9092 TOPIC=orders.paid python kafka_consumer.py

The email provider here is a table keyed by the downstream key (as Stripe's or a mail API's
Idempotency-Key): an email sent again after a crash, with the same downstream key, is one
email. ``pytests/test_kafka_consumer.py`` kills this process with SIGKILL at each point
(``KILL_AT``: after-commit, after-email, before-offset-commit) and restarts it: one invoice
and one email each time; with ``MUTANT=1`` it runs the seed's trap instead (the email skipped
when the inbox says "duplicate"), which the kill after the commit catches.

Environment: ``IDEMKIT_KAFKA_BROKERS``, ``TOPIC``, ``GROUP``, ``IDEMKIT_POSTGRES_URL``,
``SCHEMA`` (where the invoices, emails and inbox tables live), ``LEASE`` (seconds), and for
the tests ``KILL_AT``, ``KILL_ONCE`` (a file: kill only the first time), ``MUTANT``.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from typing import Any

import psycopg
from aiokafka import AIOKafkaConsumer  # type: ignore[import-untyped]  # aiokafka ships no types

import idemkit
import idemkit.kafka

BROKERS = os.environ.get("IDEMKIT_KAFKA_BROKERS", "127.0.0.1:9092")
TOPIC = os.environ.get("TOPIC", "orders.paid")
GROUP = os.environ.get("GROUP", "billing")
DATABASE_URL = os.environ.get("IDEMKIT_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
SCHEMA = os.environ.get("SCHEMA", "billing")
Order = dict[str, Any]


def maybe_killed(point: str) -> None:
    """The kill tests' crash: SIGKILL at `point`, the first time only."""
    once = os.environ.get("KILL_ONCE", "")
    if os.environ.get("KILL_AT") == point and once and not os.path.exists(once):
        open(once, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)


async def connect() -> psycopg.AsyncConnection[Any]:
    return await psycopg.AsyncConnection.connect(DATABASE_URL)


async def insert_invoice(order: Order, conn: psycopg.AsyncConnection[Any]) -> None:
    await conn.execute(f'INSERT INTO "{SCHEMA}".invoices (order_id) VALUES (%s)', (order["id"],))


async def send_invoice_email(order: Order, attempt: idemkit.Attempt) -> str:
    maybe_killed("after-commit")
    async with await psycopg.AsyncConnection.connect(DATABASE_URL, autocommit=True) as provider:
        await provider.execute(
            f'INSERT INTO "{SCHEMA}".emails (downstream_key, order_id) VALUES (%s, %s) ON CONFLICT DO NOTHING',
            (attempt.downstream_key, order["id"]),
        )
    maybe_killed("after-email")
    return f"em_{order['id']}"


async def billing_handler() -> Any:
    """The tables, the inbox and the coordinator, and the handler of one order: the piece a
    consumer loop calls per message (this file's Kafka loop, or a FastStream subscriber in
    faststream_consumer.py)."""
    async with await psycopg.AsyncConnection.connect(DATABASE_URL, autocommit=True) as conn:
        await conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{SCHEMA}"')
        await conn.execute(f'CREATE TABLE IF NOT EXISTS "{SCHEMA}".invoices (order_id text NOT NULL)')
        await conn.execute(
            f'CREATE TABLE IF NOT EXISTS "{SCHEMA}".emails (downstream_key text PRIMARY KEY, order_id text NOT NULL)'
        )
    inbox = idemkit.Inbox(schema=SCHEMA)
    await inbox.migrate(DATABASE_URL)
    store = await idemkit.PostgresStore.connect(DATABASE_URL)
    coordinator = idemkit.Coordinator(store, lease=float(os.environ.get("LEASE", 15)))

    def key(order: Order) -> str:
        return f"{order['id']}.invoice"  # the effect's name, for the key and the claim

    handle: Any = idemkit.InboxHandler(
        coordinator,
        "invoice.send",
        inbox,
        connect,
        consumer="billing",
        key=key,
        database=insert_invoice,
        external=send_invoice_email,
    )
    if os.environ.get("MUTANT"):

        async def the_seeds_trap(order: Order) -> Any:
            # The email only when the inbox says the message is new: a crash after the
            # commit loses the email for good.
            async def action(attempt: idemkit.Attempt) -> Any:
                async with await connect() as conn, conn.transaction():
                    new = await inbox.claim(conn, "billing", key(order))
                    if new:
                        await insert_invoice(order, conn)
                return await send_invoice_email(order, attempt) if new else None

            return await coordinator.call("invoice.send", key(order)).run(action)

        handle = the_seeds_trap
    return handle


async def main() -> None:
    handle = await billing_handler()
    consumer = AIOKafkaConsumer(
        TOPIC,
        bootstrap_servers=BROKERS,
        group_id=GROUP,
        enable_auto_commit=False,  # the offset is committed by idemkit.kafka.run, after the call
        auto_offset_reset="earliest",
        session_timeout_ms=6000,
        heartbeat_interval_ms=1000,
    )
    await consumer.start()

    async def handled(record: Any, value: Any) -> None:
        maybe_killed("before-offset-commit")
        print(f"handled offset {record.offset}: {value}", flush=True)

    try:
        await idemkit.kafka.run(consumer, handle, decode=json.loads, on_handled=handled)
    finally:
        await consumer.stop()


if __name__ == "__main__":
    asyncio.run(main())
