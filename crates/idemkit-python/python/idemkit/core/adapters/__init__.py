"""idempotency-kit's adapters."""

from idemkit.compat import JsonResultAdapter, PydanticResultAdapter, VoidResultAdapter

__all__ = ["JsonResultAdapter", "PydanticResultAdapter", "VoidResultAdapter"]
