-- token_bucket.lua: the token bucket (algorithm code 'tb').
--
-- Stored value: struct '>I7I5I5' = ts (microseconds), tokens (units), the
-- capacity lim (units) in force when it was written; 17 bytes, the value of
-- the subject's field in its group hash (see take.lua).
-- ts is the instant at which the bucket held exactly `tokens`: refill adds
-- whole units only and moves ts forward by the time those units took, so
-- no fraction of a unit is lost between calls.
--
-- p is the refill f*r in units per microsecond (0: no refill; the bucket
-- is full again only when the key expires, ttl after its last write).
-- A share change reaches the bucket at the next call, which writes it even
-- when it denies or peeks:
--   shrank: tokens above lim are clamped to lim;
--   grew: the time since ts refills at the old share (p * lim0 / lim), up
--     to the old capacity lim0, so a grown share adds no token at once and
--     none for the time before the call; the new rate counts from now.
-- A denial otherwise writes nothing.
--
-- A value whose ts is ttl or more before now reads as a missing one: a new
-- bucket, which holds fill units (lim unless the region withholds part of
-- its share from new buckets, bucket.Request.Withheld) and is written at
-- once when it holds less than lim, so that it refills from now. When the
-- store may have lost the bucket less than ttl ago (born(), see take.lua:
-- the group's loss marker or the key version's start), a missing bucket
-- reads as one emptied at that instant instead: what refilled since, at
-- most fill, written when below lim (with no refill it stays empty until
-- ttl after the loss, and is not written).
-- Limits.Validate makes ttl cover a full refill, and with no refill ttl is
-- the allowance period. Every write moves ts to within one
-- unit's refill time of now, so a field written within the last ttl is
-- never stale.
STALE['tb'] = function(v, now, ttl)
  local ts0 = struct.unpack('>I7', v)
  return now - ts0 >= ttl
end

ALG['tb'] = function(op, v, now, lim, rate, cost, ttl, charge, fill, born)
  local tokens, ts, write = lim, now, false
  local flim, frate = lim, rate
  local live, lost = false, false
  if v then
    local ts0, tok0, lim0 = struct.unpack('>I7I5I5', v)
    if now - ts0 < ttl then
      live = true
      tokens, ts = tok0, ts0
      if tokens > lim then
        tokens = lim
        write = true
      end
      if lim0 < lim then
        flim, frate = lim0, rate * lim0 / lim
        write = true
      end
    end
  end
  if not live then
    local b = born()
    if b > 0 and now - b < ttl then
      lost, tokens, ts = true, 0, b
    elseif fill < lim then
      tokens, write = fill, true
    end
  end
  local t = now
  if ts > t then t = ts end
  if tokens >= flim then
    ts = t
  elseif frate > 0 then
    local added = math.floor((t - ts) * frate)
    if tokens + added >= flim then
      tokens = flim
      ts = t
    elseif added > 0 then
      tokens = tokens + added
      local adv = ts + math.ceil(added / frate)
      if adv < t then ts = adv else ts = t end
    end
  end
  if flim < lim then ts = t end
  if lost then
    if tokens > fill then tokens, ts = fill, t end
    write = tokens < lim and rate > 0
  end
  local ok = true
  if op == 'r' then
    if cost > 0 then
      tokens = tokens + cost
      if tokens > lim then tokens = lim end
      write = true
    end
  elseif cost > 0 then
    if tokens >= cost then
      if charge then
        tokens = tokens - cost
        write = true
      end
    else
      ok = false
    end
  end
  if write and rate == 0 then ts = t end
  local retry, reset = 0, 0
  if not ok then
    if cost > lim then
      if rate > 0 then retry = math.ceil(lim / rate) else retry = ttl end
    elseif rate > 0 then
      retry = math.ceil((cost - tokens) / rate - (t - ts))
    else
      retry = ttl - (t - ts)
    end
    if retry < 1 then retry = 1 end
  end
  if tokens < lim then
    if rate > 0 then
      reset = math.ceil((lim - tokens) / rate - (t - ts))
    else
      reset = ttl - (t - ts)
    end
    if reset < 0 then reset = 0 end
  end
  local val = nil
  if write then val = struct.pack('>I7I5I5', ts, tokens, lim) end
  return ok, tokens, retry, reset, val
end
