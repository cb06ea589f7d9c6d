-- admit: charge tokens to a client's issuance limits, before they are issued.
-- KEYS[1] the client's limit record (one small string per client, not per token)
-- ARGV[1] count; ARGV[2] rate limit per period ('0' = none); ARGV[3] period_ms;
-- ARGV[4] outstanding cap ('0' = none); ARGV[5] counted_ms: how long the tokens may
-- count toward the cap (their TTL, at most the service's window);
-- ARGV[6] now_ms ('' = Redis TIME)
-- returns {'admitted', bucket} bucket: '' without a cap, else the bucket the tokens are
--         counted in; their records keep it (field 6), and release() (_record.lua)
--         takes a token back out of it when it is consumed, begun or revoked
--       | {'rate_limited', retry_after_ms} | {'too_many_outstanding', retry_after_ms}
--       | {'invalid_argument', message}
--
-- The record: "<tat>|<end>:<n>|<end>:<n>..." where <tat> is the rate limiter's
-- theoretical arrival time (GCRA) in ms, with six decimals when it is not a whole ms
-- ('' without a rate limit), and each <end>:<n>
-- a bucket: <n> tokens still counted until <end> (epoch seconds). A string, not a
-- hash: one GET and one SET (with the key's expiry) are the cheapest read and write
-- Redis has, and generate runs this every time. One key, in KEYS, so the script runs
-- unchanged on Redis Cluster. A refusal writes nothing.
--
-- Rate: GCRA with a burst of one full period (60/minute lets 60 through at once,
-- then one per second). Outstanding: a token counts from its issue until it is
-- consumed, begun or revoked (release()), or until the end of its bucket. Bucket
-- ends are rounded UP to a multiple of BUCKET_SECONDS * 2^k, the smallest such width
-- of at least an eighth of counted_ms: a token counts at most max(5 s, a quarter of
-- counted_ms) longer than counted_ms, and the record stays small: at most 9 live
-- buckets per width, the widths nested so that tokens of different TTLs share ends.
local BUCKET_SECONDS = 5

-- count, period_ms and counted_ms: positive_int() (_record.lua) of each, as one pattern over
-- the three (a space is in none of them when it matches): generate runs this every time
local count_arg, period_arg, counted_arg = ARGV[1], ARGV[3], ARGV[5]
if not (counted_arg and #count_arg <= 15 and #period_arg <= 15 and #counted_arg <= 15
    and string.find(count_arg .. ' ' .. period_arg .. ' ' .. counted_arg, '^[1-9]%d* [1-9]%d* [1-9]%d*$')) then
  return {'invalid_argument', 'count, period_ms and counted_ms must be positive integers'}
end
-- A string of digits converts as well with arithmetic ("n + 0": one strtod() in Lua 5.1)
-- as with tonumber() (two: one to check, one to convert), here and in the record below.
local count = count_arg + 0
local limit = tonumber(ARGV[2])
local period = period_arg + 0
local cap = tonumber(ARGV[4])
local counted = counted_arg + 0
if limit == nil or cap == nil or limit < 0 or cap < 0 then
  return {'invalid_argument', 'limit and cap must be integers >= 0'}
end
if limit > 0 and count > limit then return {'invalid_argument', 'count exceeds the rate limit'} end
if cap > 0 and count > cap then return {'invalid_argument', 'count exceeds the outstanding cap'} end
local now = ARGV[6]  -- now_ms(ARGV[6]) (_record.lua), spelled out: one closure less per call
if now ~= nil and now ~= '' then
  now = tonumber(now)
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- the bucket these tokens are counted in
local bucket = ''
local ends
if cap > 0 then
  local width = BUCKET_SECONDS
  while width * 8000 < counted do width = width * 2 end
  ends = math.ceil((now + counted) / 1000 / width) * width
  bucket = string.format('%d', ends)
end

-- One pass over the record: the buckets that have not ended are counted, and written
-- back (in their order, these tokens added to theirs) as the new record's tail. A
-- count is written back as it was read: every writer formats it with '%d'.
-- The rate limiter counts in nanoseconds ahead of now, small enough for a double to hold
-- exactly (a day is 8.64e13 ns): rounded to whole ms, every call moved the TAT on by 1 ms
-- at least, holding any rate to 1000/second, and the sums of large epoch values in
-- doubles drift by fractions of a microsecond, refusing the last call of some bursts.
local ahead = 0
local outstanding = 0
local tail = ''  -- "|<end>:<n>..." of the new record
local latest = 0  -- the last end (ms) of the buckets that have not ended
local added = false
local limits = redis.call('GET', KEYS[1])
if limits then
  local stored_ms, stored_ns = string.match(limits, '^(%d+)%.?(%d*)')
  if stored_ms then
    ahead = (stored_ms - now) * 1000000
    if stored_ns ~= '' then ahead = ahead + stored_ns end
    if ahead < 0 then ahead = 0 end
  end
  for ends_s, n in string.gmatch(limits, '|(%d+):(%d+)') do
    local ends_ms = ends_s * 1000
    if ends_ms > now then
      local tokens = n + 0
      outstanding = outstanding + tokens
      if ends_s == bucket then
        n = string.format('%d', tokens + count)
        added = true
      end
      tail = tail .. '|' .. ends_s .. ':' .. n
      if ends_ms > latest then latest = ends_ms end
    end
  end
end

local new_ahead = nil
if limit > 0 then
  -- rounded down: a call is let through less than 1 ns early, so every burst up to
  -- 50 000/second is exactly the limit (rounded up, 7/minute let 6 through)
  new_ahead = math.floor(ahead + count * period * 1000000 / limit)
  local over = new_ahead - period * 1000000
  if over > 0 then return {'rate_limited', math.ceil(over / 1000000)} end
end

if cap > 0 and outstanding + count > cap then
  -- when will enough of this client's tokens have left their buckets to make room?
  local live = {}  -- {count, end_ms} of the buckets that have not ended
  for ends_s, n in string.gmatch(limits, '|(%d+):(%d+)') do
    local ends_ms = ends_s * 1000
    if ends_ms > now then live[#live + 1] = {n + 0, ends_ms} end
  end
  table.sort(live, function(a, b) return a[2] < b[2] end)
  local needed = outstanding + count - cap
  for _, entry in ipairs(live) do
    needed = needed - entry[1]
    if needed <= 0 then return {'too_many_outstanding', entry[2] - now} end
  end
end

local head = ''
local keep_until = now + 1
if new_ahead then
  local whole_ms = math.floor(new_ahead / 1000000)
  local ns = new_ahead - whole_ms * 1000000
  if ns == 0 then
    head = string.format('%d', now + whole_ms)
    keep_until = now + whole_ms
  else
    head = string.format('%d.%06d', now + whole_ms, ns)
    keep_until = now + whole_ms + 1
  end
end
if cap > 0 then
  if latest > keep_until then keep_until = latest end
  if not added then tail = tail .. '|' .. bucket .. ':' .. count end
  if ends * 1000 > keep_until then keep_until = ends * 1000 end
else
  tail = ''  -- without a cap, no bucket is kept
end
redis.call('SET', KEYS[1], head .. tail, 'PX', string.format('%d', keep_until - now))
return {'admitted', bucket}
