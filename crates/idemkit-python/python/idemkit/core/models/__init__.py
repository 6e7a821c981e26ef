"""idempotency-kit's record models (they need pydantic)."""

from .entities import IdempotencyIdentifiers, IdempotencyRecord

__all__ = ["IdempotencyIdentifiers", "IdempotencyRecord"]
