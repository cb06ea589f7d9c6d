-- issue: store new ISSUED token records, one per key, all with the same fields.
-- KEYS[1] token record key (its token's digest); KEYS[2..n] more of them: a
-- batch is one call on standalone Redis (on Cluster, one key per call: keys of a call share a slot)
-- ARGV[1] scope; ARGV[2] subject ('' for none); ARGV[3] fingerprint ('' for none);
-- ARGV[4] ttl_ms (positive integer)
-- returns {'issued'} when every key was set
--       | {'collision', i, ...} the KEYS indexes that already existed: those tokens
--         are not issued (the caller draws new ones), every other key was set
--       | {'invalid_argument', message}
if ARGV[1] == nil or ARGV[1] == '' then return bad('scope is required') end
if not positive_int(ARGV[4]) then return bad('ttl_ms must be a positive integer') end
local refused = separator_in(1, 2, 3)
if refused then return refused end
local value = record('I', {ARGV[1], ARGV[2], ARGV[3]})
local collisions = {'collision'}
for i = 1, #KEYS do
  if not redis.call('SET', KEYS[i], value, 'PX', ARGV[4], 'NX') then
    collisions[#collisions + 1] = i
  end
end
if #collisions > 1 then return collisions end
return {'issued'}
