-- complete: replace the caller's live reservation with its outcome, kept for ARGV[2] ms,
-- and wake waiters.
-- KEYS[1] record key
-- ARGV[1] owner token (16 bytes) and fencing token (8 bytes): a lease is both, so an owner
-- token reused for a later reservation of the key cannot act on it  ARGV[2] ttl ms
-- ARGV[3] the outcome as the record's tail: kind (1 byte), length (4 bytes), bytes
-- Returns 1, or 0 when the caller no longer owns the key (nothing changes).
-- The wake-up channel is the key followed by ':wake' (same hash tag, so same Cluster slot);
-- on a Cluster the client loads this script with SPUBLISH in place of PUBLISH.
local key = KEYS[1]
local v = redis.call('GET', key)
if not v or string.sub(v, 7, 30) ~= ARGV[1] then
  -- Expired, released, taken over, or foreign: a stale owner must not write.
  return 0
end
local head = string.sub(v, 1, 5)
-- Version 1 or 2 (a holder block), kept as it is.
if head == 'IDK\1\1' or head == 'IDK\2\1' then
  -- State 2; flags, owner, fencing, created and expiry (0), fingerprint kept from the
  -- reservation; then the outcome.
  local flags = string.byte(v, 6)
  if flags < 2 then
    redis.call('PSETEX', key, ARGV[2], string.sub(v, 1, 4) .. '\2' .. string.sub(v, 6) .. ARGV[3])
  else
    -- A waiter asked to be woken (most completions have nobody waiting, and a publication
    -- is a sizeable part of this script's cost): drop the "watched" flag and publish.
    redis.call('PSETEX', key, ARGV[2],
      string.sub(v, 1, 4) .. '\2' .. string.char(flags - 2) .. string.sub(v, 7) .. ARGV[3])
    redis.call('PUBLISH', key .. ':wake', '')
  end
  return 1
end
if head == 'IDK\1\2' or head == 'IDK\2\2' then
  -- Completed by this very lease already: a retried completion is a no-op.
  return 1
end
-- Our owner bytes in something that is not our record: not ours to write.
return 0
