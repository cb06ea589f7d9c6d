-- idempotency_store: keep the response of the request that holds an Idempotency-Key.
-- KEYS[1] idempotency record key
-- ARGV[1] request fingerprint; ARGV[2] owner id (the claim's); ARGV[3] the stored response's
-- head (opaque bytes, its line end included); ARGV[4] its body (opaque bytes: sent apart so the
-- client never joins a large body to its head, one more copy of it); ARGV[5] ttl_ms: how long
-- duplicates are answered with it (positive integer)
-- returns {'stored'} | {'lost'} (the claim ran out or is another attempt's: nothing written)
--       | {'invalid_argument', message}
if ARGV[4] == nil then return bad('expected 5 arguments') end
if not positive_int(ARGV[5]) then return bad('ttl_ms must be a positive integer') end
if redis.call('GET', KEYS[1]) ~= 'P' .. ARGV[1] .. SEP .. ARGV[2] then return {'lost'} end
redis.call('SET', KEYS[1], 'D' .. ARGV[1] .. SEP .. ARGV[3] .. ARGV[4], 'PX', ARGV[5])
return {'stored'}
