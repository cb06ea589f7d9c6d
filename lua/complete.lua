-- complete: finish a two-phase operation and store its result.
-- KEYS[1] token record key
-- ARGV[1] lease_id; ARGV[2] result_json; ARGV[3] result_ttl_ms (positive integer);
-- ARGV[4] now_ms ('' = Redis TIME);
-- returns 0 (stored) | {'succeeded', 1} (a retry of this complete: the first result stands)
--       | {'token_invalid'} | {'lease_lost'} | {'invalid_argument', message}
--       (the usual answer is a bare 0: a table reply costs Redis a sixth of the keyed fast
--       path below, callgrind, benchmarks/RESULTS.md)
-- A plain keyed claim's complete (store.py's SET NX GET PX claim) sends three, no now_ms:
-- ARGV[1] lease_id; ARGV[2] the SUCCEEDED record, built by the caller from the claim it
-- wrote (records.complete_args: the claim with 'S' for its letter and \31 result_json after
-- it); ARGV[3] result_ttl_ms. It writes ARGV[2] or nothing. (Three, not five: each argument
-- costs Redis a string and a slot of the ARGV table, 5 -> 3 saved 3.4 k instructions a call.)
-- ARGV[5], ARGV[6] (optional, together, after the four): the record a plain claim wrote, as
-- the caller wrote it, and the SUCCEEDED record to put in its place (as above); ARGV[7]
-- (optional) the payload's rest, appended to what ARGV[2] or ARGV[6] ends with (an
-- Idempotency-Key's response body after its head, client/_idempotency_store.py: the client
-- never joins a large body to its head, one more copy of it)
-- transitions: P->S (lua/model/lease.pml)
-- The arguments are checked once, in Python (records.complete_args); what this script keeps
-- is what protects the record from any caller: only the holder of the live lease writes.
--
-- The usual keyed complete: the record is this lease's claim with empty expiries (a prefix
-- compare): its lease is the key's own expiry, so the record being there means the lease is
-- live, and only this lease's holder wrote a record with this lease id. Nothing is parsed or
-- built here: the result is sent once, inside the SUCCEEDED record. A bad ARGV[3] is refused
-- by the SET itself, before it writes.
local value = redis.call('GET', KEYS[1])
if ARGV[4] == nil then
  if value and string.find(value, 'P' .. HEADED .. ARGV[1] .. SEP .. SEP, 1, true) == 1 then
    redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
    return 0
  end
  if not value then return {'token_invalid'} end
  -- a retry of this very complete (its reply lost): the first stored result stands
  if string.find(value, 'S' .. HEADED .. ARGV[1] .. SEP, 1, true) == 1 then return {'succeeded', 1} end
  return {'lease_lost'}
end
-- The same with the claim sent whole (ARGV[5]; Lua's strings are interned: the compare is one
-- pointer) and the payload in two parts.
if value == ARGV[5] and string.find(value, 'P' .. HEADED .. ARGV[1] .. SEP .. SEP, 1, true) == 1 then
  redis.call('SET', KEYS[1], ARGV[6] .. (ARGV[7] or ''), 'PX', ARGV[3])  -- .. '' copies nothing
  return 0
end
-- The usual complete of a token's lease: the record's lease header compared with this lease as
-- a prefix, and the SUCCEEDED record sliced out of it: no parse. positive_int and now_ms are
-- spelled out and the helpers defined only where the rare records are read: their closures
-- cost this path 4 k instructions a call (callgrind).
local keep_arg = ARGV[3]
if not (keep_arg and #keep_arg <= 15 and string.find(keep_arg, '^[1-9]%d*$')) then
  return {'invalid_argument', 'result_ttl_ms must be a positive integer'}
end
if not value then return {'token_invalid'} end
local head = 'P' .. HEADED .. ARGV[1] .. SEP
if string.sub(value, 1, #head) ~= head then
  -- (the helpers of the rest are defined here)
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
local keep_ms = tonumber(keep_arg)
if token_at > lease_at + 1 then
  -- a token's lease, in the record: live until lease_expires_ms on the Redis clock
  local now = ARGV[4]  -- now_ms(ARGV[4]) (_record.lua)
  if now ~= '' then
    now = tonumber(now)
  else
    local t = redis.call('TIME')
    local us = t[2] + 0
    now = t[1] * 1000 + (us - us % 1000) / 1000
  end
  if tonumber(string.sub(value, lease_at, token_at - 2)) <= now then return {'lease_lost'} end
  keep_ms = math.max(tonumber(string.sub(value, token_at, rest_at - 2)) - now, keep_ms)
end
redis.call('SET', KEYS[1], 'S' .. HEADED .. ARGV[1] .. SEP .. SEP .. SEP .. string.sub(value, rest_at)
  .. SEP .. ARGV[2] .. (ARGV[7] or ''), 'PX', keep_ms)
return 0
