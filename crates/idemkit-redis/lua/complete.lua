-- complete: replace the caller's live reservation with its outcome, kept for ARGV[1] ms,
-- and wake waiters.
-- KEYS[1] record key
-- ARGV[1] ttl ms
-- ARGV[2] the caller's reservation as it wrote it (see begin.lua for the format): every byte
--         when the caller knows them; always its owner token and fencing token (bytes 7-30:
--         a lease is both, so an owner token reused for a later reservation of the key
--         cannot act on it)
-- ARGV[3] the completed record: ARGV[2] with state 2, then kind (1 byte), length (4 bytes),
--         bytes
-- Returns 1, or 0 when the caller no longer owns the key (nothing changes).
-- The wake-up channel is the key followed by ':wake' (same hash tag, so same Cluster slot);
-- on a Cluster the client loads this script with SPUBLISH in place of PUBLISH.
local key, ttl, mine, done = KEYS[1], ARGV[1], ARGV[2], ARGV[3]
local v = redis.call('GET', key)
if v == mine then
  -- Byte for byte the reservation the caller made (so ours, live, and nobody waits: a
  -- waiter's flag would differ): the client's record is written as it is. Most completions.
  redis.call('PSETEX', key, ttl, done)
  return 1
end
if not v or string.sub(v, 7, 30) ~= string.sub(mine, 7, 30) then
  -- Expired, released, taken over, or foreign: a stale owner must not write.
  return 0
end
local a, b, c, version, state, flags = string.byte(v, 1, 6)
if a ~= 73 or b ~= 68 or c ~= 75 or (version ~= 1 and version ~= 2) then
  -- Our owner bytes in something that is not our record: not ours to write.
  return 0
end
if state == 2 then
  -- Completed by this very lease already: a retried completion is a no-op.
  return 1
end
if state ~= 1 then
  return 0
end
-- Ours, but not the bytes the caller sent: a waiter asked to be woken, or the caller did not
-- say what it reserved with. The record is built from the reservation held: state 2, the
-- "watched" flag dropped, then the outcome.
local outcome = string.sub(done, #mine + 1)
if flags < 2 then
  redis.call('PSETEX', key, ttl, string.sub(v, 1, 4) .. '\2' .. string.sub(v, 6) .. outcome)
else
  redis.call('PSETEX', key, ttl,
    string.sub(v, 1, 4) .. '\2' .. string.char(flags - 2) .. string.sub(v, 7) .. outcome)
  redis.call('PUBLISH', key .. ':wake', '')
end
return 1
