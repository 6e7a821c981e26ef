"""The Python package's own cost per call, without a server: CPU per hit and per miss on a
MemoryStore at concurrency 64, for the whole process and for the event loop's thread alone
(the rest is the runtime's threads). docs/python.md quotes it.

Usage: python memory_cpu.py [CALLS]   (with the wheel installed)
"""

import asyncio
import itertools
import sys
import time

import idemkit
from drive import timed


async def action(_attempt):
    return 1


async def main(calls):
    coordinator = idemkit.Coordinator(idemkit.MemoryStore())
    fresh = itertools.count()

    async def miss(_):
        await coordinator.call("bench", f"miss-{next(fresh)}", ttl=60).run(action)

    async def hit(_):
        await coordinator.call("bench", "hit", ttl=60).run(action)

    for mode, call in (("miss", miss), ("hit", hit)):
        process, thread = time.process_time(), time.thread_time()
        latencies, elapsed = await timed(64, calls, call)
        process, thread = time.process_time() - process, time.thread_time() - thread
        n = len(latencies)
        print(
            f"{mode}: {n / elapsed:,.0f}/s, {process / n * 1e6:.1f} µs CPU a call "
            f"({thread / n * 1e6:.1f} µs on the event loop's thread)"
        )


asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 60_000))
