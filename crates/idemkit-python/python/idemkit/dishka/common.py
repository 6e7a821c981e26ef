"""The domain service and the metrics collector, for any coordinator."""

from dishka import Provider, Scope, provide

from idemkit.compat import IdempotencyDomainService, IdempotencyMetricsProtocol, NoOpIdempotencyMetrics

from .protocols import IdempotencySettingsProtocol


class IdempotencyProvider(Provider):
    """Provides ``IdempotencyDomainService`` and ``IdempotencyMetricsProtocol`` (Prometheus's,
    one per process, when ``settings.metrics_enabled``; a no-op otherwise). APP scope."""

    scope = Scope.APP

    @provide
    def get_service(self, settings: IdempotencySettingsProtocol) -> IdempotencyDomainService:
        return IdempotencyDomainService(
            default_ttl_minutes=settings.default_ttl_minutes,
            min_ttl_seconds=settings.min_ttl_seconds,
            max_ttl_seconds=settings.max_ttl_seconds,
        )

    @provide
    def get_metrics(self, settings: IdempotencySettingsProtocol) -> IdempotencyMetricsProtocol:
        if settings.metrics_enabled:
            from idemkit.infra.metrics.prometheus import get_idempotency_metrics

            return get_idempotency_metrics()
        return NoOpIdempotencyMetrics()


__all__ = ["IdempotencyProvider"]
