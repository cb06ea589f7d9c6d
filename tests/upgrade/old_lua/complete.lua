-- complete: finish a two-phase operation and store its result.
-- KEYS[1] token record key
-- ARGV[1] lease_id; ARGV[2] result_json; ARGV[3] result_ttl_ms (positive integer);
-- ARGV[4] now_ms ('' = Redis TIME)
-- returns {'succeeded', replayed 0|1} | {'token_invalid'} | {'lease_lost'}
--       | {'invalid_argument', message}
-- transitions: P->S (lua/model/lease.pml)
if ARGV[1] == nil or ARGV[1] == '' then return bad('lease_id is required') end
if not positive_int(ARGV[3]) then return bad('result_ttl_ms must be a positive integer') end
local refused = separator_in(1)
if refused then return refused end
local value = redis.call('GET', KEYS[1])
if not value then return {'token_invalid'} end
local state, f = parse(value)

if state == 'S' and f[5] == ARGV[1] then
  -- a retry of this very complete: the first stored result stands
  return {'succeeded', 1}
end
if state ~= 'P' or f[5] ~= ARGV[1] then return {'lease_lost'} end
local now = now_ms(ARGV[4])
if tonumber(f[6]) <= now then return {'lease_lost'} end

local succeeded = record('S', {f[1], f[2], f[3], f[4], f[5], '', '', ARGV[2]})
local keep_ms = math.max(tonumber(f[7]) - now, tonumber(ARGV[3]))
redis.call('SET', KEYS[1], succeeded, 'PX', keep_ms)
return {'succeeded', 0}
