"""idempotency-kit's metrics implementations."""
