"""The Python peer of idemkit-bench: idempotency-kit 0.5.0 on the same Redis.

Run by `idemkit-bench --python PY` with the interpreter of a throwaway virtual environment
that has `idempotency-kit[redis]==0.5.0` (scripts/bench makes it). It drives the library
through its public API (`AsyncIdempotencyCoordinator.coordinate` on its
`RedisAsyncIdempotencyRepository`, in-flight mode "wait", the default) exactly as
idemkit-bench drives idemkit: a hit replays one completed key, a miss reserves a fresh key,
runs a trivial action and stores its result; `concurrency` asyncio tasks share the calls.
It prints one JSON object on stdout.

Usage: python idempotency_kit_peer.py REDIS_URL PREFIX warm|hit|miss|store CONCURRENCY OPS
(warm stores the key the hits replay; store completes OPS keys with a 100-byte result)
"""

import asyncio
import itertools
import os
import sys

from drive import report, timed
import redis.asyncio as aioredis
from idempotency_kit import (
    AsyncIdempotencyCoordinator,
    IdempotencyDomainService,
    JsonResultAdapter,
)
from idempotency_kit.infra.storage.redis.aio.repository import (
    RedisAsyncIdempotencyRepository,
)


async def action():
    return 1


async def main():
    url, prefix, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    concurrency, ops = int(sys.argv[4]), int(sys.argv[5])
    client = aioredis.from_url(url, max_connections=concurrency + 4)
    repository = RedisAsyncIdempotencyRepository(client, key_prefix=prefix)
    coordinator = AsyncIdempotencyCoordinator(repository, IdempotencyDomainService())
    adapter = JsonResultAdapter()
    ttl = 60
    run = os.urandom(6).hex()
    fresh = itertools.count()

    async def hit(_):
        await coordinator.coordinate("bench", "hit", ttl, adapter, action)

    async def miss(_):
        await coordinator.coordinate("bench", f"miss-{run}-{next(fresh)}", ttl, adapter, action)

    async def result_100_bytes():
        return "r" * 100

    async def store(i):
        await coordinator.coordinate("mail.invoice", f"order-{i:06}", ttl, adapter, result_100_bytes)

    if mode == "warm":
        await hit(0)
    else:
        latencies, elapsed = await timed(concurrency, ops, {"hit": hit, "miss": miss, "store": store}[mode])
        report(mode, concurrency, latencies, elapsed)
    await client.aclose()


asyncio.run(main())
