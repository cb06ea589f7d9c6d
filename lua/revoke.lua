-- revoke: delete a token record, whatever its state.
-- KEYS[1] token record key
-- returns {'revoked'} | {'token_invalid'} when there was nothing to revoke
if redis.call('DEL', KEYS[1]) == 1 then return {'revoked'} end
return {'token_invalid'}
