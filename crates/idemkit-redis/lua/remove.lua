-- remove: an operator's fenced delete (`idemkit purge`, the status page): delete the record,
-- reserved or completed, only while its fencing token is still the one the operator listed,
-- so a reservation taken after the listing is never deleted. Wakes waiters.
-- KEYS[1] record key  ARGV[1] fencing token (8 bytes, big-endian)
-- Returns 1, or 0 when the key holds no record of ours with that fencing token.
local v = redis.call('GET', KEYS[1])
local head = v and string.sub(v, 1, 4)
if not v or (head ~= 'IDK\1' and head ~= 'IDK\2') or string.sub(v, 23, 30) ~= ARGV[1] then
  return 0
end
local state = string.byte(v, 5)
if state ~= 1 and state ~= 2 then
  return 0
end
-- A one-second tombstone keeps the fencing token, as release.lua does, so the next
-- reservation within the same microsecond still gets a larger one (begin.lua).
redis.call('PSETEX', KEYS[1], 1000, 'IDK\1\3' .. ARGV[1])
redis.call('PUBLISH', KEYS[1] .. ':wake', '')
return 1
