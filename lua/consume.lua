-- consume: one-shot use of a token.
-- KEYS[1] token record key
-- ARGV[1] scope; ARGV[2] subject; ARGV[3] fingerprint; ARGV[4] request_id
-- (a retry carrying the request id that won gets the win again);
-- ARGV[5] now_ms ('' = Redis TIME)
-- returns {'consumed', replayed 0|1} | {'token_invalid'} | {'token_mismatch', field}
--       | {'token_used'} | {'token_in_progress', retry_after_ms}
--       | {'token_failed', error_json} | {'invalid_argument', message}
if ARGV[4] == nil then return bad('expected 5 arguments') end
local refused = separator_in(1, 2, 3, 4)
if refused then return refused end
local value = redis.call('GET', KEYS[1])
if not value then return {'token_invalid'} end
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
  local lease_expires = tonumber(f[6])
  if lease_expires > now then return {'token_in_progress', lease_expires - now} end
  -- the holder's lease ran out: the token is usable again until its own expiry
  local token_expires = tonumber(f[7])
  if token_expires <= now then
    redis.call('DEL', KEYS[1])
    return {'token_invalid'}
  end
  redis.call('SET', KEYS[1], consumed, 'PX', token_expires - now)
else
  -- ISSUED: the CONSUMED record lives until the token's original expiry
  redis.call('SET', KEYS[1], consumed, 'KEEPTTL')
end
return {'consumed', 0}
