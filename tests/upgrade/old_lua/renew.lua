-- renew: extend the live lease of a two-phase operation while its holder still works.
-- KEYS[1] token record key
-- ARGV[1] lease_id; ARGV[2] lease_ms: the lease runs until now + lease_ms (positive integer;
-- a renewal never shortens it); ARGV[3] now_ms ('' = Redis TIME)
-- returns {'renewed', lease_expires_ms, lease_left_ms} | {'token_invalid'} | {'lease_lost'}
--       (lease_left_ms: how long the lease runs from this script's now, as in begin)
--       | {'invalid_argument', message}
-- transitions: P->P (lua/model/lease.pml)
-- Fenced like complete: only the holder of the live lease renews. A lease that already ran
-- out stays lost (another begin may have taken the token meanwhile, or may any moment).
if ARGV[1] == nil or ARGV[1] == '' then return bad('lease_id is required') end
if not positive_int(ARGV[2]) then return bad('lease_ms must be a positive integer') end
local refused = separator_in(1)
if refused then return refused end
local value = redis.call('GET', KEYS[1])
if not value then return {'token_invalid'} end
local state, f = parse(value)
if state ~= 'P' or f[5] ~= ARGV[1] then return {'lease_lost'} end
local now = now_ms(ARGV[3])
local lease_expires = tonumber(f[6])
if lease_expires <= now then return {'lease_lost'} end

lease_expires = math.max(lease_expires, now + tonumber(ARGV[2]))
f[6] = string.format('%d', lease_expires)
-- the record lives as long as the later of the token's own expiry and the lease (as begin sets it)
redis.call('SET', KEYS[1], record('P', f), 'PX', math.max(tonumber(f[7]) - now, lease_expires - now))
return {'renewed', f[6], string.format('%d', lease_expires - now)}
