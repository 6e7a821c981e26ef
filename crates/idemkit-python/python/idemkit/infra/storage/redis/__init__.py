"""idempotency-kit's module path, for code that imports from it."""
