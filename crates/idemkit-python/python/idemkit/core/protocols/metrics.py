"""idempotency-kit's metrics protocol and its no-op implementation."""

from idemkit.compat import IdempotencyMetricsProtocol, NoOpIdempotencyMetrics

__all__ = ["IdempotencyMetricsProtocol", "NoOpIdempotencyMetrics"]
