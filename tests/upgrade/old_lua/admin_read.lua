-- admin_read: one record as it is, for the operators' tools (token_service/ops/admin.py).
-- KEYS[1] a token or Idempotency-Key record key
-- returns {} when there is no such key | {value, pttl_ms, now_ms}: the raw value, its time
-- left (-1: no expiry) and the Redis clock, read together so "time left" means what it says
-- transitions: none (it only reads)
local value = redis.call('GET', KEYS[1])
if not value then return {} end
return {value, redis.call('PTTL', KEYS[1]), string.format('%d', now_ms(''))}
