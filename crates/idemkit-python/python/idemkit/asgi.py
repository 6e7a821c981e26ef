"""The ``Idempotency-Key`` header for ASGI applications (Starlette, FastAPI, any ASGI 3 app).

``IdempotencyMiddleware`` answers as the Rust HTTP layer (``idemkit-http``) does, from the same
code where it decides: the key's syntax (an RFC 8941 string or token, at most 255
characters), the request's fingerprint (method, path and query, ``Authorization``, chosen
headers, the body; a JSON body by its value), what is final (2xx and the 4xx that report an
outcome), the stored response's format (a record one stores, the other replays) and the
problems (``application/problem+json``). See docs/python.md, "HTTP: an ASGI middleware".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import sys
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from dataclasses import dataclass
from typing import Any, Literal

from . import _native
from ._coordinator import Coordinator, ExactFingerprint
from ._errors import IdemkitError, InProgress, InvalidKey, KeyReused, StoreUnavailable
from .codecs import BYTES

__all__ = ["IdempotencyMiddleware", "IdempotencyInfo", "final_by_default", "PROBLEM_DOCS"]

logger = logging.getLogger("idemkit.asgi")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: Where the problems are documented by default (the Rust crate's page of them); each
#: problem's ``type`` is this page with the problem as fragment, and is linked.
PROBLEM_DOCS: str = _native.HTTP_PROBLEM_DOCS

#: The response headers kept with a stored response by default, as the Rust layer keeps.
DEFAULT_KEEP = ("content-type", "content-language", "location", "etag", "last-modified", "cache-control")

#: A reserved request's typical run, remembered per middleware for ``Retry-After``.
_RECENT = 32


def final_by_default(status: int) -> bool:
    """Whether a response of this status is stored and replayed: 2xx, and the 4xx that report
    an outcome (402, 404, 410, ...); not the 4xx that refuse a request before it executes
    (400, 401, 403, 405-409, 411-415, 417, 421-423, 425, 426, 428, 429, 431), nor 5xx: those
    release the key, so a corrected or later retry runs."""
    return _native.http_final_by_default(status)


@dataclass(frozen=True)
class IdempotencyInfo:
    """What the handler can read of its request's key, at ``scope["idemkit"]``
    (``request.scope["idemkit"]`` in Starlette and FastAPI)."""

    key: str
    scope: str
    #: The request's fingerprint (16 bytes).
    fingerprint: bytes
    #: The reservation's fencing token: pass it on to a downstream write that can check it.
    fencing_token: int | None




class _NotFinal(Exception):
    """The handler's response is not final: the key is released, the response passes."""


class _ClientGone(Exception):
    """The client left before the handler started (``cancel_with_client``)."""


class IdempotencyMiddleware:
    """Runs a request's handler at most once per (scope, ``Idempotency-Key``) and replays its
    response to every retry, marked ``Idempotent-Replayed: true``.

    Keys are scoped to the caller: give ``scope_by`` (a function of the ASGI scope returning
    the caller's tenant, or ``None`` to refuse the request with ``403``) or a named
    ``global_scope``. ``methods`` (POST and PATCH) are protected; a request without the header
    passes through (``400`` with ``required=True``). A concurrent retry waits for the first
    response (``in_flight="wait"``) or gets ``409`` with ``Retry-After`` (``"reject"``), its body
    pointing to the original: ``attempt`` (its id), ``lease_left_ms``, and with
    ``in_progress_holder=True`` its ``holder`` (host, pid, name: off by default, internal facts a
    public API should not hand out), as the Rust layer answers. A key
    reused for another request is ``422``; the store down ``503`` with ``Retry-After: 1``, its
    cause logged at ``warning`` on ``idemkit.asgi`` (a coordinator made with
    ``fail_open=True`` runs the handler unprotected instead); a body over ``max_body_bytes``
    ``413``. A response that is not final (``final_when``, by default
    ``final_by_default``) releases the key. Once reserved, a handler runs to its end even if
    its client leaves (``cancel_with_client=True`` cancels it with the client instead).
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        coordinator: Coordinator,
        operation: str,
        scope_by: Callable[[Scope], str | None] | None = None,
        global_scope: str | None = None,
        methods: Iterable[str] = ("POST", "PATCH"),
        required: bool = False,
        max_body_bytes: int = 1 << 20,
        max_result_bytes: int = 1 << 20,
        keep_headers: Iterable[str] = DEFAULT_KEEP,
        fingerprint_headers: Iterable[str] = (),
        fingerprint_authorization: bool = True,
        canonical_json: bool = True,
        lenient_bare_keys: bool = False,
        in_flight: Literal["wait", "reject"] = "wait",
        ttl: float = 86_400.0,
        final_when: Callable[[int], bool] = final_by_default,
        retry_hint: float | None = None,
        problem_docs: str | None = PROBLEM_DOCS,
        cancel_with_client: bool = False,
        in_progress_holder: bool = False,
    ) -> None:
        if (scope_by is None) == (global_scope is None):
            raise ValueError(
                "keys are scoped to the caller: give scope_by (a function of the request) or a "
                "named global_scope, exactly one"
            )
        if in_flight not in ("wait", "reject"):
            raise ValueError(f"in_flight is 'wait' or 'reject', not {in_flight!r}")
        keep = [h.lower() for h in keep_headers]
        for name in keep:
            if _native.http_is_per_caller(name):
                raise ValueError(f"{name} belongs to one caller: a replay would hand it to another, so it is never kept")
        # Checked now, so a bad one fails at start-up, not per request.
        _native.validate(operation, "k")
        self.app = app
        self.coordinator = coordinator
        self.operation = operation
        # How long one streamed frame may wait for its client (the Rust layer's rule, on the
        # operation's lease): a client that stops reading is dropped from the stream, and
        # neither holds the key nor makes its retry run the handler again.
        self.client_pace: float = coordinator._native.client_pace(operation)
        self.scope_by = scope_by
        self.global_scope = global_scope
        self.methods = frozenset(m.upper() for m in methods)
        self.required = required
        self.max_body_bytes = max_body_bytes
        # No larger than what the coordinator stores (its `max_result_bytes`, 1 MiB by
        # default): a larger response is kept as "too large" here, with its status, instead of
        # being turned into an unavailable result by the core (review L5 of `e047556`).
        self.max_result_bytes = min(max_result_bytes, coordinator._native.result_limit(operation))
        self.keep = keep
        self.chosen = [h.lower() for h in fingerprint_headers]
        self.fingerprint_authorization = fingerprint_authorization
        self.canonical_json = canonical_json
        self.lenient = lenient_bare_keys
        self.in_flight: Literal["wait", "reject"] = in_flight
        self.ttl = ttl
        self.final_when = final_when
        self.retry_hint = retry_hint
        self.problem_docs = problem_docs
        self.cancel_with_client = cancel_with_client
        self.in_progress_holder = in_progress_holder
        self._recent: deque[float] = deque(maxlen=_RECENT)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in self.methods:
            await self.app(scope, receive, send)
            return
        values = [v for n, v in scope["headers"] if n.lower() == b"idempotency-key"]
        if not values:
            if self.required:
                await self._problem(send, "missing-key", "this request requires an Idempotency-Key header")
            else:
                await self.app(scope, receive, send)
            return
        if len(values) > 1:
            await self._problem(send, "malformed-key", "more than one Idempotency-Key header")
            return
        try:
            key = _native.http_parse_key(values[0], self.lenient)
        except ValueError as e:
            await self._problem(send, "malformed-key", str(e))
            return
        tenant = self.global_scope if self.scope_by is None else self.scope_by(scope)
        if not tenant:
            await self._problem(send, "unscoped-request", "this request cannot be scoped to a caller, so its key is refused")
            return
        body = await self._read_body(receive)
        if body is _TOO_LARGE:
            await self._problem(send, "body-too-large", f"the body is over {self.max_body_bytes} bytes: nothing was stored")
            return
        if body is None:
            # The client left while sending its body: nothing ran, no one to answer.
            return
        fingerprint = _native.http_fingerprint(
            scope["method"],
            _path_and_query(scope),
            _pairs(scope["headers"]),
            body,
            self.canonical_json,
            self.fingerprint_authorization,
            self.chosen,
        )
        run = _Run(self, scope, receive, send, key, tenant, fingerprint, body)
        # The call in a task of its own: a server that cancels a request's task when its
        # client leaves cancels the wait below, never the handler once it started.
        task = asyncio.ensure_future(run.call())
        if self.cancel_with_client:
            await self._with_the_client(run, task, receive)
            return
        # Until the handler starts, a client that leaves is noted (uvicorn says so through
        # `receive`): a call that was waiting then does not run the handler for nobody.
        watcher = asyncio.ensure_future(self._watch_until_started(run, receive))
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            run.client_gone = True
            raise
        finally:
            watcher.cancel()

    async def _watch_until_started(self, run: _Run, receive: Receive) -> None:
        while not run.ran:
            message = await receive()
            if message["type"] == "http.disconnect":
                if not run.ran:
                    run.client_gone = True
                    logger.debug("the client left while its request waited; its handler will not run")
                return

    async def _with_the_client(self, run: _Run, task: asyncio.Future[None], receive: Receive) -> None:
        """``cancel_with_client``: the call is cancelled when its client disconnects (the
        server tells by ``http.disconnect``); its key then stays reserved until its lease
        ends, as a crash leaves it (or is released, with ``on_cancel="release"``)."""

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            run.disconnected.set()

        watcher = asyncio.ensure_future(watch())
        try:
            await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if not task.done():
                run.client_gone = True
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                return
            await task
        finally:
            watcher.cancel()
            task.cancel()

    async def _read_body(self, receive: Receive) -> bytes | None:
        """The whole body; ``_TOO_LARGE`` over the limit, ``None`` if the client left."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                return _TOO_LARGE
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    def _problem_message(
        self, name: str, detail: str, status: int | None = None, incident: str | None = None
    ) -> tuple[Message, Message]:
        code, headers, body = _native.http_problem(name, detail, status, incident, self.problem_docs)
        headers.append((b"content-length", str(len(body)).encode()))
        return (
            {"type": "http.response.start", "status": code, "headers": headers},
            {"type": "http.response.body", "body": body, "more_body": False},
        )

    async def _problem(
        self,
        send: Send,
        name: str,
        detail: str,
        status: int | None = None,
        extra: list[tuple[bytes, bytes]] | None = None,
        incident: str | None = None,
    ) -> None:
        start, body = self._problem_message(name, detail, status, incident)
        if extra:
            start["headers"].extend(extra)
        await send(start)
        await send(body)

    def _retry_after(self, e: InProgress) -> int:
        """What is left of a typical run (the hint, or the recent median), else the lease's
        remainder; whole seconds, at least 1, never past the lease."""
        typical = self.retry_hint
        if typical is None and self._recent:
            typical = sorted(self._recent)[len(self._recent) // 2]
        if typical is None:
            after = e.retry_after
        else:
            after = min(max(typical - (e.held_for or 0.0), 0.0), e.lease_left or typical)
        return max(1, math.ceil(after))


_TOO_LARGE = b"<over max_body_bytes>"

#: The ``Retry-After`` of a ``503 store-unavailable``, in seconds (the Rust layer's).
_STORE_UNAVAILABLE_RETRY_AFTER = 1


def _pairs(headers: Iterable[Any]) -> list[tuple[bytes, bytes]]:
    """ASGI headers as (name, value) tuples of bytes: servers and apps may give lists."""
    return [(bytes(name), bytes(value)) for name, value in headers]


def _path_and_query(scope: Scope) -> str:
    raw = scope.get("raw_path")
    path = raw.decode("latin-1") if raw else scope.get("path", "") or "/"
    query = scope.get("query_string", b"")
    return f"{path}?{query.decode('latin-1')}" if query else path


class _Run:
    """One protected request: its call, the handler's task, and what reaches the client."""

    def __init__(
        self,
        mw: IdempotencyMiddleware,
        scope: Scope,
        receive: Receive,
        send: Send,
        key: str,
        tenant: str,
        fingerprint: bytes,
        body: bytes,
    ) -> None:
        self.mw = mw
        self.scope = scope
        self.client_receive = receive
        self.client_send = send
        self.key = key
        self.tenant = tenant
        self.fingerprint = fingerprint
        self.body = body
        self.client_gone = False
        self.ran = False
        self.protected = True
        self.final = True
        self.app_task: asyncio.Future[None] | None = None
        # Set when the client disconnects (watched only with ``cancel_with_client``).
        self.disconnected = asyncio.Event()
        self.app_error: BaseException | None = None
        # The handler's response, as it comes.
        self.head: asyncio.Future[tuple[int, list[tuple[bytes, bytes]]]] | None = None
        self.sent_head = False
        # A final response's body: what is kept to store and which frame waits for it, the
        # Rust layer's own decisions (`idemkit_http::binding::Capture`).
        self.capture: Any = None
        self.held: Message | None = None
        self.start: Message | None = None
        # The response's Content-Length, if it announced one.
        self.announced: int | None = None

    async def _send(self, message: Message) -> None:
        """To the client, unless it left: the handler's run goes on without it."""
        if self.client_gone:
            return
        try:
            await self.client_send(message)
        except Exception:
            # A closed connection (uvicorn's ClientDisconnected, an OSError): the response
            # is still stored; only this client does not get it.
            self.client_gone = True

    async def _paced(self, message: Message) -> None:
        """A frame of a stream the handler gives while it holds the key: to the client, but
        waiting no longer than the middleware's ``client_pace`` for it to make room. A client
        that does not is dropped from the stream (its body is cut off) and the handler goes on
        to its end and its stored response, as in the Rust layer."""
        if self.client_gone:
            return
        try:
            await asyncio.wait_for(self.client_send(message), self.mw.client_pace)
        except asyncio.TimeoutError:
            self.client_gone = True
            logger.warning(
                "idempotency middleware: the client stopped reading a streamed response; "
                "it is dropped from the stream, the response is still stored"
            )
        except Exception:
            self.client_gone = True

    async def call(self) -> None:
        mw = self.mw
        call = mw.coordinator.call(
            mw.operation,
            self.key,
            ttl=mw.ttl,
            in_flight=mw.in_flight,
            fingerprint=ExactFingerprint(self.fingerprint),
            scope=self.tenant,
            codec=BYTES,
        )
        try:
            stored = await call.run(self._action)
        except _NotFinal:
            # Released; the handler's response goes on to its client as it gives it.
            assert self.app_task is not None
            if self.mw.cancel_with_client:
                await self.app_task
            else:
                await asyncio.shield(self.app_task)
            if self.app_error is not None:
                raise self.app_error
            return
        except _ClientGone:
            return
        except InProgress as e:
            # The Rust layer's answer: Retry-After, and the body pointing to the original.
            holder = None
            if e.holder is not None and mw.in_progress_holder:
                holder = (e.holder.host, e.holder.pid, e.holder.name)
            code, headers, body = _native.http_in_progress(
                mw.problem_docs, mw._retry_after(e), e.attempt, e.lease_left, holder
            )
            headers.append((b"content-length", str(len(body)).encode()))
            await self._send({"type": "http.response.start", "status": code, "headers": headers})
            await self._send({"type": "http.response.body", "body": body, "more_body": False})
            return
        except KeyReused:
            await self._answer_problem("key-reused", "this Idempotency-Key was used for a different request")
            return
        except InvalidKey as e:
            # The key was checked already: the scope function's tenant is not a scope.
            await self._answer_problem("unscoped-request", f"this request's scope is not one: {e}")
            return
        except IdemkitError as e:
            if self.sent_head:
                # Part of the response went out: only breaking it off says it failed.
                raise
            if self.ran:
                # The handler ran, its response could not be stored: as the Rust layer, a
                # 500 whose cause is logged (a 503 would say nothing was done).
                await self._internal("the handler's response could not be stored", e)
            elif isinstance(e, StoreUnavailable):
                # Nothing ran. The cause is the operator's (the client learns only that the
                # store is down), and the client may come back: how soon an outage ends is
                # unknown, so a short, fixed Retry-After, as the Rust layer's.
                logger.warning("answering 503: the idempotency store is unavailable: %r", e)
                await self._answer_problem(
                    "store-unavailable",
                    "the idempotency store is unavailable",
                    extra=[(b"retry-after", str(_STORE_UNAVAILABLE_RETRY_AFTER).encode())],
                )
            else:
                await self._internal("the idempotency call failed", e)
            return
        if self.ran and self.protected and call._stored is False:
            # The handler ran, its response could not be stored (the store failed at the
            # completion): as the Rust layer, an error, never a clean end a retry would not
            # find stored.
            if self.sent_head:
                raise RuntimeError("the handler's response could not be stored")
            await self._internal("the handler's response could not be stored", RuntimeError("not stored"))
        elif self.ran:
            await self._finish()
        else:
            await self._replay(stored)

    async def _answer_problem(self, name: str, detail: str, extra: list[tuple[bytes, bytes]] | None = None) -> None:
        start, body = self.mw._problem_message(name, detail)
        if extra:
            start["headers"].extend(extra)
        await self._send(start)
        await self._send(body)

    async def _internal(self, what: str, error: BaseException) -> None:
        incident = uuid.uuid4().hex
        logger.error("%s (incident %s): %s", what, incident, error, extra={"incident": incident})
        start, body = self.mw._problem_message(
            "internal", "an internal error; the server's log has it under this incident id", incident=incident
        )
        await self._send(start)
        await self._send(body)

    async def _replay(self, stored: bytes) -> None:
        try:
            status, headers, body, omitted = _native.http_decode_response(stored)
        except ValueError as e:
            await self._internal("a stored response that cannot be read", e)
            return
        replayed = (b"idempotent-replayed", b"true")
        if omitted is not None:
            start, end = self.mw._problem_message(
                "result-unavailable",
                f"this request was executed; its response ({omitted} bytes) was too large to store",
                status=status,
            )
            start["headers"].append(replayed)
            await self._send(start)
            await self._send(end)
            return
        headers.append((b"content-length", str(len(body)).encode()))
        headers.append(replayed)
        await self._send({"type": "http.response.start", "status": status, "headers": headers})
        await self._send({"type": "http.response.body", "body": body, "more_body": False})

    async def _finish(self) -> None:
        """Stored: the handler's response's end (or all of it) goes to its client now."""
        if not self.sent_head and self.start is not None:
            await self._send(self.start)
            self.sent_head = True
        if self.held is not None:
            self.held["more_body"] = False
            await self._send(self.held)

    async def _action(self, attempt: Any) -> bytes:
        if self.client_gone:
            # Its client left while the call waited (for an owner that then released the key):
            # the handler does not run for nobody, as in the Rust layer (review L6 of `e047556`).
            raise _ClientGone()
        self.ran = True
        # Unprotected (a fail-open coordinator with the store down): nothing is stored, as said.
        self.protected = attempt.is_protected
        began = time.monotonic()
        scope = dict(self.scope)
        scope["idemkit"] = IdempotencyInfo(self.key, self.tenant, self.fingerprint, attempt.fencing_token)
        loop = asyncio.get_running_loop()
        self.head = loop.create_future()
        done: asyncio.Future[None] = loop.create_future()
        self.app_task = app = asyncio.ensure_future(self._app(scope, done))
        cancellable = self.mw.cancel_with_client
        try:
            status, headers = await (self.head if cancellable else asyncio.shield(self.head))
            if not self.final:
                # Not final: the key is released now, the response goes on to its client as
                # the handler gives it.
                self.mw._recent.append(time.monotonic() - began)
                raise _NotFinal()
            await (done if cancellable else asyncio.shield(done))
        except BaseException:
            # Only with cancel_with_client is the call cancelled (its client left): the
            # handler goes with it. Otherwise the handler runs to its end, whatever happens here.
            if cancellable and not isinstance(sys.exc_info()[1], _NotFinal) and not app.done():
                app.cancel()
            raise
        self.mw._recent.append(time.monotonic() - began)
        capture = self.capture or _native.HttpCapture(self.mw.max_result_bytes)
        # Its body, or past max_result_bytes (the kept headers counted) its status and size.
        return capture.finish(status, headers, self.mw.keep)

    async def _app(self, scope: Scope, done: asyncio.Future[None]) -> None:
        assert self.head is not None
        head = self.head
        body_given = False

        async def receive() -> Message:
            nonlocal body_given
            if not body_given:
                body_given = True
                return {"type": "http.request", "body": self.body, "more_body": False}
            if self.mw.cancel_with_client:
                await self.disconnected.wait()
                return {"type": "http.disconnect"}
            # A client that leaves does not end the handler: it never hears of it.
            await asyncio.Event().wait()
            raise AssertionError("unreachable")

        async def send(message: Message) -> None:
            kind = message["type"]
            if kind == "http.response.start":
                self.start = message
                status = int(message["status"])
                final = self.mw.final_when(status)
                if not final:
                    self.final = False
                    await self._send(message)
                    self.sent_head = True
                for name, value in message.get("headers", []):
                    if name.lower() == b"content-length":
                        with contextlib.suppress(ValueError):
                            self.announced = int(value)
                self.capture = _native.HttpCapture(self.mw.max_result_bytes, self.announced)
                head.set_result((status, _pairs(message.get("headers", []))))
                return
            if kind != "http.response.body":
                await self._send(message)
                return
            if not self.final:
                await self._send(message)
                return
            chunk = bytes(message.get("body", b""))
            more = bool(message.get("more_body", False))
            hold = self.capture.push(chunk, not more)
            if self.held is not None:
                # A frame held because it completed the announced length: the rest joins it.
                chunk = bytes(self.held.get("body", b"")) + chunk
                self.held = None
            if hold:
                # The end (or the frame that completes a Content-Length, which the client
                # takes as the end) goes out once the result is stored (`_finish`).
                self.held = {"type": "http.response.body", "body": chunk, "more_body": more}
                return
            # A stream: its head and each frame go out as the handler gives them.
            if not self.sent_head and self.start is not None:
                await self._paced(self.start)
                self.sent_head = True
            await self._paced({"type": "http.response.body", "body": chunk, "more_body": True})

        try:
            await self.mw.app(scope, receive, send)
        except BaseException as e:
            self.app_error = e
            if not head.done():
                head.set_exception(e)
            elif self.final and not done.done():
                done.set_exception(e)
            if not isinstance(e, Exception):
                raise
            return
        if not head.done():
            head.set_exception(RuntimeError("the application returned without a response"))
        elif self.final and self.held is None:
            done.set_exception(RuntimeError("the application's response has no end"))
        if not done.done():
            done.set_result(None)
