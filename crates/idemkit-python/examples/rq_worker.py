"""An RQ job that mails each invoice once, however often it is enqueued or run again.

    rq worker invoices                      # from this folder; each job runs in a forked process
    python -c 'import redis, rq, rq_worker; rq.Queue("invoices", connection=redis.Redis()).enqueue(rq_worker.send_invoice, "order-9")'

RQ forks a work horse for every job: the coordinator is made in the process that runs the
job (`idemkit.per_process`), never in the worker before the fork.
``pytests/test_rq_dramatiq.py`` enqueues one order three times: one mail, three receipts.

Environment: ``IDEMKIT_REDIS_URL`` (the queue's Redis and the keys'), ``IDEMKIT_PREFIX``.
"""

from __future__ import annotations

import os

import redis

import idemkit

REDIS_URL = os.environ.get("IDEMKIT_REDIS_URL", "redis://127.0.0.1:6379")
PREFIX = os.environ.get("IDEMKIT_PREFIX", "idemkit")

# RQ forks a work horse per job: one coordinator per process, made in it.
coordinator = idemkit.per_process(
    lambda: idemkit.Coordinator(idemkit.RedisStore.connect_sync(REDIS_URL, prefix=PREFIX))
)


mailbox = redis.Redis.from_url(REDIS_URL)  # the mail provider: a list of the mails it sent


@idemkit.idempotent("mail.invoice", key=lambda order_id: f"{order_id}.invoice", coordinator=coordinator)
def send_invoice(attempt: idemkit.Attempt, order_id: str) -> str:
    """The job: ``queue.enqueue(send_invoice, "order-9")``."""
    n = mailbox.rpush(f"{PREFIX}:mails", f"{order_id} {attempt.downstream_key}")
    return f"em_{n}"
