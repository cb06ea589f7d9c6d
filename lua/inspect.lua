-- inspect: read a token record without changing anything ("verify").
-- KEYS[1] token record key
-- ARGV[1] now_ms ('' = Redis TIME)
-- returns {} when gone
--       | {state, scope, subject, fingerprint, record_ttl_ms, lease_expires_ms, payload}
--         state is ISSUED, PROCESSING, CONSUMED, SUCCEEDED or FAILED; lease_expires_ms
--         is '' unless PROCESSING; payload is the result/error JSON or ''
-- transitions: none (it only reads)
local value = redis.call('GET', KEYS[1])
if not value then return {} end
local ttl_ms = redis.call('PTTL', KEYS[1])
local state, f = parse(value)
local names = {I = 'ISSUED', P = 'PROCESSING', C = 'CONSUMED', S = 'SUCCEEDED', F = 'FAILED'}
local lease = ''
if state == 'P' then
  local now = now_ms(ARGV[1])
  local lease_expires, token_expires = lease_end(f, now)
  if lease_expires > now then
    lease = string.format('%d', lease_expires)
  elseif token_expires > now then
    -- an expired lease makes the token usable again: report what a begin would see
    state = 'I'
    ttl_ms = token_expires - now
  else
    return {}
  end
end
local payload = ''
if state == 'S' or state == 'F' then payload = f[8] end
return {names[state], f[1], f[2], f[3], ttl_ms, lease, payload}
