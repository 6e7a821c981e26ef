"""A FastAPI service whose POST /payments charges once per Idempotency-Key, however often the
client retries (a timeout, a dropped connection, a user who clicks twice).

    uvicorn fastapi_app:app                    # MemoryStore; IDEMKIT_REDIS_URL for Redis
    curl -X POST localhost:8000/payments -H 'x-tenant: acme' \\
         -H 'idempotency-key: "order-9"' -H 'content-type: application/json' -d '{"amount": 10}'

The second identical request gets the first one's response byte for byte, marked
``Idempotent-Replayed: true``; the same key with another body gets ``422``; a concurrent one
waits for the first. ``pytests/test_asgi.py`` serves this app with uvicorn and checks it.
"""

from __future__ import annotations

import itertools
import os

from fastapi import FastAPI

import idemkit
from idemkit.asgi import IdempotencyMiddleware, Scope

charges = itertools.count(1)


def tenant(scope: Scope) -> str | None:
    """The caller, as an auth layer in front has checked it (here a header)."""
    return dict(scope["headers"]).get(b"x-tenant", b"").decode() or None


def store() -> idemkit.Store:
    url = os.environ.get("IDEMKIT_REDIS_URL")
    return idemkit.RedisStore.connect_sync(url) if url else idemkit.MemoryStore()


app = FastAPI()
app.add_middleware(
    IdempotencyMiddleware,
    coordinator=idemkit.Coordinator(store()),
    operation="http.payments",
    scope_by=tenant,
)


@app.post("/payments", status_code=201)
async def pay(order: dict[str, int]) -> dict[str, object]:
    return {"charge": f"ch_{next(charges)}", "amount": order["amount"]}
