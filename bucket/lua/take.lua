-- take.lua: the entry point, concatenated after common.lua and the
-- algorithm files. One call decides for every key atomically.
--
-- KEYS[i]: the bucket keys (one subject: they share a hash tag and slot).
-- ARGV[1]: 't' take (cost 0 peeks) or 'r' refund.
-- ARGV[2]: '' to read Redis TIME (production); tests pass a time in
--          microseconds here to drive a differential test. Nothing but the
--          tests ever sets it.
-- ARGV[3+5*(i-1) .. 7+5*(i-1)] for KEYS[i]: algorithm code ('tb', 'fw',
--          'sw', 'sl'), capacity in units, p (refill in units per
--          microsecond, or the window in microseconds), cost in units,
--          idle TTL in milliseconds.
-- Reply: for each key five integers: allowed (1/0), capacity (units),
--          remaining (units), retry-after (microseconds), reset-after
--          (microseconds).
-- A take is all or nothing: if one key denies, no key is charged and every
-- key reports allowed 0 (only a token-bucket clamp is still written).
local op = ARGV[1]
local now = now_us()
local n = #KEYS
if #ARGV ~= 2 + 5 * n then
  return redis.error_reply('ERR bucket: want ' .. (2 + 5 * n) .. ' arguments, got ' .. #ARGV)
end
local fs, lims, ps, costs, ttls, vals = {}, {}, {}, {}, {}, {}
for i = 1, n do
  local b = 2 + (i - 1) * 5
  local f = ALG[ARGV[b + 1]]
  if not f then
    return redis.error_reply('ERR bucket: unknown algorithm ' .. tostring(ARGV[b + 1]))
  end
  fs[i] = f
  lims[i] = tonumber(ARGV[b + 2])
  ps[i] = tonumber(ARGV[b + 3])
  costs[i] = tonumber(ARGV[b + 4])
  ttls[i] = tonumber(ARGV[b + 5])
  vals[i] = redis.call('GET', KEYS[i])
end
local charge = true
if op == 't' and n > 1 then
  for i = 1, n do
    local ok = fs[i](op, vals[i], now, lims[i], ps[i], costs[i], ttls[i] * 1000, false)
    if not ok then
      charge = false
      break
    end
  end
end
local reply = {}
for i = 1, n do
  local ok, rem, retry, reset, val = fs[i](op, vals[i], now, lims[i], ps[i], costs[i], ttls[i] * 1000, charge)
  if val == false then
    redis.call('DEL', KEYS[i])
  elseif val then
    redis.call('SET', KEYS[i], val, 'PX', ttls[i])
  end
  local a = 0
  if ok and charge then a = 1 end
  reply[#reply + 1] = a
  reply[#reply + 1] = lims[i]
  reply[#reply + 1] = rem
  reply[#reply + 1] = retry
  reply[#reply + 1] = reset
end
return reply
