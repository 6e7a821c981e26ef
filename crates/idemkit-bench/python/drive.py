"""What both Python scripts of idemkit-bench share: the asyncio driver and its JSON line, so
the peer and the package are measured the same way."""

import asyncio
import json
import time


async def timed(concurrency, ops, call):
    """Runs `call(i)` for `ops` values of i over `concurrency` tasks; the sorted latencies and the elapsed time."""
    per_task = -(-ops // concurrency)
    latencies = []

    async def task(t):
        for i in range(per_task):
            started = time.perf_counter()
            await call(t * per_task + i)
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(task(t) for t in range(concurrency)))
    elapsed = time.perf_counter() - started
    latencies.sort()
    return latencies, elapsed


def report(mode, concurrency, latencies, elapsed):
    """The one JSON line idemkit-bench reads."""
    print(
        json.dumps(
            {
                "mode": mode,
                "concurrency": concurrency,
                "calls": len(latencies),
                "ops_per_sec": len(latencies) / elapsed,
                "p50_us": latencies[len(latencies) // 2] * 1e6,
                "p99_us": latencies[len(latencies) * 99 // 100] * 1e6,
            }
        ),
        flush=True,
    )
