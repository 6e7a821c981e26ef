"""The coordinator's Dishka provider."""

from dishka import Provider, Scope, provide

from idemkit.compat import (
    DEFAULT_IN_FLIGHT_LEASE_SECONDS,
    DEFAULT_IN_FLIGHT_MODE,
    DEFAULT_ON_STORAGE_ERROR,
    AsyncIdempotencyCoordinator,
    AsyncIdempotencyRepository,
    IdempotencyDomainService,
    IdempotencyMetricsProtocol,
)

from ..protocols import IdempotencySettingsProtocol


class AsyncIdempotencyCoordinatorProvider(Provider):
    """Provides ``AsyncIdempotencyCoordinator`` from the repository, the domain service, the
    metrics and the settings. APP scope: one coordinator (and one store) per container."""

    scope = Scope.APP

    @provide
    def get_coordinator(
        self,
        repository: AsyncIdempotencyRepository,
        domain_service: IdempotencyDomainService,
        settings: IdempotencySettingsProtocol,
        metrics: IdempotencyMetricsProtocol,
    ) -> AsyncIdempotencyCoordinator:
        # Settings written before a field existed lack it: it means the default.
        return AsyncIdempotencyCoordinator(
            repository=repository,
            domain_service=domain_service,
            operation_ttls=settings.operation_ttls,
            metrics=metrics,
            enabled=getattr(settings, "enabled", True),
            in_flight=getattr(settings, "in_flight", DEFAULT_IN_FLIGHT_MODE),
            in_flight_lease_seconds=getattr(settings, "in_flight_lease_seconds", DEFAULT_IN_FLIGHT_LEASE_SECONDS),
            on_storage_error=getattr(settings, "on_storage_error", DEFAULT_ON_STORAGE_ERROR),
        )


__all__ = ["AsyncIdempotencyCoordinatorProvider"]
