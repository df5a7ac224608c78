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
-- ARGV[3]: guard: '1' to consult the loss markers (see Lost state), '0'
--          not to; one store's setting, so one per call.
-- ARGV[4]: m, the number of parameter sets that follow (1 to #KEYS).
-- ARGV[5+7*(j-1) .. 11+7*(j-1)], parameter set j: algorithm code ('tb',
--          'fw', 'sw', 'sl'), capacity in units, p (refill in units per
--          microsecond, or the window in microseconds), cost in units,
--          idle TTL in milliseconds, fill: the units a token bucket this
--          call creates starts with (the capacity: full; window algorithms
--          ignore it), since: the instant (microseconds) the key's version
--          came into force (0: long ago).
-- Then for each KEYS[i], in order: the number j of its parameter set, in
--          decimal ('1' to m), and, only when set j's algorithm keeps its
--          buckets in a group hash (the token bucket), the bucket's field.
-- The buckets of one policy at one share and cost carry the same set, so
-- a merged call of many of them sends the policy's numbers once, not once
-- per bucket: every argument costs Redis a parse, an object and a Lua
-- string.
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
-- Reply: the instant of the decision (microseconds since the Unix epoch:
--          Redis TIME, or ARGV[2]), then for each bucket four integers:
--          allowed (1/0), remaining (units), retry-after (microseconds)
--          and reset-after (microseconds). The capacity is the caller's
--          own argument, and one call decides at one instant.
-- A take ('t') is all or nothing: if one bucket denies, no bucket is
-- charged and every bucket reports allowed 0 (only a token-bucket clamp is
-- still written). Independent takes ('i') and refunds decide each bucket
-- on its own, in order, as that many calls of one bucket would: the Redis
-- store merges concurrent single-bucket calls into one such call, where
-- one bucket may appear more than once, so each bucket is read just
-- before it is decided.
--
-- Pruning: each write that creates a field in a group hash prunes the
-- group (prune_group, common.lua).
local op = ARGV[1]
local now = now_us()
local n = #KEYS
local guard = ARGV[3]
local NSET = 7
local m = tonumber(ARGV[4])
if not m or m < 1 or m > n or m % 1 ~= 0 then
  return redis.error_reply('ERR bucket: ' .. tostring(ARGV[4]) .. ' parameter sets for ' .. n .. ' keys, want 1 to ' .. n)
end
if #ARGV < 4 + NSET * m + n then
  return redis.error_reply('ERR bucket: ' .. #ARGV .. ' arguments, want at least ' .. (4 + NSET * m + n) .. ' for ' .. n .. ' keys and ' .. m .. ' parameter sets')
end
if op ~= 't' and op ~= 'i' and op ~= 'r' then
  return redis.error_reply('ERR bucket: unknown operation ' .. tostring(op))
end
if guard ~= '0' and guard ~= '1' then
  return redis.error_reply('ERR bucket: guard ' .. tostring(guard) .. ', want 0 or 1')
end
-- sets[j] is parameter set j: its algorithm's code (alg) and function
-- (f), capacity (lim), p, cost, TTL in microseconds (ttl) and as the
-- argument's string of milliseconds (ttlarg: a number would be formatted,
-- printf, on every write), fill and since.
local sets = {}
for j = 1, m do
  local b = 4 + (j - 1) * NSET
  local alg = ARGV[b + 1]
  local f = ALG[alg]
  if not f then
    return redis.error_reply('ERR bucket: unknown algorithm ' .. tostring(alg))
  end
  local lim = tonumber(ARGV[b + 2])
  local fill = lim
  if ARGV[b + 6] ~= ARGV[b + 2] then
    fill = tonumber(ARGV[b + 6])
    if not fill or fill < 0 or fill > lim then
      return redis.error_reply('ERR bucket: fill ' .. tostring(ARGV[b + 6]) .. ' outside 0..capacity')
    end
  end
  local since = 0
  if ARGV[b + 7] ~= '0' then
    since = tonumber(ARGV[b + 7])
    if not since or since < 0 then
      return redis.error_reply('ERR bucket: since ' .. tostring(ARGV[b + 7]) .. ' is not an instant')
    end
  end
  sets[j] = {
    alg = alg, f = f, lim = lim, p = tonumber(ARGV[b + 3]), cost = tonumber(ARGV[b + 4]),
    ttl = tonumber(ARGV[b + 5]) * 1000, ttlarg = ARGV[b + 5], fill = fill, since = since,
  }
end
-- bs[i] is the parameter set of bucket i, fields[i] its field ('' for a
-- string key); named holds the sets by the strings the buckets name them
-- with, so that a call of many buckets parses each set number once.
local bs, fields, named = {}, {}, {}
local a = 5 + NSET * m
for i = 1, n do
  local name = ARGV[a]
  if not name then
    return redis.error_reply('ERR bucket: ' .. #ARGV .. ' arguments end before key ' .. i .. ' of ' .. n .. ' (' .. m .. ' parameter sets)')
  end
  local s = named[name]
  if not s then
    s = sets[tonumber(name)]
    if not s then
      return redis.error_reply('ERR bucket: key ' .. i .. ' names parameter set ' .. name .. ', want 1 to ' .. m)
    end
    named[name] = s
  end
  bs[i] = s
  if STALE[s.alg] then
    fields[i] = ARGV[a + 1]
    if not fields[i] then
      return redis.error_reply('ERR bucket: ' .. #ARGV .. ' arguments end before the field of key ' .. i .. ' of ' .. n)
    end
    if fields[i] == '' then
      return redis.error_reply('ERR bucket: key ' .. i .. ' has an empty field')
    end
    a = a + 2
  else
    fields[i] = ''
    a = a + 1
  end
end
if a - 1 ~= #ARGV then
  return redis.error_reply('ERR bucket: want ' .. (a - 1) .. ' arguments for ' .. n .. ' keys and ' .. m .. ' parameter sets, got ' .. #ARGV)
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
  if guard == '1' then
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
  local since = bs[cur].since
  if since > b then b = since end
  return b
end

-- reply holds the instant, then four integers per bucket (see Reply
-- above); answer sets bucket i's.
local reply = {now}
local function answer(i, ok, rem, retry, reset)
  local r = 1 + 4 * (i - 1)
  local a = 0
  if ok then a = 1 end
  reply[r + 1] = a
  reply[r + 2] = rem
  reply[r + 3] = retry
  reply[r + 4] = reset
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
    local s = bs[i]
    local ok, rem, retry, reset, val = s.f(op, vals[i], now, s.lim, s.p, s.cost, s.ttl, true, s.fill, born)
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
    local s = bs[i]
    local ok, rem, retry, reset
    ok, rem, retry, reset, val = s.f(op, v, now, s.lim, s.p, s.cost, s.ttl, charge, s.fill, born)
    answer(i, ok and charge, rem, retry, reset)
  end
  local s = bs[i]
  if fields[i] == '' then
    if val == false then
      redis.call('DEL', KEYS[i])
    elseif val then
      redis.call('SET', KEYS[i], val, 'PX', s.ttlarg)
    end
  else
    if val == false then
      redis.call('HDEL', KEYS[i], fields[i])
    elseif val then
      local created = redis.call('HSET', KEYS[i], fields[i], val)
      redis.call('PEXPIRE', KEYS[i], s.ttlarg)
      if created == 1 then
        prune_group(KEYS[i], fields[i], STALE[s.alg], now, s.ttl)
      end
    end
  end
end
return reply
