"""The seed article's experiment, on the Python package: its three tables.

This is the article's code as written for idempotency-kit (an in-process at-least-once
queue, a mailer, ``coordinator.coordinate(...)`` on Redis) with only its two imports
changed, from ``idempotency_kit`` to ``idemkit``. Run it with ``scripts/python seed`` (or
``python examples/seed.py [REDIS_URL]`` where the wheel is installed).

The third table's middle row is where the two libraries differ: idempotency-kit refuses a
key with ':' and runs the action unprotected (two mails); idemkit stores it (one mail).
"""

import asyncio
import os
import sys
import uuid
from collections.abc import Awaitable, Callable
from typing import Literal

from redis.asyncio import Redis

import idemkit as ik  # the seed: import idempotency_kit as ik
from idemkit.infra.storage.redis.aio.repository import RedisAsyncIdempotencyRepository  # the seed: idempotency_kit.infra...

REDIS_URL = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("IDEMKIT_REDIS_URL", "redis://127.0.0.1:6379")
RUN = uuid.uuid4().hex[:8]

Job = dict[str, str]
InFlight = Literal["wait", "raise", "run"]


class Mailer:
    def __init__(self, delay: float = 0.0) -> None:
        self.sent = 0
        self.delay = delay

    async def send_invoice(self, order_id: str) -> str:
        self.sent += 1
        receipt = f"em_{self.sent}"
        await asyncio.sleep(self.delay)
        return receipt


class Crash(Exception):
    """The worker dies between the effect and the ack."""


class Queue:
    """At least once: a job stays deliverable until it is acked."""

    def __init__(self, jobs: list[Job]) -> None:
        self.pending = list(jobs)
        self.deliveries = 0

    async def drain(self, handle: Callable[[Job], Awaitable[None]], crash_first: bool = False) -> None:
        crashed = False
        while self.pending:
            job = self.pending[0]
            self.deliveries += 1
            try:
                await handle(job)
                if crash_first and not crashed:
                    crashed = True
                    raise Crash
            except Crash:
                continue  # not acked: delivered again
            self.pending.pop(0)  # ack


def coordinator_on(redis: Redis, in_flight: InFlight = "wait") -> "ik.AsyncIdempotencyCoordinator":
    repository = RedisAsyncIdempotencyRepository(redis, key_prefix=f"seed-{RUN}-{uuid.uuid4().hex[:6]}:")
    return ik.AsyncIdempotencyCoordinator(repository, ik.IdempotencyDomainService(), in_flight=in_flight)


async def crash_before_ack(redis: Redis) -> None:
    print("Experiment 1: crash before the ack")
    job = {"job_id": "job-1", "order_id": "order-9"}

    mailer = Mailer()
    queue = Queue([job])

    async def plain(job: Job) -> None:
        await mailer.send_invoice(job["order_id"])

    await queue.drain(plain, crash_first=True)
    print(f"{'plain handler':<45}deliveries={queue.deliveries}  mails sent={mailer.sent}")

    mailer, queue = Mailer(), Queue([job])
    coordinator = coordinator_on(redis)
    adapter = ik.JsonResultAdapter()

    async def handle(job: Job) -> None:
        await coordinator.coordinate("mail.invoice", job["job_id"], 3600, adapter, mailer.send_invoice, job["order_id"])

    await queue.drain(handle, crash_first=True)
    print(f"{'handler under an idempotency key = job id':<45}deliveries={queue.deliveries}  mails sent={mailer.sent}")


async def two_workers(redis: Redis) -> None:
    print("\nExperiment 2: two workers, one job")
    job = {"job_id": "job-2", "order_id": "order-9"}
    modes: tuple[InFlight, ...] = ("wait", "raise")
    for mode in modes:
        mailer = Mailer(delay=0.3)
        coordinator = coordinator_on(redis, in_flight=mode)
        adapter = ik.JsonResultAdapter()
        results: dict[str, str] = {}

        async def worker(name: str, start_after: float) -> None:
            await asyncio.sleep(start_after)  # B gets the job when A's visibility timeout ran out
            try:
                results[name] = await coordinator.coordinate(
                    "mail.invoice", job["job_id"], 3600, adapter, mailer.send_invoice, job["order_id"]
                )
            except ik.IdempotencyInProgressError:
                results[name] = "in progress, requeue"

        await asyncio.gather(worker("A", 0.0), worker("B", 0.1))
        label = f"in_flight={mode!r}"
        print(f"{label:<21}{str(dict(sorted(results.items()))):<45}mails sent={mailer.sent}")


async def what_the_key_is_made_of(redis: Redis) -> None:
    print("\nExperiment 3: what the key is made of")
    jobs = [{"job_id": "job-3", "order_id": "order-9"}, {"job_id": "job-4", "order_id": "order-9"}]
    rows: list[tuple[str, Callable[[Job], str], str | None]] = [
        ("key = job id: two jobs for order-9", lambda job: job["job_id"], "(the key must be the effect's identity, not the delivery's)"),
        ("key = 'order-9:invoice': the same two jobs", lambda job: f"{job['order_id']}:invoice", None),
        ("key = 'order-9.invoice': the same two jobs", lambda job: f"{job['order_id']}.invoice", ""),
    ]
    for label, key_of, note in rows:
        mailer = Mailer()
        coordinator = coordinator_on(redis)
        adapter = ik.JsonResultAdapter()
        unprotected = False

        async def handle(job: Job) -> None:
            nonlocal unprotected
            try:
                await coordinator.coordinate("mail.invoice", key_of(job), 86400, adapter, mailer.send_invoice, job["order_id"])
            except ik.IdempotencyValidationError:
                unprotected = True  # the seed: the record fails validation and the action runs unprotected
                await mailer.send_invoice(job["order_id"])

        await Queue(list(jobs)).drain(handle)
        if note is None:
            note = (
                "(a colon is not allowed in a key; the record fails validation and the action runs unprotected)"
                if unprotected
                else "(':' is an ordinary key character: protected)"
            )
        print(f"{label:<45}-> mails sent={mailer.sent}   {note}".rstrip())


async def main() -> None:
    redis = Redis.from_url(REDIS_URL)
    await crash_before_ack(redis)
    await two_workers(redis)
    await what_the_key_is_made_of(redis)
    await redis.aclose()


asyncio.run(main())
