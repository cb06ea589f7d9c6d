-- idempotency_renew: keep an Idempotency-Key claimed while its request still runs.
-- KEYS[1] idempotency record key
-- ARGV[1] request fingerprint; ARGV[2] owner id (the claim's); ARGV[3] lock_ms: the claim
-- holds the key at least this long from now (positive integer; never shortened)
-- returns {'renewed'} | {'lost'} (the claim ran out or is another attempt's: nothing changed)
--       | {'invalid_argument', message}
if ARGV[2] == nil or ARGV[2] == '' then return bad('owner is required') end
if not positive_int(ARGV[3]) then return bad('lock_ms must be a positive integer') end
if redis.call('GET', KEYS[1]) ~= 'P' .. ARGV[1] .. SEP .. ARGV[2] then return {'lost'} end
if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[3]) then redis.call('PEXPIRE', KEYS[1], ARGV[3]) end
return {'renewed'}
