-- idempotency_release: free an Idempotency-Key whose request got no response worth keeping
-- (a 5xx, an exception), so the client may retry with the same key.
-- KEYS[1] idempotency record key
-- ARGV[1] request fingerprint; ARGV[2] owner id (the claim's)
-- returns {'released'} | {'lost'} (the claim ran out or is another attempt's: nothing deleted)
--       | {'invalid_argument', message}
if ARGV[2] == nil or ARGV[2] == '' then return bad('owner is required') end
if redis.call('GET', KEYS[1]) ~= 'P' .. ARGV[1] .. SEP .. ARGV[2] then return {'lost'} end
redis.call('DEL', KEYS[1])
return {'released'}
