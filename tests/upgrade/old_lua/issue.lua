-- issue: store new ISSUED token records, one per key, all with the same fields.
-- KEYS[1] token record key (its token's digest); KEYS[2..n] more of them: a
-- batch is one call on standalone Redis (on Cluster, one key per call: keys of a call share a slot)
-- ARGV[1] scope; ARGV[2] subject ('' for none); ARGV[3] fingerprint ('' for none);
-- ARGV[4] ttl_ms (positive integer); ARGV[5] the client bucket the tokens are counted in
-- (admit.lua's reply; '' or absent when no cap counts them)
-- returns {'issued'} when every key was set
--       | {'collision', i, ...} the KEYS indexes that already existed: those tokens
--         are not issued (the caller draws new ones), every other key was set
--       | {'invalid_argument', message}
-- transitions: 0->I (each key; lua/model/lease.pml models every script's moves, 0: no record)
local refused = issue_refusal()
if refused then return refused end
local value
if ARGV[5] ~= nil and ARGV[5] ~= '' then
  -- record('I', {scope, subject, fingerprint, '', '', bucket}), spelled out: generate's hot path
  value = 'I' .. ARGV[1] .. SEP .. ARGV[2] .. SEP .. ARGV[3] .. SEP .. SEP .. SEP .. ARGV[5]
elseif ARGV[3] ~= '' then
  -- record('I', {scope, subject, fingerprint}) likewise: trailing empty fields dropped
  value = 'I' .. ARGV[1] .. SEP .. ARGV[2] .. SEP .. ARGV[3]
elseif ARGV[2] ~= '' then
  value = 'I' .. ARGV[1] .. SEP .. ARGV[2]
else
  value = 'I' .. ARGV[1]
end
local collisions = nil
for i = 1, #KEYS do
  if not redis.call('SET', KEYS[i], value, 'PX', ARGV[4], 'NX') then
    collisions = collisions or {'collision'}
    collisions[#collisions + 1] = i
  end
end
if collisions then return collisions end
return {'issued'}
