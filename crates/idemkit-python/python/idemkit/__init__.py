"""idemkit: effects that happen once under at-least-once delivery, on the idemkit Rust core.

    coordinator = idemkit.Coordinator(await idemkit.RedisStore.connect("redis://127.0.0.1:6379"))
    receipt = await coordinator.call("mail.invoice", "order-9.invoice", ttl=86400).run(send_invoice, 9)

The action receives its ``Attempt`` (fencing token, downstream key, lease) first. Records are
the Rust crate's: a Python worker and a Rust service on one store deduplicate each other.
The idempotency-kit API (``AsyncIdempotencyCoordinator.coordinate``, ``async_idempotent``,
its adapters and exceptions) is here too, for code written for it: see ``idemkit.compat``.
"""

import importlib.util as _importlib_util

from ._coordinator import (
    DEFAULT_TTL,
    Attempt,
    Call,
    Coordinator,
    MemoryStore,
    PostgresStore,
    RedisStore,
    Store,
)
from ._errors import (
    ConfigError,
    DecodeError,
    Holder,
    IdemkitError,
    InProgress,
    InvalidKey,
    InvalidTTL,
    KeyCollision,
    KeyReused,
    RecordExpired,
    ResultUnavailable,
    StoreError,
    StoreUnavailable,
)
from ._decorator import idempotent, per_process
from .inbox import Inbox
from .consumer import InboxHandler
from .codecs import BYTES, JSON, BytesCodec, Codec, JsonCodec, PydanticCodec
from .compat import (
    AsyncIdempotencyCoordinator,
    AsyncIdempotencyRepository,
    IdempotencyDomainService,
    IdempotencyMetricsProtocol,
    JsonResultAdapter,
    MemoryIdempotencyRepository,
    NoOpIdempotencyMetrics,
    PostgresIdempotencyRepository,
    PydanticResultAdapter,
    RedisAsyncIdempotencyRepository,
    ResultAdapter,
    VoidResultAdapter,
    async_idempotent,
    fingerprint_of,
)

from .core.exceptions import (
    IdempotencyError,
    IdempotencyInProgressError,
    IdempotencyInvalidTTLError,
    IdempotencyKeyCollisionError,
    IdempotencyKeyReuseError,
    IdempotencyRecordExpiredError,
    IdempotencyStorageError,
    IdempotencyValidationError,
)

__version__ = "0.1.0"

__all__ = [
    "BYTES",
    "DEFAULT_TTL",
    "JSON",
    "AsyncIdempotencyCoordinator",
    "AsyncIdempotencyRepository",
    "Attempt",
    "BytesCodec",
    "Call",
    "Codec",
    "ConfigError",
    "Coordinator",
    "DecodeError",
    "Holder",
    "IdemkitError",
    "IdempotencyDomainService",
    "IdempotencyError",
    "IdempotencyInProgressError",
    "IdempotencyInvalidTTLError",
    "IdempotencyKeyCollisionError",
    "IdempotencyKeyReuseError",
    "IdempotencyMetricsProtocol",
    "IdempotencyRecordExpiredError",
    "IdempotencyStorageError",
    "IdempotencyValidationError",
    "InProgress",
    "Inbox",
    "InboxHandler",
    "InvalidKey",
    "InvalidTTL",
    "JsonCodec",
    "JsonResultAdapter",
    "KeyCollision",
    "KeyReused",
    "MemoryIdempotencyRepository",
    "MemoryStore",
    "NoOpIdempotencyMetrics",
    "PostgresIdempotencyRepository",
    "PostgresStore",
    "PydanticCodec",
    "PydanticResultAdapter",
    "RecordExpired",
    "RedisAsyncIdempotencyRepository",
    "RedisStore",
    "ResultAdapter",
    "ResultUnavailable",
    "Store",
    "StoreError",
    "StoreUnavailable",
    "VoidResultAdapter",
    "async_idempotent",
    "fingerprint_of",
    "idempotent",
    "per_process",
]

# idempotency-kit's record models are pydantic models: loaded on first use, so that idemkit
# imports without pydantic (``pip install idemkit[pydantic]`` brings it); in ``__all__`` when
# pydantic is there, so that ``from idemkit import *`` works either way.
if _importlib_util.find_spec("pydantic") is not None:
    __all__ += ["IdempotencyIdentifiers", "IdempotencyRecord"]


def __getattr__(name: str) -> object:
    if name in ("IdempotencyRecord", "IdempotencyIdentifiers"):
        from .core.models import entities

        return getattr(entities, name)
    raise AttributeError(f"module 'idemkit' has no attribute {name!r}")
