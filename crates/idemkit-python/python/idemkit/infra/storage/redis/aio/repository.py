"""idempotency-kit's module path, for code that imports from it."""

from idemkit.compat import RedisAsyncIdempotencyRepository

__all__ = ["RedisAsyncIdempotencyRepository"]
