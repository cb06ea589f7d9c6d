-- consume: one-shot use of a token.
-- KEYS[1] token record key; KEYS[2] (optional) the limit record of the client the
-- token was issued to, KEYS[3] (optional) the anonymous budget's: the token stops
-- counting toward its outstanding cap and the budget
-- ARGV[1] scope; ARGV[2] subject; ARGV[3] fingerprint; ARGV[4] request_id
-- (a retry carrying the request id that won gets the win again);
-- ARGV[5] now_ms ('' = Redis TIME)
-- returns {'consumed', replayed 0|1, bucket} (bucket: see release() in _record.lua)
--       | {'token_invalid'} | {'token_mismatch', field} | {'token_used'}
--       | {'token_in_progress', retry_after_ms}
--       | {'token_failed', error_json} | {'invalid_argument', message}
-- transitions: I->C P->C P->0 (lua/model/lease.pml; 0: no record)
if ARGV[4] == nil then return {'invalid_argument', 'expected 5 arguments'} end
if string.find(ARGV[1] .. ARGV[2] .. ARGV[3] .. ARGV[4], SEP, 1, true) then
  return separator_in(1, 2, 3, 4)  -- which argument it is
end
local value = redis.call('GET', KEYS[1])
if not value then return {'token_invalid'} end

-- The usual consume: an ISSUED record with exactly this binding, consumed with a
-- request id. Recognized by its text, without parsing it: the general case below
-- gives every other record the same answer it would give this one.
if string.byte(value) == 73 and ARGV[4] ~= '' then  -- 'I'
  local bound = ARGV[1] .. SEP .. ARGV[2] .. SEP .. ARGV[3]
  local bucket = nil
  local counted = 'I' .. bound .. SEP .. SEP .. SEP  -- fields 4 and 5 empty, 6 the bucket
  if string.find(value, counted, 1, true) == 1 then  -- it starts so
    bucket = string.sub(value, #counted + 1)
    if bucket == '' or string.find(bucket, SEP, 1, true) then bucket = nil end
  elseif value == (ARGV[3] ~= '' and 'I' .. bound  -- record('I', {scope, subject, fingerprint})
      or ARGV[2] ~= '' and 'I' .. ARGV[1] .. SEP .. ARGV[2] or 'I' .. ARGV[1]) then
    bucket = ''  -- counted by no cap
  end
  if bucket then
    redis.call('SET', KEYS[1], 'C' .. bound .. SEP .. ARGV[4], 'KEEPTTL')
    if bucket ~= '' and KEYS[2] ~= nil then
      release_bucket(bucket, KEYS[2], KEYS[3])
      bucket = ''
    end
    return {'consumed', 0, bucket}
  end
end

-- (the helpers of the rest are defined here)
local state, f = parse(value)
local differs = mismatch(f, ARGV[1], ARGV[2], ARGV[3])
if differs then return {'token_mismatch', differs} end

if state == 'C' then
  if ARGV[4] ~= '' and f[4] == ARGV[4] then return {'consumed', 1} end
  return {'token_used'}
elseif state == 'S' then
  return {'token_used'}
elseif state == 'F' then
  return {'token_failed', f[8]}
end

local consumed = record('C', {f[1], f[2], f[3], ARGV[4]})
if state == 'P' then
  local now = now_ms(ARGV[5])
  local lease_expires, token_expires = lease_end(f, now)
  if lease_expires > now then return {'token_in_progress', lease_expires - now} end
  -- the holder's lease ran out: the token is usable again until its own expiry
  if token_expires <= now then
    redis.call('DEL', KEYS[1])
    return {'token_invalid'}
  end
  redis.call('SET', KEYS[1], consumed, 'PX', token_expires - now)
else
  -- ISSUED: the CONSUMED record lives until the token's original expiry
  redis.call('SET', KEYS[1], consumed, 'KEEPTTL')
  return {'consumed', 0, release(state, f)}
end
return {'consumed', 0}
