"""idempotency-kit's adapter protocol (generic: ``ResultAdapter[Order]``)."""

from idemkit.compat import ResultAdapter

__all__ = ["ResultAdapter"]
