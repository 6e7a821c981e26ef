"""A Kafka consumer loop (aiokafka) that acknowledges a message only once it is handled.

``await idemkit.kafka.run(consumer, handle, decode=json.loads)`` takes messages in order from
an ``aiokafka.AIOKafkaConsumer`` made with ``enable_auto_commit=False``, awaits
``handle(decode(record.value))`` (an ``idemkit.InboxHandler``, or any coroutine function that
runs its effects under idemkit keys), then commits the offset after the message. A message
whose handler raises is retried in place (``retries`` times, ``backoff`` seconds apart), then
the exception is raised: nothing after it is committed, so the group's next consumer starts
from it. A process killed anywhere redelivers from the last committed offset; the keys make
the redelivery replay what was already done.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any


async def run(
    consumer: Any,
    handle: Callable[[Any], Awaitable[Any]],
    *,
    decode: Callable[[bytes], Any] = lambda value: value,
    retries: int = 3,
    backoff: float = 0.5,
    on_handled: Callable[[Any, Any], Awaitable[None]] | None = None,
    stop: asyncio.Event | None = None,
) -> None:
    """Consumes until ``stop`` is set (or for ever). ``on_handled(record, value)``, if given,
    runs after a message's handler returned and before its offset is committed (logging,
    metrics; the kill tests stop the process there)."""
    from aiokafka import TopicPartition  # type: ignore[import-untyped]  # only this module needs it

    while stop is None or not stop.is_set():
        batches = await consumer.getmany(timeout_ms=200)
        for tp, records in batches.items():
            for record in records:
                value = await _handled(handle, decode(record.value), retries, backoff)
                if on_handled is not None:
                    await on_handled(record, value)
                await consumer.commit({TopicPartition(tp.topic, tp.partition): record.offset + 1})


async def _handled(handle: Callable[[Any], Awaitable[Any]], message: Any, retries: int, backoff: float) -> Any:
    for attempt in range(retries + 1):
        try:
            return await handle(message)
        except Exception:
            if attempt == retries:
                raise
            await asyncio.sleep(backoff * (attempt + 1))
    raise AssertionError("unreachable")


__all__ = ["run"]
