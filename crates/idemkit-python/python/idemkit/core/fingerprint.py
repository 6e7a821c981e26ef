"""idempotency-kit's ``fingerprint_of``: the same digest for the same values."""

from idemkit.compat import fingerprint_of

__all__ = ["fingerprint_of"]
