"""The ASGI case's server: a FastAPI app on uvicorn, with or without idemkit's middleware
(keys on Redis), printing its port; the Rust bench (`--asgi`) drives it as it drives axum.

    python asgi_app.py plain|protected REDIS_URL
"""

import asyncio
import socket
import sys

import uvicorn
from fastapi import FastAPI, Response

import idemkit
from idemkit.asgi import IdempotencyMiddleware


async def main(kind: str, redis_url: str) -> None:
    app = FastAPI()

    @app.post("/payments")
    async def pay() -> Response:
        return Response(b'{"id":"ch_1"}', status_code=201, media_type="application/json")

    if kind == "protected":
        store = await idemkit.RedisStore.connect(redis_url, prefix=f"idemkit-bench-asgi-{socket.gethostname()}")
        app.add_middleware(
            IdempotencyMiddleware,
            coordinator=idemkit.Coordinator(store),
            operation="bench.http",
            global_scope="bench",
        )
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    print(sock.getsockname()[1], flush=True)
    config = uvicorn.Config(app, lifespan="off", log_level="warning", access_log=False)
    await uvicorn.Server(config).serve(sockets=[sock])


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
