"""idempotency-kit's decorator."""

from idemkit.compat import async_idempotent

__all__ = ["async_idempotent"]
