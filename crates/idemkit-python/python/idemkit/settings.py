"""idempotency-kit's settings model (this module needs pydantic)."""

from pydantic import BaseModel, Field

from idemkit.compat import (
    DEFAULT_IN_FLIGHT_LEASE_SECONDS,
    DEFAULT_IN_FLIGHT_MODE,
    DEFAULT_ON_STORAGE_ERROR,
    DEFAULT_TTL_MINUTES,
    MAX_TTL_SECONDS,
    MIN_TTL_SECONDS,
    InFlightMode,
    StorageErrorMode,
)


class BaseIdempotencySettings(BaseModel):
    """What the Dishka providers (``idemkit.dishka``) build the coordinator from; subclass it
    with pydantic-settings' ``BaseSettings`` to read it from the environment."""

    enabled: bool = Field(default=True, description="False makes every call a pass-through")
    key_prefix: str = Field(description="The records' key prefix (idemkit's prefix, without a trailing ':')")
    metrics_enabled: bool = Field(default=False, description="Prometheus metrics (needs prometheus-client)")
    default_ttl_minutes: int = Field(default=DEFAULT_TTL_MINUTES, description="The default TTL, in minutes")
    min_ttl_seconds: int = Field(default=MIN_TTL_SECONDS, description="The smallest TTL a record may have")
    max_ttl_seconds: int = Field(default=MAX_TTL_SECONDS, description="The largest; above it a call runs uncached")
    operation_ttls: dict[str, int] = Field(default_factory=dict, description="TTLs by operation, in seconds")
    in_flight: InFlightMode = Field(default=DEFAULT_IN_FLIGHT_MODE, description="wait, raise or run")
    in_flight_lease_seconds: int = Field(
        default=DEFAULT_IN_FLIGHT_LEASE_SECONDS, description="The reservation's lease, renewed while the action runs"
    )
    on_storage_error: StorageErrorMode = Field(
        default=DEFAULT_ON_STORAGE_ERROR, description="run the action unprotected, or raise, when the store is down"
    )


__all__ = ["BaseIdempotencySettings"]
