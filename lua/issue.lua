-- issue: store a new ISSUED token record.
-- KEYS[1] token record key (derived from the token digest)
-- ARGV[1] scope; ARGV[2] subject ('' for none); ARGV[3] fingerprint ('' for none);
-- ARGV[4] ttl_ms (positive integer)
-- returns {'issued'} | {'collision'} when the key exists (the caller draws a new token)
--       | {'invalid_argument', message}
if ARGV[1] == nil or ARGV[1] == '' then return bad('scope is required') end
if not positive_int(ARGV[4]) then return bad('ttl_ms must be a positive integer') end
local value = record('I', {ARGV[1], ARGV[2], ARGV[3]})
if redis.call('SET', KEYS[1], value, 'PX', ARGV[4], 'NX') then
  return {'issued'}
end
return {'collision'}
