-- idemkit-postgres: the records table, version 2: who holds a reservation. The holder block
-- of idemkit's record format version 2 (lease ms u64, pid u32, host and name, each a length
-- byte and UTF-8), or NULL (written by idemkit before 0.2, or by a coordinator built
-- `without_holder`). Readers before 0.2 ignore the column; the row version stays 1.
ALTER TABLE "{schema}"."{table}" ADD COLUMN IF NOT EXISTS holder bytea;
