"""The ASGI middleware over a real server (uvicorn) with a real client (httpx): the statements
docs/http.md lists for the Rust layer, checked for the Python one (docs/python.md, "HTTP")."""

import asyncio
import logging
import os
import contextlib
import json
import pathlib
import shutil
import socket
import subprocess
import time

import httpx
import pytest
import uvicorn
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

import idemkit
from idemkit.asgi import PROBLEM_DOCS, IdempotencyInfo, IdempotencyMiddleware, final_by_default
from conftest import make_store, redis_store, unique


def tenant(scope):
    for name, value in scope["headers"]:
        if name == b"x-tenant":
            return value.decode()
    return None


class Payments:
    """A FastAPI app whose handler counts its runs (the effect a duplicate would repeat)."""

    def __init__(self, delay: float = 0.0) -> None:
        self.runs = 0
        self.delay = delay
        self.seen: list[IdempotencyInfo] = []
        self.app = FastAPI()

        @self.app.post("/payments")
        async def pay(request: Request) -> Response:
            self.runs += 1
            if "idemkit" in request.scope:
                self.seen.append(request.scope["idemkit"])
            order = await request.json()
            if self.delay:
                await asyncio.sleep(self.delay)
            status = order.get("status", 201)
            return JSONResponse(
                {"charge": f"ch_{self.runs}", "amount": order.get("amount")},
                status_code=status,
                headers={"location": f"/payments/ch_{self.runs}", "set-cookie": "session=abc", "x-run": str(self.runs)},
            )


def protect(app, coordinator=None, **options):
    options.setdefault("scope_by", tenant)
    app.add_middleware(
        IdempotencyMiddleware,
        coordinator=coordinator or idemkit.Coordinator(idemkit.MemoryStore()),
        operation="http.payments",
        **options,
    )
    return app


@contextlib.asynccontextmanager
async def serve(app):
    """uvicorn on a free port of this loop; yields an httpx client for it."""
    config = uvicorn.Config(app, host="127.0.0.1", port=0, lifespan="off", log_level="warning")
    server = uvicorn.Server(config)
    # The test's own signals stay the test runner's (uvicorn would take SIGINT and SIGTERM).
    server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign]
    task = asyncio.ensure_future(server.serve())
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
            yield client
    finally:
        server.should_exit = True
        await task


def post(client, key, body, tenant_id="t1", **headers):
    h = {"x-tenant": tenant_id, **headers}
    if key is not None:
        h["idempotency-key"] = key
    return client.post("/payments", content=json.dumps(body), headers={"content-type": "application/json", **h})


def problem(resp, name):
    assert resp.headers["content-type"] == "application/problem+json", resp.text
    body = resp.json()
    assert body["type"] == f"{PROBLEM_DOCS}#variant.{''.join(w.capitalize() for w in name.split('-'))}", body
    assert resp.headers["link"] == f'<{body["type"]}>; rel="describedby"; type="text/html"'
    assert body["status"] == resp.status_code
    return body


async def test_a_replay_is_marked_and_byte_for_byte_and_a_reused_key_is_422_also_mid_flight():
    pay = Payments()
    async with serve(protect(pay.app)) as client:
        first = await post(client, '"order-9"', {"amount": 10})
        again = await post(client, '"order-9"', {"amount": 10})
        assert (first.status_code, again.status_code, pay.runs) == (201, 201, 1)
        assert again.content == first.content
        assert again.headers["idempotent-replayed"] == "true" and "idempotent-replayed" not in first.headers
        assert again.headers["location"] == "/payments/ch_1"
        # Per-caller headers are not kept; neither is what the allowlist leaves out.
        assert "set-cookie" in first.headers and "set-cookie" not in again.headers
        assert "x-run" not in again.headers
        other = await post(client, '"order-9"', {"amount": 11})
        assert other.status_code == 422
        problem(other, "key-reused")
        # A token and the same key quoted, with a parameter, are one key.
        token = await post(client, "order-9;v=1", {"amount": 10})
        assert token.headers.get("idempotent-replayed") == "true" and pay.runs == 1

    slow = Payments(delay=0.5)
    async with serve(protect(slow.app)) as client:
        running = asyncio.ensure_future(post(client, '"k"', {"amount": 1}))
        while slow.runs == 0:
            await asyncio.sleep(0.01)
        mid = await post(client, '"k"', {"amount": 2})
        assert mid.status_code == 422, mid.text
        assert (await running).status_code == 201 and slow.runs == 1


@pytest.mark.parametrize("kind", ["memory", "redis"])
async def test_twenty_concurrent_identical_posts_run_once_and_all_get_the_same_response(kind):
    store = idemkit.MemoryStore() if kind == "memory" else await redis_store()
    pay = Payments(delay=0.2)
    async with serve(protect(pay.app, idemkit.Coordinator(store))) as client:
        answers = await asyncio.gather(*(post(client, f'"{unique("k")[:0]}same"', {"amount": 5}) for _ in range(20)))
    assert pay.runs == 1
    assert {a.status_code for a in answers} == {201}
    assert len({a.content for a in answers}) == 1
    assert sum(a.headers.get("idempotent-replayed") == "true" for a in answers) == 19


async def test_in_reject_mode_one_succeeds_and_the_others_get_409_with_retry_after():
    pay = Payments(delay=0.5)
    async with serve(protect(pay.app, in_flight="reject", retry_hint=2.0)) as client:
        answers = await asyncio.gather(*(post(client, '"r"', {"amount": 5}) for _ in range(5)))
    codes = sorted(a.status_code for a in answers)
    assert codes == [201, 409, 409, 409, 409] and pay.runs == 1
    for a in answers:
        if a.status_code == 409:
            problem(a, "in-progress")
            assert 1 <= int(a.headers["retry-after"]) <= 2


@pytest.mark.parametrize("show", [False, True])
async def test_a_409_points_to_the_original_request(show):
    # Issue 52: the attempt the original runs under (its fencing token), the time left on its
    # lease, and with in_progress_holder=True the process running it; as the Rust layer.
    gate, started = asyncio.Event(), asyncio.Event()
    seen: list[int | None] = []
    app = FastAPI()

    @app.post("/payments")
    async def slow(request: Request) -> Response:
        seen.append(request.scope["idemkit"].fencing_token)
        started.set()
        await gate.wait()
        return JSONResponse({"ok": True}, status_code=201)

    coordinator = idemkit.Coordinator(idemkit.MemoryStore(), holder_name="orders-api-1")
    async with serve(protect(app, coordinator, in_flight="reject", in_progress_holder=show)) as client:
        first = asyncio.ensure_future(post(client, '"p"', {"amount": 1}))
        await asyncio.wait_for(started.wait(), 10)
        dup = await post(client, '"p"', {"amount": 1})
        assert dup.status_code == 409
        problem(dup, "in-progress")
        assert int(dup.headers["retry-after"]) >= 1
        body = dup.json()
        assert body["attempt"] == str(seen[0]), body
        assert 0 < body["lease_left_ms"] <= 15_000, body
        if show:
            assert body["holder"]["name"] == "orders-api-1" and body["holder"]["pid"] == os.getpid(), body
        else:
            assert "holder" not in body, body
        gate.set()
        assert (await first).status_code == 201


async def test_a_rejected_duplicate_is_told_the_original_attempt_and_holder(store_kind):
    # The Python API's InProgress carries the same pointer, on every store.
    store = await make_store(store_kind)
    original = idemkit.Coordinator(store, holder_name="billing-worker")
    duplicate = idemkit.Coordinator(store, holder_name="other-worker")
    gate, started = asyncio.Event(), asyncio.Event()
    tokens: list[int | None] = []

    async def send(attempt):
        tokens.append(attempt.fencing_token)
        started.set()
        await gate.wait()
        return "em_1"

    key = unique("order-9.invoice")
    running = asyncio.ensure_future(original.call("mail.invoice", key).run(send))
    await asyncio.wait_for(started.wait(), 10)
    with pytest.raises(idemkit.InProgress) as refused:
        await duplicate.call("mail.invoice", key, in_flight="reject").run(lambda attempt: "em_2")
    assert refused.value.attempt == tokens[0]
    assert refused.value.holder == idemkit.Holder(socket.gethostname()[:64], os.getpid(), "billing-worker")
    assert refused.value.lease_left > 0
    gate.set()
    assert await running == "em_1"


async def test_a_missing_required_key_or_a_malformed_one_is_400_and_a_large_body_413():
    pay = Payments()
    async with serve(protect(pay.app, required=True, max_body_bytes=100)) as client:
        problem(await post(client, None, {"amount": 1}), "missing-key")
        for bad in ["(x)", "1abc", '"unterminated', "x" * 256, '""']:
            resp = await post(client, bad, {"amount": 1})
            assert resp.status_code == 400, bad
            problem(resp, "malformed-key")
        two = await client.post(
            "/payments", content=b"{}", headers=[("x-tenant", "t"), ("idempotency-key", "a"), ("idempotency-key", "b")]
        )
        assert two.status_code == 400
        large = await post(client, '"big"', {"amount": "x" * 200})
        assert large.status_code == 413
        problem(large, "body-too-large")
        assert pay.runs == 0
    # Not required: a request without the header passes through, unprotected.
    async with serve(protect(Payments().app)) as client:
        assert (await post(client, None, {"amount": 1})).status_code == 201
    # Bare keys that start with a digit (Stripe's UUIDs) only when asked for.
    lenient = Payments()
    async with serve(protect(lenient.app, lenient_bare_keys=True)) as client:
        assert (await post(client, "8e03978e-40d5", {"amount": 1})).status_code == 201


async def test_keys_are_scoped_and_an_unscoped_request_is_refused():
    pay = Payments()
    async with serve(protect(pay.app)) as client:
        a = await post(client, '"same"', {"amount": 1}, tenant_id="acme")
        b = await post(client, '"same"', {"amount": 1}, tenant_id="globex")
        assert (a.status_code, b.status_code, pay.runs) == (201, 201, 2)
        assert "idempotent-replayed" not in b.headers
        unscoped = await client.post(
            "/payments", content=b"{}", headers={"idempotency-key": '"same"', "content-type": "application/json"}
        )
        assert unscoped.status_code == 403
        problem(unscoped, "unscoped-request")
    with pytest.raises(ValueError, match="scoped"):
        IdempotencyMiddleware(pay.app, coordinator=idemkit.Coordinator(idemkit.MemoryStore()), operation="op")
    with pytest.raises(ValueError, match="set-cookie"):
        IdempotencyMiddleware(
            pay.app,
            coordinator=idemkit.Coordinator(idemkit.MemoryStore()),
            operation="op",
            global_scope="all",
            keep_headers=["content-type", "Set-Cookie"],
        )


async def test_outcomes_are_stored_and_refusals_release_the_key():
    pay = Payments()
    async with serve(protect(pay.app)) as client:
        for status, stored in [(400, False), (422, False), (429, False), (500, False), (503, False), (402, True), (404, True), (200, True)]:
            key = f'"s{status}"'
            first = await post(client, key, {"status": status})
            runs = pay.runs
            retry = await post(client, key, {"status": status})
            assert first.status_code == status and retry.status_code == status
            assert (retry.headers.get("idempotent-replayed") == "true") is stored, status
            assert pay.runs == (runs if stored else runs + 1), status
            assert final_by_default(status) is stored
        # A validation failure, then the corrected request with the same key: it runs.
        bad = await client.post(
            "/payments", content=b"{bad json", headers={"x-tenant": "t1", "idempotency-key": '"fix"', "content-type": "application/json"}
        )
        assert bad.status_code >= 400
        fixed = await post(client, '"fix"', {"amount": 3})
        assert fixed.status_code == 201 and "idempotent-replayed" not in fixed.headers


async def test_a_json_body_counts_by_its_value_and_the_credential_counts_too():
    pay = Payments()
    async with serve(protect(pay.app)) as client:
        h = {"x-tenant": "t1", "idempotency-key": '"j"', "content-type": "application/json", "authorization": "Bearer a"}
        first = await client.post("/payments", content=b'{"amount": 10, "note": "x"}', headers=h)
        spelled = await client.post("/payments", content=b'{ "note":"x","amount":10.0 }', headers=h)
        assert spelled.headers.get("idempotent-replayed") == "true" and pay.runs == 1
        other = await client.post("/payments", content=b'{"amount": 10, "note": "x"}', headers={**h, "authorization": "Bearer b"})
        assert other.status_code == 422 and pay.runs == 1
        assert first.status_code == 201
    relaxed = Payments()
    async with serve(protect(relaxed.app, fingerprint_authorization=False)) as client:
        h = {"x-tenant": "t1", "idempotency-key": '"j"', "content-type": "application/json", "authorization": "Bearer a"}
        await client.post("/payments", content=b"{}", headers=h)
        refreshed = await client.post("/payments", content=b"{}", headers={**h, "authorization": "Bearer a2"})
        assert refreshed.headers.get("idempotent-replayed") == "true" and relaxed.runs == 1


async def test_the_handler_reads_its_key_and_fencing_token():
    pay = Payments()
    async with serve(protect(pay.app)) as client:
        await post(client, '"info"', {"amount": 1}, tenant_id="acme")
    (info,) = pay.seen
    assert (info.key, info.scope, len(info.fingerprint)) == ("info", "acme", 16)
    assert isinstance(info.fencing_token, int) and info.fencing_token > 0


def stream_app(gate: asyncio.Event, runs: list[int]):
    app = FastAPI()

    @app.post("/stream")
    async def stream(request: Request) -> Response:
        runs.append(1)

        async def body():
            yield b"first,"
            await gate.wait()
            yield b"second,"
            yield b"last"

        return StreamingResponse(body(), media_type="text/plain")

    return app


async def test_a_streamed_response_reaches_the_client_as_it_is_produced_and_its_end_follows_the_store():
    gate, runs = asyncio.Event(), []
    headers = {"x-tenant": "t", "idempotency-key": '"s"'}
    async with serve(protect(stream_app(gate, runs), in_flight="reject")) as client:
        async with client.stream("POST", "/stream", content=b"x", headers=headers) as resp:
            chunks = resp.aiter_raw()
            # The first frame arrives while the handler waits: the body is not buffered
            # (buffering would wait for the gate, which opens only after this read).
            first = await asyncio.wait_for(chunks.__anext__(), 5)
            assert first == b"first,"
            gate.set()
            rest = b"".join([c async for c in chunks])
        assert first + rest == b"first,second,last"
        # Read to its end, retried at once, in reject mode: the replay, never 409.
        retry = await client.post("/stream", content=b"x", headers=headers)
        assert retry.status_code == 200 and retry.content == b"first,second,last", retry.text
        assert retry.headers["idempotent-replayed"] == "true" and len(runs) == 1


async def test_a_client_that_times_out_does_not_cancel_its_handler_and_its_retry_replays():
    pay = Payments(delay=1.0)
    async with serve(protect(pay.app)) as client:
        with pytest.raises(httpx.ReadTimeout):
            await client.post(
                "/payments",
                content=b'{"amount": 7}',
                headers={"x-tenant": "t", "idempotency-key": '"gone"', "content-type": "application/json"},
                timeout=0.2,
            )
        retry = await post(client, '"gone"', {"amount": 7}, tenant_id="t")
        assert retry.status_code == 201 and retry.headers["idempotent-replayed"] == "true"
        assert pay.runs == 1 and retry.json()["charge"] == "ch_1"


async def test_a_handler_that_raises_stores_nothing_and_its_retry_runs():
    app = FastAPI()
    runs = []

    @app.post("/payments")
    async def pay() -> dict:
        runs.append(1)
        if len(runs) == 1:
            raise RuntimeError("the card network timed out")
        return {"ok": True}

    async with serve(protect(app)) as client:
        first = await post(client, '"boom"', {})
        retry = await post(client, '"boom"', {})
    assert first.status_code == 500 and retry.status_code == 200 and len(runs) == 2
    assert "idempotent-replayed" not in retry.headers


async def test_a_response_too_large_to_store_replays_as_done_with_a_stable_problem():
    app = FastAPI()
    runs = []

    @app.post("/export")
    async def export() -> Response:
        runs.append(1)
        return Response(b"x" * 20_000, status_code=201, media_type="application/octet-stream")

    async with serve(protect(app, max_result_bytes=8192)) as client:
        h = {"x-tenant": "t", "idempotency-key": '"big"'}
        first = await client.post("/export", content=b"", headers=h)
        retry = await client.post("/export", content=b"", headers=h)
    assert first.status_code == 201 and len(first.content) == 20_000
    assert retry.status_code == 201 and retry.headers["idempotent-replayed"] == "true"
    body = problem(retry, "result-unavailable")
    assert "20000 bytes" in body["detail"] and len(runs) == 1


CASES = pathlib.Path(__file__).resolve().parents[2] / "idemkit-http" / "tests" / "cases" / "streaming.json"


@pytest.mark.parametrize("case", json.loads(CASES.read_text())["cases"], ids=lambda c: c["name"])
async def test_both_layers_table_of_final_responses(case):
    """The table the Rust layer runs too (``idemkit-http/tests/cases.rs``; issue 50 item 3):
    what is stored of a final response, within ``max_result_bytes`` with the kept headers
    counted, and a retry right after the whole body is its replay (the last frame waited for
    the store). Both layers decide by one state machine, ``idemkit_http::binding::Capture``."""
    frames = [bytes([ord("a") + i % 26]) * n for i, n in enumerate(case["frames"])]
    whole = b"".join(frames)
    head = "text/plain;p="
    ctype = head + "a" * max(case["content_type_bytes"] - len(head), 0)
    runs = []

    async def app(scope, receive, send):
        runs.append(1)
        headers = [(b"content-type", ctype.encode())]
        if case["content_length"]:
            headers.append((b"content-length", str(len(whole)).encode()))
        await send({"type": "http.response.start", "status": 201, "headers": headers})
        for i, frame in enumerate(frames):
            await send({"type": "http.response.body", "body": frame, "more_body": i + 1 < len(frames)})
        if not frames:
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    coordinator = idemkit.Coordinator(idemkit.MemoryStore(), max_result_bytes=case["max_result_bytes"])
    mw = IdempotencyMiddleware(app, coordinator=coordinator, operation="http.cases", scope_by=lambda _: "global")
    async with serve(mw) as client:
        h = {"idempotency-key": '"case"'}
        first = await client.post("/cases", content=b"{}", headers=h)
        retry = await client.post("/cases", content=b"{}", headers=h)
    assert first.status_code == 201 and first.content == whole, case["name"]
    assert retry.status_code == 201 and retry.headers["idempotent-replayed"] == "true", case["name"]
    if case["stored"]:
        assert retry.content == whole, case["name"]
    else:
        body = problem(retry, "result-unavailable")
        assert f"{len(whole)} bytes" in body["detail"], (case["name"], body)
    assert len(runs) == 1


async def test_sizes_count_the_kept_headers_and_stay_within_the_coordinators_limit():
    """Review L5 (of ``e047556``), as the Rust layer: (1) the kept headers count against
    ``max_result_bytes``: a body that fits alone, with a large kept header, is kept as too
    large; (2) the middleware stores nothing larger than its coordinator does: with
    ``max_result_bytes=4 MiB`` over a coordinator of 1 MiB, a 2 MiB response replays as
    ``result-unavailable`` under its status (before: the core stored it as unavailable and the
    retry got 500), and a coordinator made with ``max_result_bytes`` keeps it whole."""
    runs = []

    def sized_app():
        app = FastAPI()

        @app.post("/sized")
        async def sized(request: Request) -> Response:
            runs.append(1)
            size, header = int(request.query_params["size"]), int(request.query_params["header"])
            return Response(
                b"x" * size,
                status_code=201,
                media_type="application/octet-stream",
                headers={"location": "/" + "l" * header},
            )

        return app

    async def twice(coordinator, limit, size, header, key):
        async with serve(protect(sized_app(), coordinator, max_result_bytes=limit)) as client:
            h = {"x-tenant": "t", "idempotency-key": f'"{key}"'}
            url = f"/sized?size={size}&header={header}"
            first = await client.post(url, content=b"", headers=h)
            retry = await client.post(url, content=b"", headers=h)
        assert first.status_code == 201 and len(first.content) == size
        assert retry.headers["idempotent-replayed"] == "true", retry.text[:200]
        return retry

    # 60 KiB of body fits 64 KiB less the headroom alone; with an 8 KiB kept header, not.
    retry = await twice(None, 64 << 10, 60 << 10, 8 << 10, "headers")
    assert retry.status_code == 201
    problem(retry, "result-unavailable")
    retry = await twice(None, 64 << 10, 60 << 10, 10, "small-header")
    assert retry.status_code == 201 and len(retry.content) == 60 << 10
    # The coordinator's limit (1 MiB by default) bounds the middleware's 4 MiB.
    retry = await twice(idemkit.Coordinator(idemkit.MemoryStore()), 4 << 20, 2 << 20, 10, "core")
    assert retry.status_code == 201, retry.text[:200]
    problem(retry, "result-unavailable")
    roomy = idemkit.Coordinator(idemkit.MemoryStore(), max_result_bytes=4 << 20)
    retry = await twice(roomy, 4 << 20, 2 << 20, 10, "roomy")
    assert retry.status_code == 201 and len(retry.content) == 2 << 20
    assert len(runs) == 4


async def test_a_waiting_retry_whose_client_left_does_not_run_the_handler():
    """Review L6 (of ``e047556``), as the Rust layer: a retry waits on the first request,
    whose response is then not final (the key is released); the retry's client left while it
    waited, so its handler must not run for nobody.

    Before: the waiting call took the released key and ran the handler (two runs)."""
    import logging
    import threading

    release, runs = asyncio.Event(), []
    app = FastAPI()

    @app.post("/once")
    async def once() -> Response:
        runs.append(1)
        if len(runs) == 1:
            await release.wait()
            return JSONResponse({"busy": True}, status_code=409)
        return JSONResponse({"ran": len(runs)}, status_code=201)

    left = threading.Event()

    class Seen(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "left while its request waited" in record.getMessage():
                left.set()

    seen, asgi_log = Seen(), logging.getLogger("idemkit.asgi")
    asgi_log.addHandler(seen)
    old_level = asgi_log.level
    asgi_log.setLevel(logging.DEBUG)
    try:
        async with serve(protect(app)) as client:
            h = {"x-tenant": "t", "idempotency-key": '"waiting"'}
            first = asyncio.ensure_future(client.post("/once", content=b"", headers=h))
            while not runs:
                await asyncio.sleep(0.01)
            (await raw_post(client, "/once", '"waiting"', b"")).close()
            try:
                # Until the middleware has seen the retry's client leave (a condition polled).
                for _ in range(1000):
                    if left.is_set():
                        break
                    await asyncio.sleep(0.01)
                assert left.is_set(), "the middleware never saw the waiting client leave"
            finally:
                # Also on a failure: the first handler would hold the server's shutdown.
                release.set()
            assert (await first).status_code == 409
            # The key is free again: a third request runs (the second never did).
            third = await client.post("/once", content=b"", headers=h)
            assert third.json() == {"ran": 2}, third.text
    finally:
        asgi_log.removeHandler(seen)
        asgi_log.setLevel(old_level)
    assert len(runs) == 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def own_redis(port: int):
    """A redis-server of this test's own on `port`, and a store connected to it."""
    server = shutil.which("redis-server")
    if server is None:
        pytest.fail("redis-server is needed to stop a Redis of this test's own")
    proc = subprocess.Popen(
        [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    for _ in range(200):
        try:
            return proc, await idemkit.RedisStore.connect(f"redis://127.0.0.1:{port}")
        except idemkit.StoreUnavailable:
            time.sleep(0.02)
    proc.kill()
    pytest.fail(f"the test's redis-server on {port} did not start")


async def test_with_the_store_down_the_answer_is_503_and_nothing_runs(caplog):
    port = free_port()
    proc, store = await own_redis(port)
    try:
        pay = Payments()
        async with serve(protect(pay.app, idemkit.Coordinator(store))) as client:
            assert (await post(client, '"up"', {"amount": 1})).status_code == 201
            proc.kill()
            proc.wait()
            with caplog.at_level(logging.WARNING, logger="idemkit"):
                down = await post(client, '"down"', {"amount": 1})
            assert down.status_code == 503
            problem(down, "store-unavailable")
            assert pay.runs == 1
            # The client may come back (a short, fixed wait: the outage's end is unknown), and
            # the operator sees why, as with the Rust layer.
            assert down.headers.get("retry-after") == "1"
            logged = [r for r in caplog.records if "store is unavailable" in r.getMessage()]
            assert logged and "StoreUnavailable" in logged[0].getMessage(), caplog.text
        # Down while a handler runs: it ran, its response could not be stored: 500 (its cause
        # logged), never the response as if it were stored (before: 201, and a retry ran again).
        proc, store = await own_redis(port)
        slow = Payments(delay=0.5)
        async with serve(protect(slow.app, idemkit.Coordinator(store, lease=2.0))) as client:
            running = asyncio.ensure_future(post(client, '"mid"', {"amount": 1}))
            while slow.runs == 0:
                await asyncio.sleep(0.01)
            proc.kill()
            proc.wait()
            lost = await running
            assert lost.status_code == 500 and slow.runs == 1, lost.text
            assert problem(lost, "internal")["instance"].startswith("urn:idemkit:incident:")
        # Failing open: the handler runs, unprotected.
        fail_open = Payments()
        async with serve(protect(fail_open.app, idemkit.Coordinator(store, fail_open=True))) as client:
            assert (await post(client, '"open"', {"amount": 1})).status_code == 201
            assert fail_open.runs == 1
    finally:
        proc.kill()
        proc.wait()


async def test_a_client_that_leaves_mid_stream_retries_into_the_whole_response():
    gate, runs = asyncio.Event(), []
    headers = {"x-tenant": "t", "idempotency-key": '"left"'}
    async with serve(protect(stream_app(gate, runs))) as client:
        async with client.stream("POST", "/stream", content=b"x", headers=headers) as resp:
            assert await asyncio.wait_for(resp.aiter_raw().__anext__(), 5) == b"first,"
        # The client closed its connection mid-stream; the handler's body goes on.
        gate.set()
        retry = await client.post("/stream", content=b"x", headers=headers)
    assert retry.content == b"first,second,last" and retry.headers["idempotent-replayed"] == "true"
    assert len(runs) == 1


async def raw_post(client, path: str, key: str, body: bytes) -> asyncio.StreamWriter:
    """A request sent on a socket of the test's own, whose answer nobody reads: a client that
    stops reading, or that leaves (close the writer it returns)."""
    port = int(str(client.base_url).rsplit(":", 1)[1].rstrip("/"))
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\nx-tenant: t\r\n"
        f"idempotency-key: {key}\r\ncontent-length: {len(body)}\r\n\r\n".encode()
        + body
    )
    await writer.drain()
    return writer


async def test_a_client_that_stops_reading_does_not_hold_the_call():
    """Review M5 (of ``e047556``): the first client sends its request and never reads. The
    handler's 32 MiB stream must not wait on it: each frame waits at most the middleware's
    ``client_pace`` (a third of the 0.3 s lease), then the client is dropped from the stream,
    the handler runs to its end and its response is stored; the retry is a replay.

    Before: the handler blocked in uvicorn's ``send`` once the socket's buffers were full,
    the keeper renewed the key the while, and the retry waited (or got 409)."""
    runs, finished = [], asyncio.Event()
    app = FastAPI()

    @app.post("/download")
    async def download(request: Request) -> Response:
        runs.append(1)

        async def body():
            for _ in range(512):
                yield b"x" * 65536
            finished.set()

        return StreamingResponse(body(), media_type="application/octet-stream")

    coordinator = idemkit.Coordinator(idemkit.MemoryStore(), lease=0.3)
    async with serve(protect(app, coordinator)) as client:
        writer = await raw_post(client, "/download", '"slow"', b"x")
        try:
            # Never read from here on.
            await asyncio.wait_for(finished.wait(), 30)
            retry = await client.post("/download", content=b"x", headers={"x-tenant": "t", "idempotency-key": '"slow"'})
        finally:
            # Also on a failure: a handler blocked on this client would hold the server's
            # shutdown.
            writer.close()
    assert retry.headers["idempotent-replayed"] == "true", (retry.status_code, retry.text[:200])
    assert len(runs) == 1


async def test_cancelling_with_the_client_is_an_explicit_option():
    started, finished = [], []
    app = FastAPI()

    @app.post("/slow")
    async def slow() -> dict:
        started.append(1)
        await asyncio.sleep(1.0)
        finished.append(1)
        return {"ok": True}

    coordinator = idemkit.Coordinator(idemkit.MemoryStore(), lease=5.0)
    async with serve(protect(app, coordinator, cancel_with_client=True, in_flight="reject")) as client:
        h = {"x-tenant": "t", "idempotency-key": '"c"'}
        with pytest.raises(httpx.ReadTimeout):
            await client.post("/slow", content=b"", headers=h, timeout=0.2)
        await asyncio.sleep(1.2)
        # The handler was cancelled with its client: it never finished, and its key waits
        # out the lease (kept, as a crash keeps it: the effect may be half done).
        assert (len(started), len(finished)) == (1, 0)
        retry = await client.post("/slow", content=b"", headers=h)
        assert retry.status_code == 409


async def test_the_example_app_charges_once_per_key():
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[1] / "examples" / "fastapi_app.py"
    spec = importlib.util.spec_from_file_location("fastapi_app", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    async with serve(module.app) as client:
        first, again = [await post(client, '"order-9"', {"amount": 10}, tenant_id="acme") for _ in range(2)]
        other_tenant = await post(client, '"order-9"', {"amount": 10}, tenant_id="globex")
    assert first.json() == again.json() == {"charge": "ch_1", "amount": 10}
    assert again.headers["idempotent-replayed"] == "true"
    assert other_tenant.json()["charge"] == "ch_2"


async def test_the_rule_of_what_is_final_and_the_problems_documentation_can_be_replaced():
    pay = Payments()
    # 404 is final by default; here only 2xx is.
    async with serve(protect(pay.app, final_when=lambda status: 200 <= status < 300, problem_docs=None)) as client:
        await post(client, '"nf"', {"status": 404})
        retry = await post(client, '"nf"', {"status": 404})
        assert "idempotent-replayed" not in retry.headers and pay.runs == 2
        reused = await post(client, '"nf2"', {"amount": 1})
        reused = await post(client, '"nf2"', {"amount": 2})
        assert reused.json()["type"] == "urn:idemkit:problem:key-reused" and "link" not in reused.headers
    async with serve(protect(Payments().app, problem_docs="https://api.example.com/errors")) as client:
        await post(client, '"d"', {"amount": 1})
        reused = await post(client, '"d"', {"amount": 2})
        assert reused.json()["type"] == "https://api.example.com/errors/key-reused"
        assert reused.headers["link"] == '<https://api.example.com/errors/key-reused>; rel="describedby"; type="text/html"'


async def test_headers_given_as_lists_are_read_as_pairs():
    # ASGI allows header pairs as lists (some servers and apps send them so).
    runs = []

    async def app(scope, receive, send):
        runs.append(1)
        await receive()
        await send({"type": "http.response.start", "status": 201, "headers": [[b"content-type", b"text/plain"]]})
        await send({"type": "http.response.body", "body": b"done"})

    mw = IdempotencyMiddleware(app, coordinator=idemkit.Coordinator(idemkit.MemoryStore()), operation="op", global_scope="all")
    sent = []

    async def call():
        scope = {"type": "http", "method": "POST", "path": "/x", "raw_path": b"/x", "query_string": b"",
                 "headers": [[b"idempotency-key", b'"k"'], [b"content-type", b"text/plain"]]}
        messages = [{"type": "http.request", "body": b"x", "more_body": False}]

        async def receive():
            return messages.pop(0) if messages else await asyncio.Event().wait()

        async def send(message):
            sent.append(message)

        await mw(scope, receive, send)

    await call()
    await call()
    starts = [m for m in sent if m["type"] == "http.response.start"]
    assert [m["status"] for m in starts] == [201, 201] and len(runs) == 1
    assert (b"idempotent-replayed", b"true") in starts[1]["headers"]
    assert (b"content-type", b"text/plain") in starts[1]["headers"]
