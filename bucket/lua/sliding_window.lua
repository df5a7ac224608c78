-- sliding_window.lua: the sliding window counter (algorithm code 'sw').
-- The estimate is prev*(p-e)/p + cur, where e is the time since the current
-- aligned window of p microseconds began; admitted while
-- estimate + cost <= lim.
--
-- Stored value: struct '>I7I5I5' = window start (microseconds), previous
-- window's count, current window's count (units). A denial writes nothing.
-- A missing value that the store may have lost at born() (see take.lua)
-- reads as a full count in the window of that instant.
ALG['sw'] = function(op, v, now, lim, win, cost, ttl, charge, fill, born)
  local ws = math.floor(now / win) * win
  local prev, cur = 0, 0
  local ws0, p0, c0
  if v then
    ws0, p0, c0 = struct.unpack('>I7I5I5', v)
  else
    local b = born()
    if b > 0 then ws0, p0, c0 = math.floor(b / win) * win, 0, lim end
  end
  if ws0 then
    if ws0 > ws then ws = ws0 end
    if ws0 == ws then
      prev, cur = p0, c0
    elseif ws0 == ws - win then
      prev = c0
    end
  end
  local t = now
  if ws > t then t = ws end
  local e = t - ws
  local est = prev * (win - e) / win + cur
  local ok, write = true, false
  if op == 'r' then
    if cost > 0 and cur > 0 then
      cur = cur - cost
      if cur < 0 then cur = 0 end
      write = true
    end
  elseif cost > 0 then
    if est + cost <= lim then
      if charge then
        cur = cur + cost
        write = true
      end
    else
      ok = false
    end
  end
  local retry, reset = 0, 0
  if cur > 0 then
    reset = ws + 2 * win - t
  elseif prev > 0 then
    reset = ws + win - t
  end
  if not ok then
    if cost > lim then
      retry = reset
    elseif cur + cost <= lim then
      retry = math.ceil(win - (lim - cur - cost) * win / prev) - e
    else
      local r2 = math.ceil(win - (lim - cost) * win / cur)
      if r2 < 0 then r2 = 0 end
      retry = ws + win - t + r2
    end
    if retry < 1 then retry = 1 end
  end
  local rem = math.floor(lim - (prev * (win - e) / win + cur))
  if rem < 0 then rem = 0 end
  local val = nil
  if write then val = struct.pack('>I7I5I5', ws, prev, cur) end
  return ok, rem, retry, reset, val
end
