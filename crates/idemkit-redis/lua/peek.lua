-- peek: one key's bytes, its time left and the server's clock, read together (for scans:
-- `idemkit list`, `purge`, `stats`). Reads only.
-- KEYS[1] record key
-- Returns {bytes or nil, PTTL in ms, TIME}.
return {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1]), redis.call('TIME')}
