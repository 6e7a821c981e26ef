-- idemkit-postgres: the inbox table, version 1. Applied by Inbox::migrate(), which replaces
-- {schema} and {table} with the inbox's (validated) names.
--
-- One row per (consumer, message id), written in the handler's own transaction: it commits
-- or rolls back with the handler's database effects.
CREATE SCHEMA IF NOT EXISTS "{schema}";

CREATE TABLE IF NOT EXISTS "{schema}"."{table}" (
    consumer    text COLLATE "C" NOT NULL,
    message_id  text COLLATE "C" NOT NULL,
    received_at timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL,
    PRIMARY KEY (consumer, message_id)
);

CREATE INDEX IF NOT EXISTS "{table}_expires_at" ON "{schema}"."{table}" (expires_at);
