"""A Dramatiq actor that mails each invoice once, however often its message is delivered.

    dramatiq dramatiq_worker                # from this folder: worker processes with threads
    python -c 'import dramatiq_worker; dramatiq_worker.send_invoice.send("order-9")'

Dramatiq acks a message after the actor returns, and retries a failed one: both deliver it
again. ``pytests/test_rq_dramatiq.py`` sends one order three times: one mail.

Environment: ``IDEMKIT_REDIS_URL`` (the broker's Redis and the keys'), ``IDEMKIT_PREFIX``,
``DRAMATIQ_QUEUE``.
"""

from __future__ import annotations

import os

import dramatiq
import redis
from dramatiq.brokers.redis import RedisBroker

import idemkit

REDIS_URL = os.environ.get("IDEMKIT_REDIS_URL", "redis://127.0.0.1:6379")
PREFIX = os.environ.get("IDEMKIT_PREFIX", "idemkit")

dramatiq.set_broker(RedisBroker(url=REDIS_URL))  # type: ignore[no-untyped-call]  # untyped in dramatiq

# Dramatiq forks its worker processes: one coordinator per process, made in it.
coordinator = idemkit.per_process(
    lambda: idemkit.Coordinator(idemkit.RedisStore.connect_sync(REDIS_URL, prefix=PREFIX))
)


mailbox = redis.Redis.from_url(REDIS_URL)  # the mail provider: a list of the mails it sent


@idemkit.idempotent("mail.invoice", key=lambda order_id: f"{order_id}.invoice", coordinator=coordinator)
def mail_invoice(attempt: idemkit.Attempt, order_id: str) -> str:
    n = mailbox.rpush(f"{PREFIX}:mails", f"{order_id} {attempt.downstream_key}")
    return f"em_{n}"


@dramatiq.actor(queue_name=os.environ.get("DRAMATIQ_QUEUE", "invoices"))
def send_invoice(order_id: str) -> None:
    mailbox.rpush(f"{PREFIX}:receipts", mail_invoice(order_id))
