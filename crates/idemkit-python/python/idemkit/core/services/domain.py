"""idempotency-kit's domain service: TTL bounds, the default TTL, record models."""

from idemkit.compat import IdempotencyDomainService

__all__ = ["IdempotencyDomainService"]
