-- renew: extend the live lease of a two-phase operation while its holder still works.
-- KEYS[1] token record key
-- ARGV[1] lease_id; ARGV[2] lease_ms: the lease runs until now + lease_ms (positive integer;
-- a renewal never shortens it); ARGV[3] now_ms ('' = Redis TIME)
-- returns {'renewed', lease_expires_ms, lease_left_ms} | {'token_invalid'} | {'lease_lost'}
--       (lease_left_ms: how long the lease runs from this script's now, as in begin)
--       | {'invalid_argument', message}
-- transitions: P->P (lua/model/lease.pml)
-- Fenced like complete: only the holder of the live lease renews (a prefix compare of the
-- lease header). A lease that already ran out stays lost (another begin may have taken the
-- token meanwhile, or may any moment); a keyed claim's ran out with its key.
if not positive_int(ARGV[2]) then return bad('lease_ms must be a positive integer') end
local value = redis.call('GET', KEYS[1])
if not value then return {'token_invalid'} end
local head = 'P' .. HEADED .. ARGV[1] .. SEP
if string.sub(value, 1, #head) ~= head then
  if ARGV[1] == '' then return bad('lease_id is required') end
  local state, f = parse(value)
  if state ~= 'P' or f[5] ~= ARGV[1] then return {'lease_lost'} end
  value = record('P', f)  -- a record of the first layout (before 0.2.0), read as it is
end
local now = now_ms(ARGV[3])
local lease_ms = tonumber(ARGV[2])
local lease_at = #head + 1
local token_at = string.find(value, SEP, lease_at, true) + 1
if token_at == lease_at + 1 then
  -- a keyed claim: its lease is the key's expiry, extended in place (never shortened)
  local left_ms = redis.call('PTTL', KEYS[1])
  if left_ms < lease_ms then
    redis.call('PEXPIRE', KEYS[1], lease_ms)
    left_ms = lease_ms
  end
  return {'renewed', string.format('%d', now + left_ms), string.format('%d', left_ms)}
end
local rest_at = string.find(value, SEP, token_at, true) + 1
local lease_expires = tonumber(string.sub(value, lease_at, token_at - 2))
if lease_expires <= now then return {'lease_lost'} end

lease_expires = math.max(lease_expires, now + lease_ms)
local token_expires = tonumber(string.sub(value, token_at, rest_at - 2))
-- the record lives as long as the later of the token's own expiry and the lease (as begin sets it)
redis.call('SET', KEYS[1], head .. string.format('%d', lease_expires) .. SEP .. string.sub(value, token_at),
  'PX', math.max(token_expires - now, lease_expires - now))
return {'renewed', string.format('%d', lease_expires), string.format('%d', lease_expires - now)}
