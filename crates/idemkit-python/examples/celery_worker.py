"""A Celery worker whose task sends each invoice once, however often the broker delivers it.

    celery -A celery_worker worker -Q invoices           # RabbitMQ on 127.0.0.1:5672 (guest)
    python -c 'import celery_worker; celery_worker.send_invoice.delay("order-9")'

With ``task_acks_late`` the message is acked after the task returns, so a worker that dies
mid-task (killed, out of memory, a deploy) gets its message delivered again; the key
(``order-9.invoice``, the effect's name, not the task id) makes the second run replay the
first one's receipt instead of mailing again. ``pytests/test_celery.py`` kills a worker
with SIGKILL between the mail and the ack, and races two workers on one redelivered task.

A store outage does not lose the task: ``idemkit.celery.task_options()`` retries it with
backoff on ``StoreUnavailable`` (nothing ran) until Redis is back, and the mail goes out
once then (``pytests/test_celery.py`` stops Redis under a running worker).

Environment: ``CELERY_BROKER_URL`` (default RabbitMQ on 127.0.0.1), ``IDEMKIT_REDIS_URL``
(where the keys live), ``MAILBOX_URL`` (the mail provider's Redis, default
``IDEMKIT_REDIS_URL``), ``INVOICE_QUEUE``, ``IDEMKIT_PREFIX``, ``VISIBILITY_TIMEOUT`` (seconds;
a Redis broker's redelivery of an unacked task), and, for the tests only, ``MAIL_DELAY``
(seconds the mail takes) and ``PAUSE_AFTER_MAIL`` (seconds between the mail and the return).
"""

from __future__ import annotations

import os
import time

import redis
from celery import Celery  # type: ignore[import-untyped]  # Celery ships no types

import idemkit
import idemkit.celery

BROKER = os.environ.get("CELERY_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672//")
REDIS_URL = os.environ.get("IDEMKIT_REDIS_URL", "redis://127.0.0.1:6379")
QUEUE = os.environ.get("INVOICE_QUEUE", "invoices")
PREFIX = os.environ.get("IDEMKIT_PREFIX", "idemkit")

app = Celery("celery_worker", broker=BROKER)
app.conf.update(
    task_acks_late=True,  # ack when the task returns: a worker that dies never acks
    task_reject_on_worker_lost=True,  # a pool process killed mid-task: requeue, not ack
    worker_prefetch_multiplier=1,
    task_default_queue=QUEUE,
    broker_connection_retry_on_startup=True,
)
if "VISIBILITY_TIMEOUT" in os.environ:  # a Redis broker: how soon an unacked task comes back
    app.conf.broker_transport_options = {
        "visibility_timeout": float(os.environ["VISIBILITY_TIMEOUT"]),
        # kombu looks for overdue tasks every interval × throttle seconds (100 by default)
        "unacked_restore_interval": 1,
        "unacked_restore_throttle": 1,
    }

# One coordinator per worker process, made in that process: Celery's prefork pool forks its
# workers, and a store connected before a fork stays the parent's.
coordinator = idemkit.per_process(
    lambda: idemkit.Coordinator(idemkit.RedisStore.connect_sync(REDIS_URL, prefix=PREFIX))
)


# The mail provider: a Redis list of the mails it sent (what a duplicate would repeat).
mailbox = redis.Redis.from_url(os.environ.get("MAILBOX_URL", REDIS_URL))


@idemkit.idempotent("mail.invoice", key=lambda order_id: f"{order_id}.invoice", coordinator=coordinator)
def mail_invoice(attempt: idemkit.Attempt, order_id: str) -> str:
    # A real provider takes attempt.downstream_key as its own Idempotency-Key.
    time.sleep(float(os.environ.get("MAIL_DELAY", 0)))
    n = mailbox.rpush(f"{PREFIX}:mails", f"{order_id} {attempt.downstream_key}")
    return f"em_{n}"


# Retried with backoff while the store is down (or another worker holds the key), instead of
# failing and being acked: the invoice goes out once the store is back.
@app.task(name="invoices.send", **idemkit.celery.task_options(max_backoff=5))  # type: ignore[untyped-decorator]
def send_invoice(order_id: str) -> str:
    receipt = mail_invoice(order_id)
    mailbox.rpush(f"{PREFIX}:after-mail", os.getpid())
    time.sleep(float(os.environ.get("PAUSE_AFTER_MAIL", 0)))
    mailbox.rpush(f"{PREFIX}:returned", receipt)
    return receipt
