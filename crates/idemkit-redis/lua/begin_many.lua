-- begin_many: begin.lua for several keys of one slot, in one script call (batch
-- reservation). Each key is answered exactly as begin.lua answers it alone (see there for the
-- record format and the reply shapes); the replies come back as one array, in KEYS order.
-- Redis' clock is read once for the whole batch, and only if a key needs it (a reservation or
-- a live owner's age; a batch of replays reads none): every key's fencing token is then at
-- least that instant in microseconds, or one past its released token (the keys are distinct,
-- so one instant serves them all).
--
-- KEYS      the record keys (distinct, one slot)
-- ARGV[1]   lease ms
-- ARGV[3i-1]  key i's flags byte and owner token (17 bytes)  ARGV[3i] its fingerprint or ''
-- ARGV[3i+1]  its holder block (record version 2) or '' (version 1)
local lease = ARGV[1]
local now
local function clock()
  if not now then
    local t = redis.call('TIME')
    now = t[1] * 1000000 + t[2]
  end
  return now
end
local out = {}
for i, key in ipairs(KEYS) do
  local owner = ARGV[3 * i - 1]
  local fingerprint_arg = ARGV[3 * i]
  local holder = ARGV[3 * i + 1]
  local v = redis.call('GET', key)
  local previous
  local reply
  if v then
    local head = string.sub(v, 1, 3) .. string.sub(v, 5, 5)
    local version = string.byte(v, 4)
    if (head == 'IDK\2' or head == 'IDK\1') and (version == 1 or version == 2) and #v >= 46 then
      local fingerprint = ''
      if string.byte(v, 6) % 2 == 1 then fingerprint = string.sub(v, 47, 62) end
      if fingerprint ~= fingerprint_arg then
        reply = 0
      elseif head == 'IDK\2' then
        reply = v
      elseif string.sub(v, 7, 22) == string.sub(owner, 2) then
        -- Ours already (a batch sent again): renewed, as begin.lua does.
        redis.call('PEXPIRE', key, lease)
        reply = struct.unpack('>I8', v, 23)
      else
        reply = {v, redis.call('PTTL', key), clock()}
      end
    elseif head ~= 'IDK\3' or version ~= 1 or #v ~= 13 then
      reply = v
    else
      previous = struct.unpack('>I8', v, 6)
    end
  end
  if reply == nil then
    local fencing = clock()
    if previous and fencing <= previous then
      fencing = previous + 1
    end
    local version = 'IDK\1\1'
    if holder ~= '' then version = 'IDK\2\1' end
    redis.call('PSETEX', key, lease,
      version .. owner .. struct.pack('>I8', fencing) .. '\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0'
        .. fingerprint_arg .. holder)
    reply = fencing
  end
  out[i] = reply
end
return out
