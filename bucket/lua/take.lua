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
local fs, lims, ps, costs, ttls, fields, fills, vals = {}, {}, {}, {}, {}, {}, {}, {}
local sinces, guards = {}, {}
for i = 1, n do
  local b = 2 + (i - 1) * NARG
  local f = ALG[ARGV[b + 1]]
  if not f then
    return redis.error_reply('ERR bucket: unknown algorithm ' .. tostring(ARGV[b + 1]))
  end
  fs[i] = f
  lims[i] = tonumber(ARGV[b + 2])
  ps[i] = tonumber(ARGV[b + 3])
  costs[i] = tonumber(ARGV[b + 4])
  ttls[i] = tonumber(ARGV[b + 5])
  fields[i] = ARGV[b + 6]
  fills[i] = tonumber(ARGV[b + 7])
  if not fills[i] or fills[i] < 0 or fills[i] > lims[i] then
    return redis.error_reply('ERR bucket: fill ' .. tostring(ARGV[b + 7]) .. ' outside 0..capacity')
  end
  sinces[i] = tonumber(ARGV[b + 8])
  if not sinces[i] or sinces[i] < 0 then
    return redis.error_reply('ERR bucket: since ' .. tostring(ARGV[b + 8]) .. ' is not an instant')
  end
  if ARGV[b + 9] ~= '0' and ARGV[b + 9] ~= '1' then
    return redis.error_reply('ERR bucket: guard ' .. tostring(ARGV[b + 9]) .. ', want 0 or 1')
  end
  guards[i] = ARGV[b + 9] == '1'
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
local markers = {}
local function born()
  local b = 0
  if guards[cur] then
    local mk = 'rl:m:' .. (string.match(KEYS[cur], '{g%.%d+}') or KEYS[cur])
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
  if sinces[cur] > b then b = sinces[cur] end
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

-- An all-or-nothing take reads every bucket first and charges only when
-- each would admit; the keys of one such call are distinct (TakeAll).
local charge, pre = true, op == 't' and n > 1
if pre then
  for i = 1, n do
    vals[i] = read(i)
  end
  for i = 1, n do
    cur = i
    local ok = fs[i](op, vals[i], now, lims[i], ps[i], costs[i], ttls[i] * 1000, false, fills[i], born)
    if not ok then
      charge = false
      break
    end
  end
end
local reply = {}
for i = 1, n do
  local v
  if pre then v = vals[i] else v = read(i) end
  cur = i
  local ok, rem, retry, reset, val = fs[i](op, v, now, lims[i], ps[i], costs[i], ttls[i] * 1000, charge, fills[i], born)
  if fields[i] == '' then
    if val == false then
      redis.call('DEL', KEYS[i])
    elseif val then
      redis.call('SET', KEYS[i], val, 'PX', ttls[i])
    end
  else
    if val == false then
      redis.call('HDEL', KEYS[i], fields[i])
    elseif val then
      local created = redis.call('HSET', KEYS[i], fields[i], val)
      redis.call('PEXPIRE', KEYS[i], ttls[i])
      if created == 1 then
        prune(KEYS[i], fields[i], STALE[ARGV[2 + (i - 1) * NARG + 1]], ttls[i] * 1000)
      end
    end
  end
  local a = 0
  if ok and charge then a = 1 end
  reply[#reply + 1] = a
  reply[#reply + 1] = lims[i]
  reply[#reply + 1] = rem
  reply[#reply + 1] = retry
  reply[#reply + 1] = reset
  reply[#reply + 1] = now
end
return reply
