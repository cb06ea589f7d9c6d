-- fail: end a two-phase operation that failed.
-- KEYS[1] token record key
-- ARGV[1] lease_id; ARGV[2] retryable ('1' releases the token, '0' records a
-- terminal failure); ARGV[3] error_json; ARGV[4] result_ttl_ms (positive integer; a
-- released keyed claim is remembered, bound to its fingerprint, this long; '0' with
-- retryable '1': it is not remembered, its record goes, as an Idempotency-Key's does);
-- ARGV[5] now_ms ('' = Redis TIME)
-- returns {'released', replayed 0|1} | {'failed', replayed 0|1} | {'token_invalid'}
--       | {'lease_lost'} | {'invalid_argument', message}
-- transitions: P->I P->F P->0 (lua/model/lease.pml; 0: no record)
-- As complete: the lease header compared as a prefix, the record sliced, not parsed.
if ARGV[2] ~= '1' and ARGV[2] ~= '0' then return bad('retryable must be 1 or 0') end
if not positive_int(ARGV[4]) and not (ARGV[4] == '0' and ARGV[2] == '1') then
  return bad('result_ttl_ms must be a positive integer (or 0 for a release)')
end
local value = redis.call('GET', KEYS[1])
if not value then return {'token_invalid'} end
local head = 'P' .. HEADED .. ARGV[1] .. SEP
if string.sub(value, 1, #head) ~= head then
  if ARGV[1] == '' then return bad('lease_id is required') end
  local state, f = parse(value)
  -- a retry of this very fail (the released record remembers the lease that released it)
  if f[5] == ARGV[1] then
    if state == 'F' then return {'failed', 1} end
    if state == 'I' and ARGV[2] == '1' then return {'released', 1} end
  end
  if state ~= 'P' or f[5] ~= ARGV[1] then return {'lease_lost'} end
  value = record('P', f)  -- a record of the first layout (before 0.2.0), read as it is
end
local lease_at = #head + 1
local token_at = string.find(value, SEP, lease_at, true) + 1
local rest_at = string.find(value, SEP, token_at, true) + 1
local keep_ms = tonumber(ARGV[4])
local token_left_ms = keep_ms  -- a keyed claim: released for result_ttl_ms
if token_at > lease_at + 1 then
  local now = now_ms(ARGV[5])
  if tonumber(string.sub(value, lease_at, token_at - 2)) <= now then return {'lease_lost'} end
  token_left_ms = tonumber(string.sub(value, token_at, rest_at - 2)) - now
  keep_ms = math.max(token_left_ms, keep_ms)
end
if ARGV[2] == '0' then
  redis.call('SET', KEYS[1], 'F' .. HEADED .. ARGV[1] .. SEP .. SEP .. SEP .. string.sub(value, rest_at)
    .. SEP .. ARGV[3], 'PX', keep_ms)
  return {'failed', 0}
end
if token_left_ms <= 0 then
  redis.call('DEL', KEYS[1])
else
  -- ISSUED again, bound as before, remembering the lease that released it (field 5)
  local binding_at = string.find(value, SEP, rest_at, true) + 1
  redis.call('SET', KEYS[1], 'I' .. string.sub(value, binding_at) .. SEP .. SEP .. ARGV[1], 'PX', token_left_ms)
end
return {'released', 0}
