# Type stubs of the native module (src/lib.rs). Private: the public API is idemkit's
# Python modules, which type-check against these.
from typing import Any, Literal, TypedDict, final

_InFlight = Literal["wait", "reject", "raise", "run"]
_OnCancel = Literal["keep", "release"]

class Store:
    """A store the coordinator can use: MemoryStore, RedisStore or PostgresStore."""

@final
class Attempt:
    @property
    def fencing_token(self) -> int | None: ...
    @property
    def downstream_key(self) -> str | None: ...
    @property
    def is_protected(self) -> bool: ...
    def is_lease_lost(self) -> bool: ...
    def lease_left(self) -> float | None: ...

@final
class Bridge:
    def __init__(self, event_loop_ref: Any | None = None) -> None: ...
    def fileno(self) -> int: ...
    def drain(self) -> list[tuple[int, bool, Any]]: ...

@final
class Begun:
    @property
    def attempt(self) -> Attempt: ...
    def complete(self, id: int, result: bytes) -> None: ...
    def unencodable(self, id: int, reason: str) -> None: ...
    def fail(self, id: int) -> None: ...
    def cancel(self) -> None: ...

@final
class Pending:
    def abort(self) -> bool: ...
    def hand_over(self, begun: Begun) -> None: ...

@final
class Coordinator:
    def __init__(
        self,
        store: Store,
        *,
        lease: float | None = None,
        wait_timeout: float | None = None,
        fail_open: bool = False,
        holder_name: str | None = None,
        on_cancel: _OnCancel = "keep",
        max_result_bytes: int | None = None,
    ) -> None: ...
    def client_pace(self, operation: str) -> float: ...
    def result_limit(self, operation: str) -> int: ...
    def begin(
        self,
        bridge: Bridge,
        id: int,
        operation: str,
        key: str,
        ttl: float,
        in_flight: _InFlight = "wait",
        fingerprint: bytes | None = None,
        scope: str | None = None,
        on_cancel: _OnCancel | None = None,
        exact_fingerprint: bool = False,
    ) -> Pending: ...

def memory_store() -> Store: ...
def _panicking_store(phase: Literal["begin", "complete"]) -> Store: ...
class _RedisAuth(TypedDict):
    ssl_ca_certs: str | None
    ssl_certfile: str | None
    ssl_keyfile: str | None
    username: str | None
    password: str | None

def redis_store(
    bridge: Bridge, id: int, url: str, prefix: str | None = None, auth: _RedisAuth | None = None
) -> None: ...
def redis_cluster_store(
    bridge: Bridge, id: int, urls: list[str], prefix: str | None = None, auth: _RedisAuth | None = None
) -> None: ...
def postgres_store(bridge: Bridge, id: int, url: str, table: str | None = None) -> None: ...
def migrate_inbox(bridge: Bridge, id: int, url: str, schema: str, table: str) -> None: ...
def validate(operation: str, key: str) -> None: ...

# The HTTP layer's decisions (src/http.rs), for idemkit.asgi.
_Headers = list[tuple[bytes, bytes]]
HTTP_PROBLEM_DOCS: str

def http_parse_key(value: bytes, lenient: bool) -> str: ...
def http_final_by_default(status: int) -> bool: ...
def http_fingerprint(
    method: str,
    path_and_query: str,
    headers: _Headers,
    body: bytes,
    canonical_json: bool = True,
    authorization: bool = True,
    chosen: list[str] = ...,
) -> bytes: ...
def http_encode_response(status: int, headers: _Headers, body: bytes, keep: list[str]) -> bytes: ...
def http_encode_omitted(status: int, size: int) -> bytes: ...
def http_decode_response(data: bytes) -> tuple[int, _Headers, bytes, int | None]: ...
def http_problem(
    name: str,
    detail: str,
    status: int | None = None,
    incident: str | None = None,
    docs: str | None = None,
) -> tuple[int, _Headers, bytes]: ...
def http_is_per_caller(name: str) -> bool: ...
