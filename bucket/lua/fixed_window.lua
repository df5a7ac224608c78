-- fixed_window.lua: the fixed window (algorithm code 'fw'), as Envoy's rate
-- limit service counts: windows aligned to multiples of p microseconds
-- since the Unix epoch; admitted while count + cost <= lim.
--
-- Stored value: struct '>I7I5' = window start (microseconds), count (units).
-- Unlike Envoy, a denial writes nothing (Envoy also adds denied hits); for
-- unit costs the decisions are the same. A missing count that the store may
-- have lost at born() (see take.lua) reads as full in the window of that
-- instant: nothing more is admitted before the next window.
ALG['fw'] = function(op, v, now, lim, win, cost, ttl, charge, fill, born)
  local ws = math.floor(now / win) * win
  local count = 0
  local ws0, c0
  if v then
    ws0, c0 = struct.unpack('>I7I5', v)
  else
    local b = born()
    if b > 0 then ws0, c0 = math.floor(b / win) * win, lim end
  end
  if ws0 then
    if ws0 > ws then ws = ws0 end
    if ws0 == ws then count = c0 end
  end
  local ok, write = true, false
  if op == 'r' then
    if cost > 0 and count > 0 then
      count = count - cost
      if count < 0 then count = 0 end
      write = true
    end
  elseif cost > 0 then
    if count + cost <= lim then
      if charge then
        count = count + cost
        write = true
      end
    else
      ok = false
    end
  end
  local reset = ws + win - now
  local retry = 0
  if not ok then retry = reset end
  local rem = lim - count
  if rem < 0 then rem = 0 end
  local val = nil
  if write then val = struct.pack('>I7I5', ws, count) end
  return ok, rem, retry, reset, val
end
