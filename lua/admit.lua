-- admit: charge tokens to a client's issuance limits, before they are issued.
-- KEYS[1] the client's limit record (a hash, one per client, not per token)
-- ARGV[1] count; ARGV[2] rate limit per period ('0' = none); ARGV[3] period_ms;
-- ARGV[4] outstanding cap ('0' = none); ARGV[5] ttl_ms of the tokens;
-- ARGV[6] now_ms ('' = Redis TIME)
-- returns {'admitted'} | {'rate_limited', retry_after_ms}
--       | {'too_many_outstanding', retry_after_ms} | {'invalid_argument', message}
--
-- The record's fields: 't' is the rate limiter's theoretical arrival time
-- (GCRA) in ms; '<end_s>' counts the tokens whose expiry falls in the bucket
-- ending at <end_s> (epoch seconds). One key per call, so the script runs
-- unchanged on Redis Cluster. A refusal writes nothing.
--
-- Rate: GCRA with a burst of one full period (60/minute lets 60 through at
-- once, then one per second). Outstanding: a token counts from issue until its
-- expiry, consumed or not -- its record stays in Redis until then anyway, so
-- the cap bounds the memory one client can hold. Expiries are rounded UP to
-- buckets of BUCKET_SECONDS * 2^k, the smallest such width of at least a
-- quarter of the TTL: a client's hash stays at a handful of fields (memory per
-- client, not per token) at the price of counting a token up to a quarter of
-- its TTL (at least 5 s) longer than it lives. Widths are nested, so tokens of
-- different TTLs share bucket ends.
local BUCKET_SECONDS = 5

for i = 1, 5 do
  if i ~= 2 and i ~= 4 and not positive_int(ARGV[i]) then
    return bad('ARGV[' .. i .. '] must be a positive integer')
  end
end
local count = tonumber(ARGV[1])
local limit = tonumber(ARGV[2])
local period = tonumber(ARGV[3])
local cap = tonumber(ARGV[4])
local ttl = tonumber(ARGV[5])
if limit == nil or cap == nil or limit < 0 or cap < 0 then
  return bad('limit and cap must be integers >= 0')
end
if limit > 0 and count > limit then return bad('count exceeds the rate limit') end
if cap > 0 and count > cap then return bad('count exceeds the outstanding cap') end
local now = now_ms(ARGV[6])

local tat = now
local outstanding = 0
local live = {}
local expired = {}
local flat = redis.call('HGETALL', KEYS[1])
for i = 1, #flat, 2 do
  local name, value = flat[i], tonumber(flat[i + 1])
  if name == 't' then
    if value > tat then tat = value end
  else
    local ends_ms = tonumber(name) * 1000
    if ends_ms <= now then
      expired[#expired + 1] = name
    else
      outstanding = outstanding + value
      live[#live + 1] = {ends_ms, value}
    end
  end
end

local new_tat = nil
if limit > 0 then
  new_tat = tat + count * period / limit
  local allowed_at = new_tat - period
  if allowed_at > now then return {'rate_limited', math.ceil(allowed_at - now)} end
end

if cap > 0 and outstanding + count > cap then
  -- when will enough of this client's tokens have expired to make room?
  table.sort(live, function(a, b) return a[1] < b[1] end)
  local needed = outstanding + count - cap
  for _, bucket in ipairs(live) do
    needed = needed - bucket[2]
    if needed <= 0 then return {'too_many_outstanding', bucket[1] - now} end
  end
end

if #expired > 0 then redis.call('HDEL', KEYS[1], unpack(expired)) end
local keep_ms = 1
if new_tat then
  redis.call('HSET', KEYS[1], 't', string.format('%d', math.ceil(new_tat)))
  keep_ms = math.ceil(new_tat - now)
end
if cap > 0 then
  local width = BUCKET_SECONDS
  while width * 4000 < ttl do width = width * 2 end
  local ends = math.ceil((now + ttl) / 1000 / width) * width
  redis.call('HINCRBY', KEYS[1], tostring(ends), count)
  for _, bucket in ipairs(live) do
    if bucket[1] - now > keep_ms then keep_ms = bucket[1] - now end
  end
  if ends * 1000 - now > keep_ms then keep_ms = ends * 1000 - now end
end
if limit > 0 or cap > 0 then redis.call('PEXPIRE', KEYS[1], keep_ms) end
return {'admitted'}
