-- common.lua: helpers shared by every bucket script. It is concatenated
-- before the algorithm files and take.lua (see bucket/scripts.go).
--
-- Units: time in microseconds (Redis TIME), amounts in milli-tokens
-- ("units", 1000 per token). Every number is an integer below 2^53, so Lua
-- doubles hold it exactly and the Go reference (bucket.Memory) computes the
-- same floating-point expressions in the same order.
--
-- ALG maps an algorithm code to a function
--   f(op, v, now, lim, p, cost, ttl, charge, fill, born) -> ok, remaining, retry, reset, val
-- op: 't' take (cost 0 peeks) or 'r' refund; v: the stored value or false;
-- lim: capacity in units; p: refill in units per microsecond (token bucket)
-- or the window in microseconds; cost in units; ttl: idle TTL in
-- microseconds; charge: false to decide without consuming; fill: the units
-- a token bucket absent from the store starts with (lim: full; the window
-- algorithms ignore it); born: a function, called only when the bucket is
-- absent, returning the instant (microseconds) at which the store may have
-- lost it, 0 when it is simply new (see take.lua).
-- Returned val: nil writes nothing, false deletes the bucket, a string is
-- stored with the idle TTL (see take.lua for where).
--
-- STALE maps the code of an algorithm whose buckets live as fields of a
-- group hash to a function f(v, now, ttl) -> true when the stored value v
-- can be deleted without changing any decision (prune_group deletes such
-- fields).
local ALG = {}
local STALE = {}

local function now_us()
  if ARGV[2] ~= '' then
    return tonumber(ARGV[2])
  end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- prune_group is called by a write that created field in the group hash
-- key: it samples PRUNE_SAMPLE random fields (HRANDFIELD) and deletes those
-- stale for twice the TTL (ttl in microseconds): such a field reads as a
-- full bucket already, and the second TTL keeps a Redis TIME that steps
-- back by less than one TTL (a failover) from reviving it. Only a creation
-- adds a field, so sampling on creations alone bounds the stale fields
-- (bucket/doc.go) and costs nothing on the common write, an update of a
-- live field. Both scripts that create fields (take.lua, lease.lua) call it.
local PRUNE_SAMPLE = 4
local function prune_group(key, field, stale, now, ttl)
  local sample = redis.call('HRANDFIELD', key, PRUNE_SAMPLE, 'WITHVALUES')
  for j = 1, #sample, 2 do
    if sample[j] ~= field and stale(sample[j + 1], now, 2 * ttl) then
      redis.call('HDEL', key, sample[j])
    end
  end
end
