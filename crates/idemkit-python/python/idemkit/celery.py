"""Celery tasks that wait out a store outage instead of losing their message.

A task whose idempotent call raises ``StoreUnavailable`` (the store is down: fail-closed, the
action did not run) or ``InProgress`` (another worker holds the key: ``in_flight="reject"``)
has done nothing. Raised out of the task, Celery records a failure and acks the message even
with ``task_acks_late``: the invoice is never sent. Retried, it is sent once the store is
back (or the other worker finished: the retry replays its result)::

    import idemkit.celery

    @app.task(name="invoices.send", **idemkit.celery.task_options())
    def send_invoice(order_id: str) -> str:
        return mail_invoice(order_id)

``task_options`` is Celery's own ``autoretry_for`` with exponential backoff and jitter: the
retry is a new message published before the old one is acked, so a worker that dies between
the two leaves at least one of them on the queue, and the key makes any extra one replay.
Failures of the action itself are not retried by it (the key was released: configure
Celery's retries for them as you would without idemkit).
"""

from __future__ import annotations

from typing import Any

from ._errors import InProgress, StoreUnavailable

#: What a task may retry: nothing ran, nothing is lost by running the task again later.
RETRY_ON: tuple[type[BaseException], ...] = (StoreUnavailable, InProgress)


def task_options(*, max_backoff: int = 60, max_retries: int | None = None) -> dict[str, Any]:
    """Options for ``@app.task(**task_options())``: retry on ``RETRY_ON`` with backoff (1 s,
    2 s, 4 s … up to ``max_backoff`` seconds, jittered), ``max_retries`` times (``None``:
    until the store is back; Celery's default would give up after 3)."""
    return {
        "autoretry_for": RETRY_ON,
        "retry_backoff": True,
        "retry_backoff_max": max_backoff,
        "retry_jitter": True,
        "max_retries": max_retries,
    }


__all__ = ["RETRY_ON", "task_options"]
