-- begin: reserve, or report the completed record, or the live owner, or a mismatch.
--
-- A record is idemkit_core::Record's byte format, version 1 (1-based offsets):
--   1-3 "IDK"  4 version (1)  5 state (1 reserved, 2 completed)
--   6 flags: 1 fingerprint present; 2 (Redis only, reservations only) a waiter is subscribed,
--     so complete and release publish (watch.lua sets it; clients clear it before decoding)
--   7-22 owner token  23-30 fencing  31-38 created ms  39-46 expires ms
--   [47-62 fingerprint]  version 2 only: the holder block (lease ms u64, pid u32, host and
--   name, each a length byte and UTF-8)  completed only: kind(1) length(4) result bytes
-- Redis writes 0 for created and expires: the expiry is the key's PX (readers ask PTTL), and
-- the creation time is the fencing token's (Unix microseconds, see below), which the client
-- derives when it reads a record.
-- A release leaves a tombstone "IDK" 1 3 fencing(8) for one second (see release.lua).
--
-- KEYS[1] record key
-- ARGV[1] flags byte (1 with a fingerprint, else 0) and owner token (16 bytes)
-- ARGV[2] lease ms  ARGV[3] fingerprint (16 bytes) or ''
-- ARGV[4] the holder block (record version 2), or '' (version 1)
-- Returns an integer > 0     reserved for the caller (now, or already by this same owner
--                            token: a retried begin whose first reply was lost, whose lease
--                            it then renews); the integer is its fencing token
--         0                  a live record with another fingerprint
--         a string           a live completed record with the same fingerprint (replay), or
--                            bytes that are not a record of ours (the client reports Corrupt)
--         {record, pttl, now} a live reservation of another owner with the same fingerprint
--                            (in flight), its remaining lease (ms; -1 if it has no expiry) and
--                            Redis' clock in microseconds (how long it has been held)
-- Each branch is as short as it can be: Redis runs one script at a time, and at high
-- concurrency its CPU per call is idemkit's throughput. The client builds what it can (the
-- flags and owner in one argument) and the script converts numbers once: every argument,
-- library call and temporary string is measurable here (see docs/benchmarks.md).
local key = KEYS[1]
local v = redis.call('GET', key)
local previous
if v then
  -- "IDK" and the state; the version (byte 4) is 1 or 2 for a record of ours.
  local head = string.sub(v, 1, 3) .. string.sub(v, 5, 5)
  local version = string.byte(v, 4)
  if (head == 'IDK\2' or head == 'IDK\1') and (version == 1 or version == 2) and #v >= 46 then
    local fingerprint = ''
    if string.byte(v, 6) % 2 == 1 then fingerprint = string.sub(v, 47, 62) end
    if fingerprint ~= ARGV[3] then
      return 0
    end
    if head == 'IDK\2' then
      return v
    end
    if string.sub(v, 7, 22) == string.sub(ARGV[1], 2) then
      -- Ours already: this begin was sent again (its first reply was lost, or a batch's
      -- claim is being confirmed). It renews the lease, as renew.lua would, so the lease
      -- runs from now, as its caller counts it.
      redis.call('PEXPIRE', key, ARGV[2])
      return struct.unpack('>I8', v, 23)
    end
    local t = redis.call('TIME')
    return {v, redis.call('PTTL', key), t[1] * 1000000 + t[2]}
  end
  if head ~= 'IDK\3' or version ~= 1 or #v ~= 13 then
    -- Foreign or damaged bytes (a record head too short to be one included): change
    -- nothing, hand them to the client to report.
    return v
  end
  -- A release tombstone: the key is free, but the next token must exceed its token.
  previous = struct.unpack('>I8', v, 6)
end
-- Absent (never used, released, or expired by PX): reserve. The fencing token is Redis'
-- clock in microseconds, or one past a released token if that is larger: a reservation
-- after an expiry comes at least one lease (>= 3 ms) after the expired token was issued.
-- Integers stay exact in Lua's doubles below 2^53; Unix microseconds are about 2^51.
local t = redis.call('TIME')
local fencing = t[1] * 1000000 + t[2]
if previous and fencing <= previous then
  fencing = previous + 1
end
local version = 'IDK\1\1'
if ARGV[4] ~= '' then version = 'IDK\2\1' end
redis.call('PSETEX', key, ARGV[2],
  version .. ARGV[1] .. struct.pack('>I8', fencing) .. '\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0'
    .. ARGV[3] .. ARGV[4])
return fencing
