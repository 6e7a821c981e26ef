"""What the Dishka providers read their settings from (``BaseIdempotencySettings`` has it all)."""

from typing import Protocol, runtime_checkable

from idemkit.compat import InFlightMode, StorageErrorMode


@runtime_checkable
class IdempotencySettingsProtocol(Protocol):
    """The settings the providers need. ``enabled``, ``in_flight``, ``in_flight_lease_seconds``
    and ``on_storage_error`` may be absent: they then mean the defaults."""

    @property
    def enabled(self) -> bool: ...
    @property
    def key_prefix(self) -> str: ...
    @property
    def metrics_enabled(self) -> bool: ...
    @property
    def default_ttl_minutes(self) -> int: ...
    @property
    def min_ttl_seconds(self) -> int: ...
    @property
    def max_ttl_seconds(self) -> int: ...
    @property
    def operation_ttls(self) -> dict[str, int]: ...
    @property
    def in_flight(self) -> InFlightMode: ...
    @property
    def in_flight_lease_seconds(self) -> int: ...
    @property
    def on_storage_error(self) -> StorageErrorMode: ...


__all__ = ["IdempotencySettingsProtocol"]
