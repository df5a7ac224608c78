-- sliding_log.lua: the sliding log (algorithm code 'sl'): exact over any
-- window (t-p, t] of p microseconds; admitted while the logged cost plus
-- cost <= lim.
--
-- Stored value: a sequence of struct '>I7I4' records = admission time
-- (microseconds), cost (whole tokens); 11 bytes each. Every record holds at
-- least one token, so a log holds at most lim/1000 records (bounded by
-- bucket.MaxSlidingLogCapacity times 1+overcommit). An empty log is deleted.
-- A denial writes nothing. A missing log that the store may have lost at
-- born() (see take.lua) reads as one entry at that instant holding the
-- whole capacity (rounded up to a whole token).
ALG['sl'] = function(op, v, now, lim, win, cost, ttl, charge, fill, born)
  local ts, cs, n = {}, {}, 0
  local t = now
  if v then
    local len, pos = #v, 1
    while pos + 10 <= len do
      local a, c, np = struct.unpack('>I7I4', v, pos)
      n = n + 1
      ts[n], cs[n] = a, c * 1000
      pos = np
    end
  else
    local b = born()
    if b > 0 then
      n = 1
      ts[1], cs[1] = b, math.ceil(lim / 1000) * 1000
    end
  end
  if n > 0 and ts[n] > t then t = ts[n] end
  local first = 1
  while first <= n and ts[first] <= t - win do first = first + 1 end
  local sum = 0
  for i = first, n do sum = sum + cs[i] end
  local ok, write = true, false
  if op == 'r' then
    local left = cost
    while left > 0 and n >= first do
      if cs[n] <= left then
        left = left - cs[n]
        sum = sum - cs[n]
        n = n - 1
      else
        cs[n] = cs[n] - left
        sum = sum - left
        left = 0
      end
      write = true
    end
  elseif cost > 0 then
    if sum + cost <= lim then
      if charge then
        n = n + 1
        ts[n], cs[n] = t, cost
        sum = sum + cost
        write = true
      end
    else
      ok = false
    end
  end
  local reset = 0
  if n >= first then reset = ts[n] + win - t end
  local retry = 0
  if not ok then
    if cost > lim then
      retry = reset
    else
      local freed = 0
      for i = first, n do
        freed = freed + cs[i]
        if sum - freed + cost <= lim then
          retry = ts[i] + win - t
          break
        end
      end
    end
    if retry < 1 then retry = 1 end
  end
  local rem = lim - sum
  if rem < 0 then rem = 0 end
  local val = nil
  if write then
    if n < first then
      val = false
    else
      local parts = {}
      for i = first, n do parts[#parts + 1] = struct.pack('>I7I4', ts[i], cs[i] / 1000) end
      val = table.concat(parts)
    end
  end
  return ok, rem, retry, reset, val
end
