-- idempotency_begin: claim an Idempotency-Key for one request, or find what it already got.
-- KEYS[1] idempotency record key (the caller derives it from client identity + key)
-- ARGV[1] request fingerprint (non-empty, no \31); ARGV[2] owner id of this attempt
-- (non-empty, no \31); ARGV[3] lock_ms: how long an unfinished claim holds the key
-- (positive integer; a crashed request frees it when this runs out)
-- returns {'started'} | {'replay', stored_response} | {'in_progress', retry_after_ms}
--       | {'mismatch'} (the key was used for a different request) | {'invalid_argument', message}
--
-- Record: 'P' fingerprint \31 owner       while the first request runs (PX lock_ms)
--         'D' fingerprint \31 response    once its response is stored (PX ttl)
if ARGV[1] == nil or ARGV[1] == '' or string.find(ARGV[1], SEP, 1, true) then
  return bad('fingerprint must be non-empty text without \\31')
end
if ARGV[2] == nil or ARGV[2] == '' or string.find(ARGV[2], SEP, 1, true) then
  return bad('owner must be non-empty text without \\31')
end
if not positive_int(ARGV[3]) then return bad('lock_ms must be a positive integer') end

local value = redis.call('GET', KEYS[1])
if not value then
  redis.call('SET', KEYS[1], 'P' .. ARGV[1] .. SEP .. ARGV[2], 'PX', ARGV[3])
  return {'started'}
end
local stop = string.find(value, SEP, 2, true)
if not stop then return bad('not an idempotency record') end
if string.sub(value, 2, stop - 1) ~= ARGV[1] then return {'mismatch'} end
if string.sub(value, 1, 1) == 'P' then
  return {'in_progress', math.max(redis.call('PTTL', KEYS[1]), 1)}
end
return {'replay', string.sub(value, stop + 1)}
