"""idempotency-kit's record models, as pydantic models (this module needs pydantic).

The identifiers are checked by the idemkit core's own rules (``idemkit._native.validate``): a
key may hold ``:`` (idemkit's records cannot collide on it), limits are UTF-8 bytes (512 for a
key, 128 for an operation) and whitespace is refused, not stripped. The drop-in's coordinator
does not store these models (its records are the core's): they are here for code that builds
or inspects them, as idempotency-kit's users and tests do.
"""

from datetime import datetime, timedelta, timezone
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, JsonValue, model_validator

from idemkit import _native
from idemkit._errors import InvalidKey

R = TypeVar("R", bound="IdempotencyRecord")


class IdempotencyIdentifiers(BaseModel):
    """An operation and its idempotency key, validated as the idemkit core validates them."""

    operation: str = Field(min_length=1, description="Operation name (e.g. 'user.create')")
    idempotency_key: str = Field(min_length=1, description="The key naming this effect")

    @model_validator(mode="after")
    def _valid_for_the_core(self) -> "IdempotencyIdentifiers":
        try:
            _native.validate(self.operation, self.idempotency_key)
        except InvalidKey as e:
            # pydantic turns a ValueError into its ValidationError, as idempotency-kit raises.
            raise ValueError(str(e)) from None
        return self


def _now() -> datetime:
    return datetime.now(timezone.utc)


class IdempotencyRecord(IdempotencyIdentifiers):
    """A result kept under its key (``status="completed"``), or an in-flight reservation
    (``status="pending"``, ``result=None``, ``expires_at`` its lease)."""

    model_config = ConfigDict(frozen=True)

    result: JsonValue = Field(description="The result as the adapter encoded it (null for a void result)")
    created_at: datetime = Field(description="When the record was made")
    expires_at: datetime = Field(description="When the record expires")
    status: Literal["pending", "completed"] = Field(default="completed")
    fingerprint: str | None = Field(default=None, description="The request's fingerprint, if it had one")

    @classmethod
    def create(
        cls: type[R],
        operation: str,
        idempotency_key: str,
        result: Any,
        ttl_seconds: float,
        fingerprint: str | None = None,
    ) -> R:
        """A completed record that expires ``ttl_seconds`` from now."""
        now = _now()
        return cls(
            operation=operation,
            idempotency_key=idempotency_key,
            result=result,
            created_at=now,
            expires_at=now + timedelta(seconds=ttl_seconds),
            fingerprint=fingerprint,
        )

    @classmethod
    def pending(
        cls: type[R], operation: str, idempotency_key: str, lease_seconds: float, fingerprint: str | None = None
    ) -> R:
        """The reservation of an action about to run, for ``lease_seconds``."""
        now = _now()
        return cls(
            operation=operation,
            idempotency_key=idempotency_key,
            result=None,
            created_at=now,
            expires_at=now + timedelta(seconds=lease_seconds),
            status="pending",
            fingerprint=fingerprint,
        )

    @property
    def is_pending(self) -> bool:
        """Whether this is an in-flight reservation rather than a stored result."""
        return self.status == "pending"

    @property
    def is_expired(self) -> bool:
        """Whether ``expires_at`` has passed."""
        return _now() >= self.expires_at

    @property
    def ttl_seconds(self) -> float:
        """Seconds left until ``expires_at`` (0 once expired)."""
        return max(0.0, (self.expires_at - _now()).total_seconds())


__all__ = ["IdempotencyIdentifiers", "IdempotencyRecord"]
