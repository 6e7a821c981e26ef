-- renew: extend the caller's live reservation to ARGV[2] ms from now.
-- KEYS[1] record key  ARGV[1] owner token (16 bytes) and fencing token (8 bytes): a lease is both, so an owner
-- token reused for a later reservation of the key cannot act on it  ARGV[2] lease ms
-- Returns 1, or 0 when the caller no longer owns a live reservation (nothing changes).
local v = redis.call('GET', KEYS[1])
-- Ours only if it is a reservation ("IDK" 1 1) and bytes 7-22 are our owner token.
if not v or string.sub(v, 1, 5) ~= 'IDK\1\1' or string.sub(v, 7, 30) ~= ARGV[1] then
  return 0
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
