-- complete: replace the caller's live reservation with its outcome, kept for ARGV[3] ms,
-- and wake waiters.
-- KEYS[1] record key
-- ARGV[1] owner token  ARGV[2] outcome kind (one byte)  ARGV[3] ttl ms  ARGV[4] outcome bytes
-- ARGV[5] wake-up channel  ARGV[6] 'PUBLISH' or 'SPUBLISH' (Cluster: stays in the shard)
-- Returns 1, or 0 when the caller no longer owns the key (nothing changes).
local key = KEYS[1]
local v = redis.call('GET', key)
if not v or string.sub(v, 1, 4) ~= MAGIC or string.sub(v, 7, 22) ~= ARGV[1] then
  -- Expired, released, taken over, or foreign: a stale owner must not write.
  return 0
end
local state = string.byte(v, 5)
if state == 2 then
  -- Completed by this very owner already: a retried completion is a no-op.
  return 1
end
if state ~= 1 then
  return 0
end
local ttl = tonumber(ARGV[3])
local expires = math.floor(now_us() / 1000) + ttl
-- Header with state 2 and the new expiry; flags, owner, fencing, created and fingerprint
-- are kept from the reservation.
local record = MAGIC .. '\2' .. string.sub(v, 6, 38) .. u64(expires) .. string.sub(v, 47, 62)
  .. ARGV[2] .. struct.pack('>I4', #ARGV[4]) .. ARGV[4]
redis.call('SET', key, record, 'PX', ttl)
redis.call(ARGV[6], ARGV[5], '')
return 1
