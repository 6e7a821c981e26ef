-- begin: reserve, or report the live record (completed, or another owner's reservation).
--
-- A record is idemkit_core::Record's byte format, version 1 or 2 (1-based offsets):
--   1-3 "IDK"  4 version (1 or 2)  5 state (1 reserved, 2 completed)
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
-- ARGV[1] the new reservation's bytes 1-22 ("IDK", version, state 1, flags, owner token)
-- ARGV[2] lease ms
-- ARGV[3] its bytes from 31 on (created and expires as 16 zero bytes, the fingerprint if
--         any, the holder block if version 2): the client builds all but the fencing token
-- ARGV[4] (optional) a fencing token (8 bytes) the client stamped into a reservation it made
--         with plain commands and found too old (src/stamp.rs): if the key holds that
--         reservation of the caller's, its token is taken again from the clock, here
-- Returns an integer > 0     reserved for the caller (now, or already by this same owner
--                            token: a retried begin whose first reply was lost, whose lease
--                            it then renews); the integer is its fencing token
--         0                  the caller's own reservation, made with another fingerprint
--         a string           the live record of another reservation, completed (the client
--                            compares the fingerprint: a replay or a mismatch), or bytes
--                            that are not a record of ours (the client reports Corrupt)
--         {record, pttl, now} a live reservation of another owner (the client compares the
--                            fingerprint: in flight or a mismatch), its remaining lease (ms;
--                            -1 if it has no expiry) and Redis' clock in microseconds
-- Redis runs one script at a time, and at high concurrency its CPU per call is idemkit's
-- throughput, so the common case is one command: SET ... NX ... GET writes the reservation
-- if the key is absent and otherwise returns what is there, unchanged. Comparing
-- fingerprints, which only needs the bytes a replay returns anyway, is the client's
-- (docs/benchmarks.md has what each command, argument and string costs in here).
local key, head, lease, rest = KEYS[1], ARGV[1], ARGV[2], ARGV[3]
-- The fencing token is Redis' clock in microseconds (one past a released token if that is
-- larger, below): a reservation after an expiry comes at least one lease (>= 3 ms) after the
-- expired token was issued. Integers stay exact in Lua's doubles below 2^53; Unix
-- microseconds are about 2^51.
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local v = redis.call('SET', key, head .. struct.pack('>I8', now) .. rest, 'NX', 'PX', lease, 'GET')
if not v then
  -- Absent (never used, or expired by PX): reserved.
  return now
end
local a, b, c, version, state = string.byte(v, 1, 5)
if a == 73 and b == 68 and c == 75 then -- "IDK"
  if (version == 1 or version == 2) and #v >= 46 then
    if state == 2 then
      return v
    end
    if state == 1 then
      if string.sub(v, 7, 22) == string.sub(head, 7) then
        -- Ours already: this begin was sent again (its first reply was lost, or a batch's
        -- claim is being confirmed). With the same fingerprint it renews the lease, as
        -- renew.lua would, so the lease runs from now, as its caller counts it.
        local fingerprint = ''
        if string.byte(v, 6) % 2 == 1 then fingerprint = string.sub(v, 47, 62) end
        local ours = ''
        if string.byte(head, 6) % 2 == 1 then ours = string.sub(rest, 17, 32) end
        if fingerprint ~= ours then
          return 0
        end
        redis.call('PEXPIRE', key, lease)
        if ARGV[4] and string.sub(v, 23, 30) == ARGV[4] then
          -- The stamp was not proven newer than every earlier token of the key, the clock's
          -- now is (ARCHITECTURE row R13). The stamp was never handed to anyone, so the new
          -- token need not exceed it; and it must not be pushed past the clock, or a later
          -- plain stamp could fall under it.
          redis.call('SETRANGE', key, 22, struct.pack('>I8', now))
          return now
        end
        return struct.unpack('>I8', v, 23)
      end
      return {v, redis.call('PTTL', key), now}
    end
  elseif version == 1 and state == 3 and #v == 13 then
    -- A release tombstone: the key is free, but the new token must exceed the released one.
    local fencing = struct.unpack('>I8', v, 6)
    if fencing < now then fencing = now else fencing = fencing + 1 end
    redis.call('PSETEX', key, lease, head .. struct.pack('>I8', fencing) .. rest)
    return fencing
  end
end
-- Foreign or damaged bytes (a record head too short to be one included): changed nothing,
-- handed to the client to report.
return v
