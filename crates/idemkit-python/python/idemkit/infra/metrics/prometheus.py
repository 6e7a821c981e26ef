"""idempotency-kit's Prometheus metrics (this module needs ``prometheus-client``).

The same metric names and labels as idempotency-kit's, so dashboards keep working:
``{prefix}_idempotency_operations_total`` (``operation``, ``status``: hit, miss, collision,
``error_<type>``) and ``{prefix}_idempotency_operation_duration_seconds`` (``operation``,
``method``). The drop-in's coordinator reports hits, misses, collisions and errors; it records
no latencies of its own (the idemkit core's metrics do: ``docs/metrics.md``).
"""

from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram

from idemkit.compat import IdempotencyMetricsProtocol

_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class PrometheusIdempotencyMetrics(IdempotencyMetricsProtocol):
    """Counters and a histogram on ``registry`` (the default registry when ``None``).

    A registry takes a name once: a second instance with the same prefix on the same
    registry raises from prometheus-client; ``get_idempotency_metrics`` gives one per prefix.
    """

    def __init__(self, prefix: str | None = None, registry: CollectorRegistry | None = None) -> None:
        name = f"{prefix}_" if prefix else ""
        registry = REGISTRY if registry is None else registry
        self._operations: Any = Counter(
            f"{name}idempotency_operations_total",
            "Total number of idempotent operations",
            ["operation", "status"],
            registry=registry,
        )
        self._duration: Any = Histogram(
            f"{name}idempotency_operation_duration_seconds",
            "Latency of idempotency operations",
            ["operation", "method"],
            buckets=_BUCKETS,
            registry=registry,
        )

    def record_hit(self, operation: str) -> None:
        self._operations.labels(operation=operation, status="hit").inc()

    def record_miss(self, operation: str) -> None:
        self._operations.labels(operation=operation, status="miss").inc()

    def record_collision(self, operation: str) -> None:
        self._operations.labels(operation=operation, status="collision").inc()

    def record_error(self, operation: str, error_type: str) -> None:
        self._operations.labels(operation=operation, status=f"error_{error_type}").inc()

    def record_latency(self, operation: str, method: str, duration_seconds: float) -> None:
        self._duration.labels(operation=operation, method=method).observe(duration_seconds)

    def record_bulk_hit(self, operation: str, count: int) -> None:
        self._operations.labels(operation=operation, status="hit").inc(count)

    def record_bulk_miss(self, operation: str, count: int) -> None:
        self._operations.labels(operation=operation, status="miss").inc(count)


_BY_PREFIX: dict[str | None, PrometheusIdempotencyMetrics] = {}


def get_idempotency_metrics(prefix: str | None = None) -> PrometheusIdempotencyMetrics:
    """The one ``PrometheusIdempotencyMetrics`` of ``prefix`` on the default registry, made on
    first use (a container rebuilt per test gets the same instance, not a duplicate series)."""
    key = prefix or None
    metrics = _BY_PREFIX.get(key)
    if metrics is None:
        metrics = _BY_PREFIX[key] = PrometheusIdempotencyMetrics(prefix=key)
    return metrics


__all__ = ["PrometheusIdempotencyMetrics", "get_idempotency_metrics"]
