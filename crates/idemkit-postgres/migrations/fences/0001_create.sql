-- idemkit-postgres: the fences table, version 1. Applied by Fences::migrate(), which replaces
-- {schema} and {table} with the fences' (validated) names.
--
-- One row per resource: the highest fencing token that has written it. Advanced in the
-- writer's own transaction, so the mark commits or rolls back with the write it guards.
CREATE SCHEMA IF NOT EXISTS "{schema}";

CREATE TABLE IF NOT EXISTS "{schema}"."{table}" (
    resource    text COLLATE "C" PRIMARY KEY,
    fencing     bigint      NOT NULL,
    written_at  timestamptz NOT NULL
);
