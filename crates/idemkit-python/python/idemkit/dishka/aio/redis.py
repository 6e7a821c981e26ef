"""The Redis repository's Dishka provider (needs redis-py for the client's type)."""

from dishka import Provider, Scope, provide
from redis.asyncio import Redis, RedisCluster

from idemkit.compat import AsyncIdempotencyRepository, IdempotencyMetricsProtocol, RedisAsyncIdempotencyRepository

from ..protocols import IdempotencySettingsProtocol


class AsyncRedisIdempotencyProvider(Provider):
    """Provides ``AsyncIdempotencyRepository`` on Redis from a ``Redis | RedisCluster`` client
    (Dishka matches that key exactly, as idempotency-kit's provider asks for it). The client
    gives the address; idemkit keeps connections of its own."""

    scope = Scope.APP

    @provide
    def get_repository(
        self,
        redis: Redis | RedisCluster,
        settings: IdempotencySettingsProtocol,
        metrics: IdempotencyMetricsProtocol,
    ) -> AsyncIdempotencyRepository:
        return RedisAsyncIdempotencyRepository(redis=redis, key_prefix=settings.key_prefix, metrics=metrics)


__all__ = ["AsyncRedisIdempotencyProvider"]
