"""The Python side of the cross-language tests: the same call as examples/interop_worker.rs.

    python interop_worker.py STORE_URL PREFIX_OR_TABLE KEY EFFECTS_FILE NAME SLEEP_MS [START_AT_UNIX_MS]
"""

import asyncio
import json
import sys
import time

import idemkit


async def main() -> None:
    url, namespace, key, effects, name, sleep_ms, *rest = sys.argv[1:]
    if url.startswith("postgres"):
        store = await idemkit.PostgresStore.connect(url, table=namespace)
    else:
        store = await idemkit.RedisStore.connect(url, prefix=namespace)
    coordinator = idemkit.Coordinator(store)
    if rest:
        await asyncio.sleep(max(0.0, int(rest[0]) / 1000 - time.time()))
    ran = []

    async def effect(_attempt):
        ran.append(1)
        with open(effects, "a") as f:
            f.write(f"{name}\n")
        await asyncio.sleep(int(sleep_ms) / 1000)
        return f"{name}-receipt"

    value = await coordinator.call("interop.effect", key, ttl=600).run(effect)
    print(json.dumps({"value": value, "replayed": not ran}))


asyncio.run(main())
