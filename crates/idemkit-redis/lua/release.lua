-- release: delete the caller's live reservation and wake waiters.
-- KEYS[1] record key  ARGV[1] owner token (16 bytes) and fencing token (8 bytes): a lease is both, so an owner
-- token reused for a later reservation of the key cannot act on it
-- Returns 1, or 0 when the caller no longer owns a live reservation (nothing changes).
-- The wake-up channel is the key followed by ':wake'; on a Cluster the client loads this
-- script with SPUBLISH in place of PUBLISH.
local v = redis.call('GET', KEYS[1])
local head = v and string.sub(v, 1, 5)
if not v or (head ~= 'IDK\1\1' and head ~= 'IDK\2\1') or string.sub(v, 7, 30) ~= ARGV[1] then
  return 0
end
-- Not a plain DEL: a one-second tombstone "IDK" 1 3 fencing keeps the fencing token, so a
-- reservation within the same microsecond still gets a larger one (begin.lua).
redis.call('PSETEX', KEYS[1], 1000, 'IDK\1\3' .. string.sub(v, 23, 30))
if string.byte(v, 6) >= 2 then
  redis.call('PUBLISH', KEYS[1] .. ':wake', '')
end
return 1
