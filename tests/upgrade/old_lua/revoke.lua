-- revoke: delete a token record, whatever its state.
-- KEYS[1] token record key; KEYS[2] (optional) the limit record of the client the
-- token was issued to: the token stops counting toward its outstanding cap
-- returns {'revoked', bucket} (bucket: see release() in _record.lua)
--       | {'token_invalid'} when there was nothing to revoke
-- transitions: I->0 P->0 C->0 S->0 F->0 (lua/model/lease.pml; 0: no record)
local value = redis.call('GET', KEYS[1])
if not value then return {'token_invalid'} end
redis.call('DEL', KEYS[1])
local state, f = parse(value)
return {'revoked', release(state, f)}
