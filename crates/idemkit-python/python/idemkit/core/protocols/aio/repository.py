"""The drop-in's repository base class (an idemkit store's address, not idempotency-kit's
``get``/``save`` protocol: see ``docs/python.md``)."""

from idemkit.compat import AsyncIdempotencyRepository

__all__ = ["AsyncIdempotencyRepository"]
