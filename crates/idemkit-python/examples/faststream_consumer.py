"""The seed's consumer on FastStream and RabbitMQ: the same piece as kafka_consumer.py
(``idemkit.InboxHandler``: the invoice row and the inbox's claim in one PostgreSQL transaction,
then the email under the order's key with its downstream key), called from a FastStream
subscriber, which acknowledges the message only after the handler returned.

    QUEUE=orders.paid faststream run faststream_consumer:app    # or: python faststream_consumer.py

No second design: a subscriber awaits the handler, and FastStream's default acknowledgement
(after the subscriber returns; a raised error requeues) is the order the seed needs.
``pytests/test_faststream_consumer.py`` kills this process with SIGKILL after the commit,
after the email and before the ack (``KILL_AT``), and starts another: one invoice, one email.

Environment: ``IDEMKIT_AMQP_URL`` (RabbitMQ, default guest on 127.0.0.1), ``QUEUE``, and
kafka_consumer.py's ``IDEMKIT_POSTGRES_URL``, ``SCHEMA``, ``LEASE``, ``KILL_AT``, ``KILL_ONCE``.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from faststream import FastStream
from faststream.rabbit import RabbitBroker

from kafka_consumer import billing_handler, maybe_killed

broker = RabbitBroker(os.environ.get("IDEMKIT_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"))
app = FastStream(broker)
handle: Any = None


@app.on_startup
async def connect() -> None:
    global handle
    handle = await billing_handler()


@broker.subscriber(os.environ.get("QUEUE", "orders.paid"))
async def on_order(order: dict[str, Any]) -> None:
    receipt = await handle(order)
    maybe_killed("before-ack")
    print(f"handled {order['id']}: {receipt}", flush=True)


if __name__ == "__main__":
    asyncio.run(app.run())
