-- renew: extend the caller's live reservation to ARGV[2] ms from now.
-- KEYS[1] record key  ARGV[1] owner token (16 bytes) and fencing token (8 bytes): a lease is both, so an owner
-- token reused for a later reservation of the key cannot act on it  ARGV[2] lease ms
-- Returns 1 (renewed, or already completed by this very lease: a renewal that crossed its
-- owner's completion, nothing to extend and nothing lost), or 0 when the caller no longer
-- owns the key (nothing changes).
local v = redis.call('GET', KEYS[1])
-- Ours only if bytes 7-30 are our owner and fencing tokens (a 13-byte tombstone never is).
if not v or string.sub(v, 7, 30) ~= ARGV[1] then
  return 0
end
local head = string.sub(v, 1, 5)
if head == 'IDK\1\1' or head == 'IDK\2\1' then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if head == 'IDK\1\2' or head == 'IDK\2\2' then
  return 1
end
return 0
