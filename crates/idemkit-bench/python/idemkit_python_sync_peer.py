"""The Python package idemkit's blocking API in idemkit-bench: `Call.run_sync` from
`concurrency` threads (a Celery or RQ worker's way), on the same Redis, the same calls and
the same JSON line as the asyncio scripts (idempotency-kit has no blocking API: its row is
the asyncio one).

Usage: python idemkit_python_sync_peer.py REDIS_URL PREFIX warm|hit|miss CONCURRENCY OPS
"""

import itertools
import os
import sys
import threading
import time

import idemkit
from drive import report


def action(_attempt):
    return 1


def main():
    url, prefix, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    concurrency, ops = int(sys.argv[4]), int(sys.argv[5])
    coordinator = idemkit.Coordinator(idemkit.RedisStore.connect_sync(url, prefix=prefix.rstrip(":")))
    run = os.urandom(6).hex()
    fresh = itertools.count()  # next() on a count is atomic under the GIL

    def hit():
        coordinator.call("bench", "hit", ttl=60).run_sync(action)

    def miss():
        coordinator.call("bench", f"miss-{run}-{next(fresh)}", ttl=60).run_sync(action)

    if mode == "warm":
        hit()
        return
    call = {"hit": hit, "miss": miss}[mode]
    per_thread = -(-ops // concurrency)
    latencies = []  # list.append is atomic under the GIL

    def worker():
        for _ in range(per_thread):
            started = time.perf_counter()
            call()
            latencies.append(time.perf_counter() - started)

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    latencies.sort()
    report(mode, concurrency, latencies, elapsed)


main()
