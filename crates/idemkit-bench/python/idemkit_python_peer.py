"""The Python package idemkit in idemkit-bench, driven exactly as idempotency_kit_peer.py
drives idempotency-kit 0.5.0: the same Redis, the same calls, the same JSON line.

Run by `idemkit-bench --python PY` with an interpreter whose environment has both packages
(scripts/bench installs the wheel it builds, scripts/python wheel, beside idempotency-kit).
A hit replays one completed key, a miss reserves a fresh key, runs a trivial action and
stores its result; `concurrency` asyncio tasks share the calls. The idemkit native API
(`Coordinator.call(...).run`) is measured; the drop-in's `coordinate` adds one Python call.

Usage: python idemkit_python_peer.py REDIS_URL PREFIX warm|hit|miss CONCURRENCY OPS
"""

import asyncio
import itertools
import os
import sys

import idemkit
from drive import report, timed


async def action(_attempt):
    return 1


async def main():
    url, prefix, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    concurrency, ops = int(sys.argv[4]), int(sys.argv[5])
    store = await idemkit.RedisStore.connect(url, prefix=prefix.rstrip(":"))
    coordinator = idemkit.Coordinator(store)
    run = os.urandom(6).hex()
    fresh = itertools.count()

    async def hit(_):
        await coordinator.call("bench", "hit", ttl=60).run(action)

    async def miss(_):
        await coordinator.call("bench", f"miss-{run}-{next(fresh)}", ttl=60).run(action)

    if mode == "warm":
        await hit(0)
        return
    latencies, elapsed = await timed(concurrency, ops, {"hit": hit, "miss": miss}[mode])
    report(mode, concurrency, latencies, elapsed)


asyncio.run(main())
