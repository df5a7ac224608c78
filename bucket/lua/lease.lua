-- lease.lua: the entry point of the lease script, concatenated after
-- common.lua and token_bucket.lua (bucket/lease.go). One call grants or
-- releases one holder's lease on one token bucket, atomically with the
-- bucket. bucket/lease.go (leaseStep) is the reference; the doc there says
-- why the region's bound holds.
--
-- KEYS[1]: the bucket's group hash rl:v<version>:{g.<group>}:<policy>.
-- KEYS[2]: the bucket's lease set rl:lease:v<version>:{g.<group>}:<policy>:<subject>,
--          a hash: field '_' = "last until room" (the last call's instant,
--          the end of the blocked refill, the room the bucket then had for
--          credits); one field per holder = "r1 b1 e1 r2 b2 e2" (current
--          and previous lease: rate in units per microsecond, burst in
--          units, end in microseconds). PEXPIRE: until plus the idle TTL.
-- ARGV[1]: 'g' grant, 'x' release.
-- ARGV[2]: '' to read Redis TIME; tests pass microseconds.
-- ARGV[3..9]: the bucket as take.lua has it: field, capacity (units),
--          refill (units per microsecond), idle TTL (ms), fill (units),
--          since (microseconds, 0: none), guard ('1' or '0').
-- ARGV[10]: the holder.
-- ARGV[11..15]: grant: rate (units per microsecond), burst (units), for
--          (microseconds), cut (microseconds), renew ('1', '2': keep
--          even when the rate no longer fits, or '0');
--          release: 0, unspent (units), within (microseconds), 0, '0'.
-- Reply: nine numbers as strings: granted (1/0), renewed (1/0), rate,
--          burst, until (microseconds), the bucket's tokens (units), the
--          free refill and the leased refill (units per microsecond), now.
local op = ARGV[1]
if op ~= 'g' and op ~= 'x' then
  return redis.error_reply('ERR bucket: unknown lease operation ' .. tostring(op))
end
local now = now_us()
local field = ARGV[3]
local lim, R, ttlms = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local fill, since, guard = tonumber(ARGV[7]), tonumber(ARGV[8]), ARGV[9] == '1'
local holder = ARGV[10]
local arate, aburst, adur, acut = tonumber(ARGV[11]), tonumber(ARGV[12]), tonumber(ARGV[13]), tonumber(ARGV[14])
local renew, keep = ARGV[15] == '1' or ARGV[15] == '2', ARGV[15] == '2'
local ttl = ttlms * 1000

local function born()
  local b = 0
  if guard then
    local mk = 'rl:m:' .. (string.match(KEYS[1], '{g%.%d+}') or KEYS[1])
    b = tonumber(redis.call('GET', mk) or '0') or 0
    if b == 0 then
      b = now
      redis.call('SET', mk, string.format('%.0f', now))
    end
  end
  if since > b then b = since end
  return b
end

local v = redis.call('HGET', KEYS[1], field)
local _, tokens, _, _, val = ALG['tb']('t', v, now, lim, R, 0, ttl, false, fill, born)
local t = now
if v then
  local ts0 = struct.unpack('>I7', v)
  if now - ts0 < ttl and ts0 > t then t = ts0 end
end
local write = val ~= nil

-- The lease set.
local last, untl, room = now, 0, 0
local hs = {}
local raw = redis.call('HGETALL', KEYS[2])
for i = 1, #raw, 2 do
  if raw[i] == '_' then
    local m = {}
    for x in string.gmatch(raw[i + 1], '%S+') do m[#m + 1] = tonumber(x) end
    last, untl, room = m[1], m[2], m[3]
  else
    local m = {}
    for x in string.gmatch(raw[i + 1], '%S+') do m[#m + 1] = tonumber(x) end
    hs[#hs + 1] = {name = raw[i], r1 = m[1], b1 = m[2], e1 = m[3], r2 = m[4], b2 = m[5], e2 = m[6]}
  end
end
table.sort(hs, function(x, y) return x.name < y.name end)

local function at(h, us)
  local r, b = 0, 0
  if us < h.e1 then r, b = h.r1, h.b1 end
  if us < h.e2 then r, b = math.max(r, h.r2), math.max(b, h.b2) end
  return r, b
end
local function span(a, b)
  if b > a then return b - a end
  return 0
end
local function held(h, a, b)
  local lo, hi, rl = h.e1, h.e2, h.r2
  if h.e2 < h.e1 then lo, hi, rl = h.e2, h.e1, h.r1 end
  return math.max(h.r1, h.r2) * span(a, math.min(lo, b)) + rl * span(math.max(a, lo), math.min(hi, b))
end

-- Credit the refill no lease held since the last call.
if untl >= now and last < now then
  local pend = R * (now - last)
  for i = 1, #hs do pend = pend - held(hs[i], last, now) end
  local c = math.floor(math.min(pend, room))
  if c > 0 then
    tokens = tokens + c
    write = true
  end
end
local live = {}
for i = 1, #hs do
  if math.max(hs[i].e1, hs[i].e2) > now then live[#live + 1] = hs[i] end
end
hs = live
local self = nil
local other = 0
for i = 1, #hs do
  if hs[i].name == holder then
    self = i
  else
    local r = at(hs[i], now)
    other = other + r
  end
end

local granted, renewed, grate, gburst, guntil = 0, 0, 0, 0, 0
if op == 'g' then
  local avail = R - other
  local h = nil
  if self then h = hs[self] end
  local g = math.min(arate, avail)
  if renew and h and h.e1 > now and math.abs(h.r1 - arate) <= h.r1 * 1e-9 and h.b1 == aburst and (h.r1 <= avail or keep) then
    h.e1 = now + adur
    granted, renewed, grate, gburst = 1, 1, h.r1, h.b1
  elseif g > 0 and tokens >= aburst and (h or #hs < 64) then
    tokens = tokens - aburst
    local nh = {name = holder, r1 = g, b1 = aburst, e1 = now + adur, r2 = 0, b2 = 0, e2 = 0}
    if h then
      nh.r2, nh.b2 = at(h, now)
      nh.e2 = math.min(math.max(h.e1, h.e2), now + acut)
      hs[self] = nh
    else
      hs[#hs + 1] = nh
      table.sort(hs, function(x, y) return x.name < y.name end)
    end
    granted, grate, gburst = 1, g, aburst
  end
  if granted == 1 then
    write = true
    guntil = now + adur
    untl = math.max(untl, guntil)
  end
elseif self then
  if adur == 0 then
    table.remove(hs, self)
  else
    local h = hs[self]
    h.e1, h.e2 = math.min(h.e1, now + adur), math.min(h.e2, now + adur)
  end
end
local rsum, bsum = 0, 0
for i = 1, #hs do
  local r, b = at(hs[i], now)
  rsum = rsum + r
  bsum = bsum + b
end
if op == 'x' and aburst > 0 then
  local back = math.min(tokens + aburst, lim - bsum)
  if back > tokens then
    tokens = back
    write = true
  end
end
local ts = t
if #hs == 0 then
  if untl > now or ts > now then write = true end
  untl = now
  ts = now
elseif untl > ts then
  ts = untl
end
room = math.max(0, lim - bsum - tokens)

if write then
  local created = redis.call('HSET', KEYS[1], field, struct.pack('>I7I5I5', ts, tokens, lim))
  redis.call('PEXPIRE', KEYS[1], ttlms)
  if created == 1 then
    prune_group(KEYS[1], field, STALE['tb'], now, ttl)
  end
end
if #hs == 0 then
  redis.call('DEL', KEYS[2])
else
  local f = {'_', string.format('%.17g %.17g %.17g', now, untl, room)}
  for i = 1, #hs do
    local h = hs[i]
    f[#f + 1] = h.name
    f[#f + 1] = string.format('%.17g %.17g %.17g %.17g %.17g %.17g', h.r1, h.b1, h.e1, h.r2, h.b2, h.e2)
  end
  redis.call('DEL', KEYS[2])
  redis.call('HSET', KEYS[2], unpack(f))
  redis.call('PEXPIRE', KEYS[2], math.ceil((untl - now) / 1000) + ttlms)
end
local function s(x) return string.format('%.17g', x) end
return {s(granted), s(renewed), s(grate), s(gburst), s(guntil), s(tokens), s(R - rsum), s(rsum), s(now)}
