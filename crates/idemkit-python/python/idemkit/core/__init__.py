"""idempotency-kit's ``core`` package path, for code that imports from it: each module
re-exports the drop-in's names (``idemkit.compat``)."""
