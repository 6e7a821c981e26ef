"""idempotency-kit's coordinator, run by the idemkit core."""

from idemkit.compat import AsyncIdempotencyCoordinator

__all__ = ["AsyncIdempotencyCoordinator"]
