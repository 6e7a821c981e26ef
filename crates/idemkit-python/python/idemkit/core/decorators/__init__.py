"""idempotency-kit's decorators."""
