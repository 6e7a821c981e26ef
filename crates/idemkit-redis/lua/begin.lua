-- begin: reserve, or report the completed record, or the live owner, or a mismatch.
-- KEYS[1] record key
-- ARGV[1] owner token (16 bytes)  ARGV[2] lease ms  ARGV[3] fingerprint (16 bytes) or ''
-- Returns {0, fencing}        reserved for the caller
--         {1, record, pttl}   a live record with the same fingerprint (the client decodes it:
--                             reserved -> in flight for pttl ms, completed -> replay)
--         {2}                 a live record with another fingerprint
--         {3, bytes}          bytes that are not a record of ours (the client reports Corrupt)
local key = KEYS[1]
local v = redis.call('GET', key)
local previous = 0
if v then
  if string.sub(v, 1, 4) == MAGIC and string.byte(v, 5) == 3 and #v == 13 then
    -- A release tombstone: the key is free, but the next token must exceed its token.
    previous = read_u64(v, 6)
  elseif string.sub(v, 1, 4) ~= MAGIC or #v < 46 then
    -- Foreign or damaged bytes: change nothing, let the client report them.
    return {3, v}
  else
    local fingerprint = ''
    if string.byte(v, 6) == 1 then fingerprint = string.sub(v, 47, 62) end
    if fingerprint ~= ARGV[3] then
      return {2}
    end
    return {1, v, redis.call('PTTL', key)}
  end
end
-- Absent (never used, released, or expired by PX): reserve. The fencing token is Redis'
-- clock in microseconds, or one past the released token if that is larger: a reservation
-- after an expiry comes at least one lease (>= 3 ms) after the expired token was issued.
local now = now_us()
local fencing = math.max(now, previous + 1)
local now_ms = math.floor(now / 1000)
local lease = tonumber(ARGV[2])
local flags = '\0'
if #ARGV[3] == 16 then flags = '\1' end
redis.call('SET', key,
  MAGIC .. '\1' .. flags .. ARGV[1] .. u64(fencing) .. u64(now_ms) .. u64(now_ms + lease) .. ARGV[3],
  'PX', lease)
return {0, fencing}
