"""idempotency-kit's exception names: each is the idemkit class, so ``except`` clauses
written for either catch both."""

from idemkit._errors import (
    IdemkitError as IdempotencyError,
    InProgress as IdempotencyInProgressError,
    InvalidKey as IdempotencyValidationError,
    InvalidTTL as IdempotencyInvalidTTLError,
    KeyCollision as IdempotencyKeyCollisionError,
    KeyReused as IdempotencyKeyReuseError,
    RecordExpired as IdempotencyRecordExpiredError,
    StoreError as IdempotencyStorageError,
)

__all__ = [
    "IdempotencyError",
    "IdempotencyInProgressError",
    "IdempotencyInvalidTTLError",
    "IdempotencyKeyCollisionError",
    "IdempotencyKeyReuseError",
    "IdempotencyRecordExpiredError",
    "IdempotencyStorageError",
    "IdempotencyValidationError",
]
