-- take.lua: the entry point, concatenated after common.lua and the
-- algorithm files. One call decides for every bucket atomically.
--
-- Layout (bucket/group.go): every key carries the hash tag {g.<group>} of
-- its subject's group (FNV-1a of the subject modulo the store's group
-- count), so all buckets of one subject share a Redis Cluster slot.
--   token bucket: KEYS[i] = rl:v<version>:{g.<group>}:<policy>, a hash;
--     field = the subject (a digest "~..." for subjects over 48 bytes),
--     value = the packed bucket. The hash gets PEXPIRE ttl on every write,
--     so a group idle for its TTL disappears.
--   other algorithms: KEYS[i] = rl:v<version>:{g.<group>}:<policy>:<subject>,
--     a string with PX ttl.
--
-- KEYS[i]: the keys above (one group: they share a hash tag and slot).
-- ARGV[1]: 't' take (cost 0 peeks), 'i' independent takes or 'r' refund.
-- ARGV[2]: '' to read Redis TIME (production); tests pass a time in
--          microseconds here to drive a differential test. Nothing but the
--          tests ever sets it.
-- ARGV[3+9*(i-1) .. 11+9*(i-1)] for KEYS[i]: algorithm code ('tb', 'fw',
--          'sw', 'sl'), capacity in units, p (refill in units per
--          microsecond, or the window in microseconds), cost in units,
--          idle TTL in milliseconds, field ('' for a string key), fill:
--          the units a token bucket this call creates starts with (the
--          capacity: full; window algorithms ignore it), since: the
--          instant (microseconds) the key's version came into force (0:
--          long ago), guard: '1' to consult the group's loss marker, '0'
--          not to.
--
-- Lost state: an absent bucket (never written, expired, or lost with the
-- store's data) reads as one lost at born = the later of since and, with
-- guard '1', the loss marker of its group: the string key rl:m:{g.<group>}
-- (the bucket's hash tag, so the same slot), without TTL, holding the
-- instant it was created. A call that needs the marker and finds none
-- creates it at now: the store has lost its state (a restart without
-- persistence, FLUSHALL, a failover to a replica that never had it) or is
-- new. A bucket lost at born starts as the algorithm says (token bucket:
-- empty at born; window algorithms: full in born's window); long after
-- born this is what a new bucket starts with anyway.
-- Reply: for each bucket six integers: allowed (1/0), capacity (units),
--          remaining (units), retry-after (microseconds), reset-after
--          (microseconds), and the instant of the decision (microseconds
--          since the Unix epoch: Redis TIME, or ARGV[2]).
-- A take ('t') is all or nothing: if one bucket denies, no bucket is
-- charged and every bucket reports allowed 0 (only a token-bucket clamp is
-- still written). Independent takes ('i') and refunds decide each bucket
-- on its own, in order, as that many calls of one bucket would: the Redis
-- store merges concurrent single-bucket calls into one such call, where
-- one bucket may appear more than once, so each bucket is read just
-- before it is decided.
--
-- Pruning: each write that creates a field in a group hash samples
-- PRUNE_SAMPLE random fields (HRANDFIELD) and deletes those STALE for twice
-- the TTL: such a field reads as a full bucket already, and the second TTL
-- keeps a Redis TIME that steps back by less than one TTL (a failover) from
-- reviving it. Only a creation adds a field, so sampling on creations alone
-- bounds the stale fields (bucket/doc.go) and costs nothing on the common
-- write, an update of a live field.
local PRUNE_SAMPLE = 4
local op = ARGV[1]
local now = now_us()
local n = #KEYS
local NARG = 9
if #ARGV ~= 2 + NARG * n then
  return redis.error_reply('ERR bucket: want ' .. (2 + NARG * n) .. ' arguments, got ' .. #ARGV)
end
if op ~= 't' and op ~= 'i' and op ~= 'r' then
  return redis.error_reply('ERR bucket: unknown operation ' .. tostring(op))
end
-- num is ARGV[b + k] as a number, for argument k of bucket i (whose
-- arguments start after ARGV[b]), stored in col: the previous bucket's
-- when its argument k is the same string. A policy's numbers (capacity,
-- refill, cost, TTL) repeat in every bucket of it that a merged call
-- carries, and tonumber (strtod) costs more than the rest of a bucket's
-- arguments.
local function num(col, i, b, k)
  local s = ARGV[b + k]
  if i > 1 and s == ARGV[b + k - NARG] then
    return col[i - 1]
  end
  return tonumber(s)
end
-- A bucket's since and guard are read only when it is absent (born); here
-- they are validated, at the cost of a comparison in the common case
-- (since '0', fill the capacity's string).
local fs, lims, ps, costs, ttls, fields, fills = {}, {}, {}, {}, {}, {}, {}
for i = 1, n do
  local b = 2 + (i - 1) * NARG
  local f = ALG[ARGV[b + 1]]
  if not f then
    return redis.error_reply('ERR bucket: unknown algorithm ' .. tostring(ARGV[b + 1]))
  end
  fs[i] = f
  lims[i] = num(lims, i, b, 2)
  ps[i] = num(ps, i, b, 3)
  costs[i] = num(costs, i, b, 4)
  ttls[i] = num(ttls, i, b, 5)
  fields[i] = ARGV[b + 6]
  if ARGV[b + 7] == ARGV[b + 2] then
    fills[i] = lims[i]
  else
    fills[i] = num(fills, i, b, 7)
    if not fills[i] or fills[i] < 0 or fills[i] > lims[i] then
      return redis.error_reply('ERR bucket: fill ' .. tostring(ARGV[b + 7]) .. ' outside 0..capacity')
    end
  end
  if ARGV[b + 8] ~= '0' then
    local since = tonumber(ARGV[b + 8])
    if not since or since < 0 then
      return redis.error_reply('ERR bucket: since ' .. tostring(ARGV[b + 8]) .. ' is not an instant')
    end
  end
  if ARGV[b + 9] ~= '0' and ARGV[b + 9] ~= '1' then
    return redis.error_reply('ERR bucket: guard ' .. tostring(ARGV[b + 9]) .. ', want 0 or 1')
  end
  if fields[i] ~= '' and not STALE[ARGV[b + 1]] then
    return redis.error_reply('ERR bucket: algorithm ' .. ARGV[b + 1] .. ' cannot live in a group hash')
  end
end

local function read(i)
  if fields[i] == '' then
    return redis.call('GET', KEYS[i])
  end
  return redis.call('HGET', KEYS[i], fields[i])
end

-- born returns the instant at which bucket cur may have been lost (see
-- Lost state above); markers caches the markers this call has read.
local cur
local markers
local function born()
  local b = 0
  local a = 2 + (cur - 1) * NARG
  if ARGV[a + 9] == '1' then
    local mk = 'rl:m:' .. (string.match(KEYS[cur], '{g%.%d+}') or KEYS[cur])
    markers = markers or {}
    b = markers[mk]
    if not b then
      b = tonumber(redis.call('GET', mk) or '0') or 0
      if b == 0 then
        b = now
        redis.call('SET', mk, string.format('%.0f', now))
      end
      markers[mk] = b
    end
  end
  local since = tonumber(ARGV[a + 8])
  if since > b then b = since end
  return b
end

local function prune(key, field, stale, ttl)
  local sample = redis.call('HRANDFIELD', key, PRUNE_SAMPLE, 'WITHVALUES')
  for j = 1, #sample, 2 do
    if sample[j] ~= field and stale(sample[j + 1], now, 2 * ttl) then
      redis.call('HDEL', key, sample[j])
    end
  end
end

-- reply holds six integers per bucket (see Reply above); answer sets
-- bucket i's.
local reply = {}
local function answer(i, ok, rem, retry, reset)
  local r = 6 * (i - 1)
  local a = 0
  if ok then a = 1 end
  reply[r + 1] = a
  reply[r + 2] = lims[i]
  reply[r + 3] = rem
  reply[r + 4] = retry
  reply[r + 5] = reset
  reply[r + 6] = now
end

-- An all-or-nothing take reads every bucket first and decides each as
-- charged: whether a bucket admits does not depend on charging it. When
-- every bucket admits, those decisions stand and are written as they are;
-- when one denies, every bucket is decided again, uncharged. The keys of
-- one such call are distinct (TakeAll).
local charge, pre = true, op == 't' and n > 1
local vals, outs
if pre then
  vals, outs = {}, {}
  for i = 1, n do
    vals[i] = read(i)
  end
  for i = 1, n do
    cur = i
    local ok, rem, retry, reset, val = fs[i](op, vals[i], now, lims[i], ps[i], costs[i], ttls[i] * 1000, true, fills[i], born)
    if not ok then
      charge = false
      break
    end
    answer(i, true, rem, retry, reset)
    outs[i] = val
  end
end
for i = 1, n do
  local val
  if pre and charge then
    val = outs[i]
  else
    local v
    if pre then v = vals[i] else v = read(i) end
    cur = i
    local ok, rem, retry, reset
    ok, rem, retry, reset, val = fs[i](op, v, now, lims[i], ps[i], costs[i], ttls[i] * 1000, charge, fills[i], born)
    answer(i, ok and charge, rem, retry, reset)
  end
  -- The TTL goes to Redis as the argument's string: a number would be
  -- formatted (printf) on every write.
  local b = 2 + (i - 1) * NARG
  if fields[i] == '' then
    if val == false then
      redis.call('DEL', KEYS[i])
    elseif val then
      redis.call('SET', KEYS[i], val, 'PX', ARGV[b + 5])
    end
  else
    if val == false then
      redis.call('HDEL', KEYS[i], fields[i])
    elseif val then
      local created = redis.call('HSET', KEYS[i], fields[i], val)
      redis.call('PEXPIRE', KEYS[i], ARGV[b + 5])
      if created == 1 then
        prune(KEYS[i], fields[i], STALE[ARGV[b + 1]], ttls[i] * 1000)
      end
    end
  end
end
return reply
