"""The exceptions of idemkit: one per kind of the Rust core's ``Error``.

Each also carries the name idempotency-kit gives the same condition (``IdempotencyError``,
``IdempotencyInProgressError`` ...), so that code written for that library catches ours.
"""

from __future__ import annotations

from typing import Any, NamedTuple


class IdemkitError(Exception):
    """Every error of idemkit. Nothing ran when one is raised, unless its class says so."""

    #: The call's operation and key, when the error belongs to a call (``KeyCollision``'s key:
    #: idempotency-kit's list of keys).
    operation: str | None = None
    key: str | list[str] | None = None


class InvalidKey(IdemkitError, ValueError):
    """An operation, key, scope or fingerprint failed validation; nothing ran."""

    def __init__(self, message: str, errors: list[Any] | None = None) -> None:
        super().__init__(message)
        self.errors = errors or []


class ConfigError(IdemkitError, ValueError):
    """The call's policy cannot work (a TTL above the store's maximum, ...); nothing ran."""


class InProgress(IdemkitError):
    """Another caller holds the key (``in_flight="reject"``, or a wait that timed out); nothing ran.

    ``retry_after`` is when to come back, in seconds: a queue worker requeues with it, an HTTP
    handler answers 409 with ``Retry-After``. The error points to the original: ``attempt`` is
    its id (its reservation's fencing token, the same for as long as it runs: what
    ``idemkit inspect`` and the log's ``fencing`` show), ``holder`` the process running it
    (a ``Holder``: host, pid, name; every store reports it, ``None`` only for a reservation
    made without one), ``lease_left`` the seconds left on its lease. Built as
    ``InProgress(message, retry_after=...)``, or as idempotency-kit builds its
    ``IdempotencyInProgressError``: ``(operation, key)``.
    """

    def __init__(
        self,
        message: str,
        retry_after: float | str = 0.0,
        lease_left: float = 0.0,
        held_for: float | None = None,
        attempt: int | None = None,
        holder: tuple[str, int, str] | None = None,
    ) -> None:
        if isinstance(retry_after, str):
            # idempotency-kit's form: (operation, key).
            self.operation, self.key = message, retry_after
            message = f"Idempotency record for operation '{message}', key '{retry_after}' is still in flight"
            retry_after = 0.0
        super().__init__(message)
        self.retry_after = retry_after
        self.lease_left = lease_left
        self.held_for = held_for
        self.attempt = attempt
        self.holder = Holder(*holder) if holder is not None else None


class Holder(NamedTuple):
    """The process that holds a reservation, as the reservation records it."""

    host: str
    pid: int
    name: str


class KeyReused(IdemkitError):
    """The key was first used with a different request fingerprint; nothing ran.

    Built as ``KeyReused(message)``, or as idempotency-kit builds its
    ``IdempotencyKeyReuseError``: ``(operation, key, stored_fingerprint, fingerprint)``.
    ``stored_fingerprint`` and ``fingerprint`` are the two fingerprints when they are known:
    the drop-in (``AsyncIdempotencyCoordinator``) knows them; the native ``Coordinator`` keeps
    a digest in the store, and leaves them ``None``.
    """

    def __init__(self, *args: Any) -> None:
        self.stored_fingerprint: str | None = None
        self.fingerprint: str | None = None
        if len(args) == 4:
            operation, key, stored, given = args
            self.operation, self.key = operation, key
            self.stored_fingerprint, self.fingerprint = stored, given
            args = (
                f"Idempotency key '{key}' for operation '{operation}' was used for a different request: "
                f"stored fingerprint '{stored}', got '{given}'",
            )
        elif len(args) == 3:
            self.stored_fingerprint, self.fingerprint = args[1], args[2]
            args = args[:1]
        super().__init__(*args)


class ResultUnavailable(IdemkitError):
    """The action succeeded on an earlier call but its result could not be stored (too large,
    or the codec failed): the effect happened, and it does not run again within the TTL."""


class DecodeError(IdemkitError):
    """A stored result could not be decoded with this call's codec (a foreign writer, a
    changed type); nothing ran."""


class StoreError(IdemkitError):
    """The store failed or answered with something it should not hold (a corrupt record);
    for the reservation and the wait, nothing ran.

    ``phase`` (``begin``, ``complete`` ...) and ``kind`` (``Unavailable``, ``Corrupt`` ...) say
    where and how, for an error of the core. Built as idempotency-kit builds its
    ``IdempotencyStorageError``: ``(message, operation=None, original_error=None)``.
    """

    def __init__(
        self,
        message: str,
        operation: str | None = None,
        original_error: BaseException | None = None,
        *,
        phase: str | None = None,
        kind: str | None = None,
    ) -> None:
        super().__init__(message)
        self.operation = operation
        self.original_error = original_error
        self.phase = phase
        self.kind = kind


class StoreUnavailable(StoreError):
    """The store could not be reached (refused, timed out, down)."""


class RecordExpired(IdemkitError):
    """idempotency-kit's ``IdempotencyRecordExpiredError``: kept for code that catches it.
    idemkit never raises it (an expired record is simply absent)."""

    def __init__(self, operation: str, key: str) -> None:
        super().__init__(f"Idempotency record expired for operation '{operation}', key '{key}'")
        self.operation, self.key = operation, key


class KeyCollision(IdemkitError):
    """idempotency-kit's ``IdempotencyKeyCollisionError``: kept for code that catches it.
    idemkit never raises it (a collision is a reservation someone else holds: ``InProgress``,
    or a wait)."""

    def __init__(self, operation: str, key: str | list[str]) -> None:
        super().__init__(f"Idempotency key collision for operation '{operation}', keys {key!r}")
        self.operation, self.key = operation, key


class InvalidTTL(ConfigError):
    """A TTL outside the allowed range (not positive, or above the store's maximum)."""

    def __init__(self, ttl_seconds: float, min_ttl: float = 0.0, max_ttl: float = float("inf")) -> None:
        super().__init__(f"Invalid TTL {ttl_seconds}s. Must be between {min_ttl}s and {max_ttl}s")
        self.ttl_seconds, self.min_ttl, self.max_ttl = ttl_seconds, min_ttl, max_ttl


def _store_error(unavailable: bool, message: str, phase: str, kind: str) -> StoreError:
    """A store error of the core, as the native module raises it."""
    cls = StoreUnavailable if unavailable else StoreError
    return cls(message, phase=phase, kind=kind)
