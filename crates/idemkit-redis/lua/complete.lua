-- complete: replace the caller's live reservation with its outcome, kept for ARGV[3] ms,
-- and wake waiters.
-- KEYS[1] record key
-- ARGV[1] owner token (16 bytes)  ARGV[2] outcome kind (one byte)  ARGV[3] ttl ms
-- ARGV[4] outcome bytes  ARGV[5] wake-up channel  ARGV[6] 'PUBLISH' or 'SPUBLISH'
-- Returns 1, or 0 when the caller no longer owns the key (nothing changes).
local key = KEYS[1]
local v = redis.call('GET', key)
if not v or string.sub(v, 1, 3) ~= 'IDK' or string.sub(v, 7, 22) ~= ARGV[1] then
  -- Expired, released, taken over, or foreign: a stale owner must not write.
  return 0
end
local head = string.sub(v, 1, 5)
if head == 'IDK\1\2' then
  -- Completed by this very owner already: a retried completion is a no-op.
  return 1
end
if head ~= 'IDK\1\1' then
  return 0
end
-- State 2; owner, fencing, created, expiry (0) and fingerprint kept from the reservation,
-- the "watched" flag dropped; then the outcome.
local flags = string.byte(v, 6)
redis.call('SET', key,
  'IDK\1\2' .. string.char(flags % 2) .. string.sub(v, 7) .. ARGV[2]
    .. struct.pack('>I4', #ARGV[4]) .. ARGV[4],
  'PX', ARGV[3])
-- Publish only when a waiter asked to be woken: most completions have nobody waiting, and
-- a publication is a sizeable part of this script's cost.
if flags >= 2 then
  redis.call(ARGV[6], ARGV[5], '')
end
return 1
