-- fail: end a two-phase operation that failed.
-- KEYS[1] token record key
-- ARGV[1] lease_id; ARGV[2] retryable ('1' releases the token, '0' records a
-- terminal failure); ARGV[3] error_json; ARGV[4] result_ttl_ms (positive integer);
-- ARGV[5] now_ms ('' = Redis TIME)
-- returns {'released', replayed 0|1} | {'failed', replayed 0|1} | {'token_invalid'}
--       | {'lease_lost'} | {'invalid_argument', message}
-- transitions: P->I P->F P->0 (lua/model/lease.pml; 0: no record)
if ARGV[1] == nil or ARGV[1] == '' then return bad('lease_id is required') end
if ARGV[2] ~= '1' and ARGV[2] ~= '0' then return bad('retryable must be 1 or 0') end
if not positive_int(ARGV[4]) then return bad('result_ttl_ms must be a positive integer') end
local refused = separator_in(1)
if refused then return refused end
local value = redis.call('GET', KEYS[1])
if not value then return {'token_invalid'} end
local state, f = parse(value)

-- a retry of this very fail (the released record remembers the lease that released it)
if f[5] == ARGV[1] then
  if state == 'F' then return {'failed', 1} end
  if state == 'I' and ARGV[2] == '1' then return {'released', 1} end
end
if state ~= 'P' or f[5] ~= ARGV[1] then return {'lease_lost'} end
local now = now_ms(ARGV[5])
if tonumber(f[6]) <= now then return {'lease_lost'} end

local token_expires = tonumber(f[7])
if ARGV[2] == '1' then
  if token_expires <= now then
    redis.call('DEL', KEYS[1])
  else
    local released = record('I', {f[1], f[2], f[3], '', f[5]})
    redis.call('SET', KEYS[1], released, 'PX', token_expires - now)
  end
  return {'released', 0}
end
local failed = record('F', {f[1], f[2], f[3], f[4], f[5], '', '', ARGV[3]})
redis.call('SET', KEYS[1], failed, 'PX', math.max(token_expires - now, tonumber(ARGV[4])))
return {'failed', 0}
