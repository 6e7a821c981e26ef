"""idempotency-kit's Dishka providers, building the drop-in's coordinator (needs dishka; the
Redis repository's provider also needs redis-py)."""

from .aio.coordinator import AsyncIdempotencyCoordinatorProvider
from .common import IdempotencyProvider
from .protocols import IdempotencySettingsProtocol

__all__ = [
    "AsyncIdempotencyCoordinatorProvider",
    "AsyncRedisIdempotencyProvider",
    "IdempotencyProvider",
    "IdempotencySettingsProtocol",
]

try:
    from .aio.redis import AsyncRedisIdempotencyProvider
except ImportError:  # pragma: no cover - without redis-py there is no Redis client to provide from
    __all__.remove("AsyncRedisIdempotencyProvider")
