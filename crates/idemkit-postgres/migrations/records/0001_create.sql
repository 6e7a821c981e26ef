-- idemkit-postgres: the records table, version 1. Applied by PgStore::migrate(), which
-- replaces {schema} and {table} with the store's (validated) names.
--
-- One row per key. `version` is the row format (1); a row with any other value, or with
-- fields no writer produces, is reported as a corrupt record and never overwritten while it
-- lives. Expiry is decided by the database's clock (clock_timestamp()), to the microsecond.
CREATE SCHEMA IF NOT EXISTS "{schema}";

CREATE TABLE IF NOT EXISTS "{schema}"."{table}" (
    key         text COLLATE "C" PRIMARY KEY,
    version     smallint    NOT NULL,
    state       smallint    NOT NULL,            -- 1 reserved, 2 completed
    owner       bytea       NOT NULL,            -- the owner token, 16 bytes
    fencing     bigint      NOT NULL,            -- from the sequence below
    fingerprint bytea,                           -- 16 bytes, or NULL
    created_at  timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL,            -- end of the lease, or of the retention
    waiting     boolean     NOT NULL DEFAULT false, -- a waiter listens: completion notifies
    kind        smallint,                        -- completed: 1 value, 2 permanent error, 3 unavailable
    result      bytea                            -- completed: the encoded result
);

-- Purges walk expired rows oldest first.
CREATE INDEX IF NOT EXISTS "{table}_expires_at" ON "{schema}"."{table}" (expires_at);

-- One sequence per table: fencing tokens strictly increase per key, even after a row is
-- released or purged.
CREATE SEQUENCE IF NOT EXISTS "{schema}"."{table}_fencing" AS bigint;
