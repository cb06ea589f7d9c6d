-- begin: take a lease on a token for a two-phase operation.
-- KEYS[1] token record key; KEYS[2] (optional) the limit record of the client the
-- token was issued to, KEYS[3] (optional) the anonymous budget's: the token stops
-- counting toward its outstanding cap and the budget
-- ARGV[1] scope; ARGV[2] subject; ARGV[3] fingerprint; ARGV[4] request_id;
-- ARGV[5] lease_ms (positive integer); ARGV[6] lease_id for a new lease;
-- ARGV[7] now_ms ('' or none = Redis TIME);
-- ARGV[8] claim_ms (optional): a keyed operation (no token issued): an absent record is claimed
-- returns {'started', lease_id, lease_expires_ms, replayed 0|1, bucket, lease_left_ms} (bucket:
--         see release() in _record.lua; lease_left_ms: how long the lease runs from this
--         script's now, a duration the caller measures on its own monotonic clock:
--         lease_expires_ms is Redis's clock and means nothing against the caller's)
--       | {'succeeded', result_json} (a finished operation: replay its result)
--       | {'token_invalid'} | {'token_mismatch', field} | {'token_used'}
--       | {'token_in_progress', retry_after_ms} | {'token_failed', error_json}
--       | {'invalid_argument', message}
--       The two usual answers come bare (a table reply costs Redis more than the reply's
--       commands): a token's new lease on its ISSUED record, the lease_expires_ms (an
--       integer; its lease id is ARGV[6], its length ARGV[5]), and a replay of a token's
--       SUCCEEDED operation, the result_json (a string). records.begin_reply reads all three.
-- transitions: I->P P->P P->0 0->P (lua/model/lease.pml; 0: no record, claimed with claim_ms)
-- A keyed claim (claim_ms) is bound to ARGV[1..3]; its lease is the key's own expiry
-- (lease_ms), as store.py's plain SET NX GET claim writes it: this script is that claim's rare
-- path (a released record, a retry of a claim whose reply was lost, another holder's lease,
-- a record of the first layout). With now_ms given (a test's clock) the lease and the claim's
-- end (now + claim_ms) are written in the record, as a token's are.
-- The arguments it writes into the record are checked here (records.begin_args checks them
-- first; these protect the record from any other caller), spelled out: the usual begin's path.
local lease_arg = ARGV[5]
if not (lease_arg and #lease_arg <= 15 and string.find(lease_arg, '^[1-9]%d*$')) then
  return {'invalid_argument', 'lease_ms must be a positive integer'}
end
if ARGV[6] == nil or ARGV[6] == '' then return {'invalid_argument', 'lease_id is required'} end
if string.find(ARGV[1] .. ARGV[2] .. ARGV[3] .. ARGV[4] .. ARGV[6], SEP, 1, true) then
  return separator_in(1, 2, 3, 4, 6)  -- which argument it is
end
local claim = ARGV[8] ~= nil and ARGV[8] ~= ''
local value = redis.call('GET', KEYS[1])

-- The usual begins of a token, recognized by their text without parsing the record (the
-- general case below gives these records the same answers): an ISSUED record with exactly
-- this binding, counted by no cap and never released, takes the lease; a SUCCEEDED record
-- with this binding gives its result back.
if value and not claim then
  local letter = string.byte(value)
  if letter == 73 and value == (ARGV[3] ~= '' and 'I' .. ARGV[1] .. SEP .. ARGV[2] .. SEP .. ARGV[3]
      or ARGV[2] ~= '' and 'I' .. ARGV[1] .. SEP .. ARGV[2] or 'I' .. ARGV[1]) then
    local now = now_ms(ARGV[7])
    local lease_ms = tonumber(lease_arg)
    local lease_expires = string.format('%d', now + lease_ms)
    local token_left_ms = redis.call('PTTL', KEYS[1])
    redis.call('SET', KEYS[1], 'P' .. HEADED .. ARGV[6] .. SEP .. lease_expires .. SEP
      .. string.format('%d', now + token_left_ms) .. SEP .. ARGV[4] .. SEP .. ARGV[1] .. SEP .. ARGV[2]
      .. SEP .. ARGV[3], 'PX', math.max(token_left_ms, lease_ms))
    return now + lease_ms
  end
  if letter == 83 and string.byte(value, 2) == 30 then  -- 'S', the leased layout
    -- lease_id, two empty expiries, request_id, then the binding and the result
    local request_at = string.find(value, SEP .. SEP .. SEP, 3, true)
    local binding_at = request_at and string.find(value, SEP, request_at + 3, true)
    local binding = SEP .. ARGV[1] .. SEP .. ARGV[2] .. SEP .. ARGV[3] .. SEP
    if binding_at and string.find(value, binding, binding_at, true) == binding_at then
      return string.sub(value, binding_at + #binding)
    end
  end
end
-- (the helpers of the rest are defined here)
if claim and not positive_int(ARGV[8]) then return bad('claim_ms must be a positive integer') end
local claimed_now = not value
if claimed_now then
  if not claim then return {'token_invalid'} end
  value = record('I', {ARGV[1], ARGV[2], ARGV[3]})
end
local state, f = parse(value)
local differs = mismatch(f, ARGV[1], ARGV[2], ARGV[3])
if differs then return {'token_mismatch', differs} end

if state == 'S' then
  return {'succeeded', f[8]}
elseif state == 'F' then
  return {'token_failed', f[8]}
elseif state == 'C' then
  return {'token_used'}
end

local now = now_ms(ARGV[7])
local token_expires
if state == 'P' then
  local lease_expires
  lease_expires, token_expires = lease_end(f, now)
  if lease_expires > now then
    -- a retry of the begin that took this lease gets the same lease back
    if ARGV[4] ~= '' and f[4] == ARGV[4] then
      return {'started', f[5], string.format('%d', lease_expires), 1, '', string.format('%d', lease_expires - now)}
    end
    return {'token_in_progress', lease_expires - now}
  end
  -- the holder crashed: take over, fencing it out by the new lease id
  if token_expires <= now then
    if not claim then
      redis.call('DEL', KEYS[1])
      return {'token_invalid'}
    end
    token_expires = now + tonumber(ARGV[8])  -- a keyed operation is claimed afresh
  end
elseif claim then
  token_expires = now + tonumber(ARGV[8])
else
  token_expires = now + redis.call('PTTL', KEYS[1])
end

local lease_ms = tonumber(ARGV[5])
local lease_expires = now + lease_ms
if claim and ARGV[7] == '' then
  -- a keyed operation: the lease is the key's own expiry (the record dies with it). (With
  -- "now" given, a test's clock, the lease is written in the record as a token's is.)
  redis.call('SET', KEYS[1], record('P', {f[1], f[2], f[3], ARGV[4], ARGV[6], '', ''}), 'PX', lease_ms)
  return {'started', ARGV[6], string.format('%d', lease_expires), 0, release(state, f), ARGV[5]}
end
local processing = record('P', {f[1], f[2], f[3], ARGV[4], ARGV[6],
  string.format('%d', lease_expires), string.format('%d', token_expires)})
-- keep the record for the lease even past the token's expiry, so the holder can finish
redis.call('SET', KEYS[1], processing, 'PX', math.max(token_expires - now, lease_ms))
return {'started', ARGV[6], string.format('%d', lease_expires), 0, release(state, f), ARGV[5]}
