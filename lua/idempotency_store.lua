-- idempotency_store: keep the response of the request that holds an Idempotency-Key.
-- KEYS[1] idempotency record key
-- ARGV[1] request fingerprint; ARGV[2] owner id (the claim's); ARGV[3] stored response
-- (opaque bytes); ARGV[4] ttl_ms: how long duplicates are answered with it (positive integer)
-- returns {'stored'} | {'lost'} (the claim ran out or is another attempt's: nothing written)
--       | {'invalid_argument', message}
if ARGV[3] == nil then return bad('expected 4 arguments') end
if not positive_int(ARGV[4]) then return bad('ttl_ms must be a positive integer') end
if redis.call('GET', KEYS[1]) ~= 'P' .. ARGV[1] .. SEP .. ARGV[2] then return {'lost'} end
redis.call('SET', KEYS[1], 'D' .. ARGV[1] .. SEP .. ARGV[3], 'PX', ARGV[4])
return {'stored'}
