-- begin: reserve, or report the completed record, or the live owner, or a mismatch.
--
-- A record is idemkit_core::Record's byte format, version 1 (1-based offsets):
--   1-3 "IDK"  4 version (1)  5 state (1 reserved, 2 completed)
--   6 flags: 1 fingerprint present; 2 (Redis only, reservations only) a waiter is subscribed,
--     so complete and release publish (watch.lua sets it; clients clear it before decoding)
--   7-22 owner token  23-30 fencing  31-38 created ms  39-46 expires ms (0 here: Redis
--   keeps the expiry as the key's PX, and readers ask PTTL)
--   [47-62 fingerprint]  completed only: kind(1) length(4) result bytes
-- A release leaves a tombstone "IDK" 1 3 fencing(8) for one second (see release.lua).
--
-- KEYS[1] record key
-- ARGV[1] owner token (16 bytes)  ARGV[2] lease ms  ARGV[3] fingerprint (16 bytes) or ''
-- Returns an integer > 0     reserved for the caller; the integer is its fencing token
--         0                  a live record with another fingerprint
--         a string           a live completed record with the same fingerprint (replay), or
--                            bytes that are not a record of ours (the client reports Corrupt)
--         {record, pttl}     a live reservation with the same fingerprint (in flight)
-- Each branch is as short as it can be: Redis runs one script at a time, and at high
-- concurrency its CPU per call is idemkit's throughput.
local key = KEYS[1]
local v = redis.call('GET', key)
local previous = 0
if v then
  local head = string.sub(v, 1, 5)
  if head == 'IDK\1\2' or head == 'IDK\1\1' then
    local fingerprint = ''
    if string.byte(v, 6) % 2 == 1 then fingerprint = string.sub(v, 47, 62) end
    if fingerprint ~= ARGV[3] then
      return 0
    end
    if head == 'IDK\1\2' then
      return v
    end
    return {v, redis.call('PTTL', key)}
  end
  if head ~= 'IDK\1\3' or #v ~= 13 then
    -- Foreign or damaged bytes: change nothing, hand them to the client to report.
    return v
  end
  -- A release tombstone: the key is free, but the next token must exceed its token.
  local hi, lo = struct.unpack('>I4I4', string.sub(v, 6, 13))
  previous = hi * 4294967296 + lo
end
-- Absent (never used, released, or expired by PX): reserve. The fencing token is Redis'
-- clock in microseconds, or one past a released token if that is larger: a reservation
-- after an expiry comes at least one lease (>= 3 ms) after the expired token was issued.
-- Integers stay exact in Lua's doubles below 2^53; Unix microseconds are about 2^51.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local fencing = math.max(now, previous + 1)
local created = math.floor(now / 1000)
local flags = '\0'
if #ARGV[3] == 16 then flags = '\1' end
redis.call('SET', key,
  'IDK\1\1' .. flags .. ARGV[1]
    .. struct.pack('>I4I4I4I4', math.floor(fencing / 4294967296), fencing % 4294967296,
                   math.floor(created / 4294967296), created % 4294967296)
    .. '\0\0\0\0\0\0\0\0' .. ARGV[3],
  'PX', ARGV[2])
return fencing
