-- Shared by every idemkit script (prepended at build time).
--
-- A record is the binary format of idemkit_core::Record, version 1 (1-based offsets):
--   1-3 "IDK"  4 version (1)  5 state (1 reserved, 2 completed)  6 flags (1: fingerprint)
--   7-22 owner token  23-30 fencing  31-38 created ms  39-46 expires ms
--   [47-62 fingerprint]  completed only: kind(1) length(4) result bytes
-- A release leaves a tombstone "IDK" 1 3 fencing(8) for one second, so that a reservation
-- right after it still gets a larger fencing token (see begin.lua).
-- Integers are big-endian; Lua numbers hold them exactly below 2^53 (Unix microseconds do).

local MAGIC = 'IDK\1'

local function u64(n)
  return struct.pack('>I4I4', math.floor(n / 4294967296), n % 4294967296)
end

local function read_u64(s, at)
  local hi, lo = struct.unpack('>I4I4', string.sub(s, at, at + 7))
  return hi * 4294967296 + lo
end

-- Redis' own clock, never the client's: expiry is decided here.
local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- The live reservation of ARGV owner, or nil: exists, is ours, is reserved (state 1).
local function owned_reservation(key, owner)
  local v = redis.call('GET', key)
  if v and string.sub(v, 1, 4) == MAGIC and string.byte(v, 5) == 1
      and string.sub(v, 7, 22) == owner then
    return v
  end
  return nil
end
