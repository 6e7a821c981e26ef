"""The asyncio coordinator's Dishka providers."""

from .coordinator import AsyncIdempotencyCoordinatorProvider

__all__ = ["AsyncIdempotencyCoordinatorProvider", "AsyncRedisIdempotencyProvider"]

try:
    from .redis import AsyncRedisIdempotencyProvider
except ImportError:  # pragma: no cover - without redis-py there is no Redis client to provide from
    __all__.remove("AsyncRedisIdempotencyProvider")
