"""idempotency-kit's constants. The key and operation limits are idemkit's (UTF-8 bytes)."""

from idemkit.compat import (
    DEFAULT_IN_FLIGHT_LEASE_SECONDS,
    DEFAULT_IN_FLIGHT_MODE,
    DEFAULT_ON_STORAGE_ERROR,
    DEFAULT_TTL_MINUTES,
    MAX_KEY_LENGTH,
    MAX_OPERATION_LENGTH,
    MAX_TTL_SECONDS,
    MIN_TTL_SECONDS,
    InFlightMode,
    StorageErrorMode,
)

__all__ = [
    "DEFAULT_IN_FLIGHT_LEASE_SECONDS",
    "DEFAULT_IN_FLIGHT_MODE",
    "DEFAULT_ON_STORAGE_ERROR",
    "DEFAULT_TTL_MINUTES",
    "MAX_KEY_LENGTH",
    "MAX_OPERATION_LENGTH",
    "MAX_TTL_SECONDS",
    "MIN_TTL_SECONDS",
    "InFlightMode",
    "StorageErrorMode",
]
