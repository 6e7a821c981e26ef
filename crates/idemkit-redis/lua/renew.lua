-- renew: extend the caller's live reservation to ARGV[2] ms from now.
-- KEYS[1] record key  ARGV[1] owner token  ARGV[2] lease ms
-- Returns 1, or 0 when the caller no longer owns a live reservation (nothing changes).
local v = owned_reservation(KEYS[1], ARGV[1])
if not v then
  return 0
end
local lease = tonumber(ARGV[2])
local expires = math.floor(now_us() / 1000) + lease
-- Rewrite the expiry field too, so inspection shows the renewed lease.
redis.call('SET', KEYS[1], string.sub(v, 1, 38) .. u64(expires) .. string.sub(v, 47), 'PX', lease)
return 1
