-- complete: finish a two-phase operation and store its result.
-- KEYS[1] token record key
-- ARGV[1] lease_id; ARGV[2] result_json; ARGV[3] result_ttl_ms (positive integer);
-- ARGV[4] now_ms ('' = Redis TIME)
-- returns {'succeeded', replayed 0|1} | {'token_invalid'} | {'lease_lost'}
--       | {'invalid_argument', message}
-- transitions: P->S (lua/model/lease.pml)
-- The usual complete compares the record's lease header with this lease and slices the
-- SUCCEEDED record out of it: no parse. A keyed claim's lease is the key's own expiry,
-- so its record still being there means its lease is live: no TIME either.
if not positive_int(ARGV[3]) then return bad('result_ttl_ms must be a positive integer') end
local value = redis.call('GET', KEYS[1])
if not value then return {'token_invalid'} end
local head = 'P' .. HEADED .. ARGV[1] .. SEP
if string.sub(value, 1, #head) ~= head then
  if ARGV[1] == '' then return bad('lease_id is required') end
  local state, f = parse(value)
  if state == 'S' and f[5] == ARGV[1] then
    -- a retry of this very complete: the first stored result stands
    return {'succeeded', 1}
  end
  if state ~= 'P' or f[5] ~= ARGV[1] then return {'lease_lost'} end
  value = record('P', f)  -- a record of the first layout (before 0.2.0), read as it is
end
local lease_at = #head + 1
local token_at = string.find(value, SEP, lease_at, true) + 1
local rest_at = string.find(value, SEP, token_at, true) + 1
local keep_ms = tonumber(ARGV[3])
if token_at > lease_at + 1 then
  -- a token's lease, in the record: live until lease_expires_ms on the Redis clock
  local now = now_ms(ARGV[4])
  if tonumber(string.sub(value, lease_at, token_at - 2)) <= now then return {'lease_lost'} end
  keep_ms = math.max(tonumber(string.sub(value, token_at, rest_at - 2)) - now, keep_ms)
end
redis.call('SET', KEYS[1], 'S' .. HEADED .. ARGV[1] .. SEP .. SEP .. SEP .. string.sub(value, rest_at)
  .. SEP .. ARGV[2], 'PX', keep_ms)
return {'succeeded', 0}
