"""idempotency-kit's protocols."""
