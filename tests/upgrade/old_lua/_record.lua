-- Shared helpers, prepended by token_service/store.py to every script below
-- (EVAL scripts cannot share functions any other way on Redis 6/7 and Cluster).
--
-- A token record is one Redis string: a state letter followed by fields joined
-- by \31 (ASCII unit separator). Trailing empty fields are dropped, so an
-- ISSUED record is just "I<scope>\31<subject>" — one small string key keeps an
-- outstanding token at ~165 bytes of Redis memory. Subjects and fingerprints
-- never contain control characters (validated by the callers) and JSON
-- payloads escape them, so \31 can never appear inside a field.
--
--   field 1 scope          5 lease_id
--   field 2 subject        6 lease_expires_ms (PROCESSING); the client bucket the
--                            token is counted in (ISSUED under a cap, see admit.lua)
--   field 3 fingerprint    7 token_expires_ms (PROCESSING: the token's own expiry)
--   field 4 request_id     8 payload (SUCCEEDED: result JSON, FAILED: error JSON)
--
-- States: I ISSUED, P PROCESSING, C CONSUMED, S SUCCEEDED, F FAILED.
local SEP = '\31'
local NFIELDS = 8

local function parse(value)
  local fields = {}
  local start = 2
  for i = 1, NFIELDS - 1 do
    local stop = string.find(value, SEP, start, true)
    if not stop then
      fields[i] = string.sub(value, start)
      for j = i + 1, NFIELDS do fields[j] = '' end
      return string.sub(value, 1, 1), fields
    end
    fields[i] = string.sub(value, start, stop - 1)
    start = stop + 1
  end
  -- the payload is last and may be long: never split it
  fields[NFIELDS] = string.sub(value, start)
  return string.sub(value, 1, 1), fields
end

local function record(state, fields)
  local last = 0
  for i = NFIELDS, 1, -1 do
    local field = fields[i]
    if field ~= nil and field ~= '' then
      last = i
      break
    end
  end
  for i = 1, last - 1 do
    if fields[i] == nil then fields[i] = '' end
  end
  return state .. table.concat(fields, SEP, 1, last)
end

-- "now" comes from ARGV when a caller controls time (tests), else from the
-- Redis clock, the one clock every service instance shares.
local function now_ms(arg)
  if arg ~= nil and arg ~= '' then return tonumber(arg) end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Which binding differs, or nil. Binding is exact: a token issued for a
-- subject must be presented with that subject, and one issued without must
-- be presented without.
local function mismatch(fields, scope, subject, fingerprint)
  if fields[1] ~= scope then return 'scope' end
  if fields[2] ~= subject then return 'subject' end
  if fields[3] ~= fingerprint then return 'fingerprint' end
  return nil
end

-- Decimal digits only ("1e3", "0x10", "inf", "5.0" are refused), at most 15 of them
-- so the value is exact in Lua's doubles and can be handed to PX as it is.
local function positive_int(arg)
  return type(arg) == 'string' and #arg <= 15 and string.match(arg, '^[1-9]%d*$') ~= nil
end

local function bad(message)
  return {'invalid_argument', message}
end
-- (the helpers generate and consume call write {'invalid_argument', message} out: the
-- closure of bad() is not made on every call of theirs)

-- A value holding the separator would shift every field after it (a request id
-- "a\31b" turns the lease id into the lease expiry and bricks the token; a subject
-- "a\31b" matches subject "a" with fingerprint "b"). The HTTP API and the SDK
-- refuse control characters, but every caller of the scripts is held to it here,
-- before any write.
local function separator_in(...)
  for _, i in ipairs({...}) do
    if ARGV[i] ~= nil and string.find(ARGV[i], SEP, 1, true) then
      return {'invalid_argument', 'ARGV[' .. i .. '] must not contain the field separator \\31'}
    end
  end
  return nil
end

-- An ISSUED record with field 6 set still counts toward its client's outstanding cap
-- (admit.lua): the first consume, begin or revoke takes it out of its bucket. KEYS[2],
-- when given, is the client's limit record (one round trip); without it (Redis Cluster:
-- another slot) the bucket is returned for the caller to release with release.lua.
local function release_from(key, bucket)
  local limits = redis.call('GET', key)
  if not limits then return end  -- expired (every bucket ended) or evicted
  local at = string.find(limits, '|' .. bucket .. ':', 1, true)
  if not at then return end  -- the bucket ended and is gone
  local count_at = at + #bucket + 2
  local after = string.find(limits, '|', count_at, true) or #limits + 1
  local count = tonumber(string.sub(limits, count_at, after - 1))
  if count > 1 then
    limits = string.sub(limits, 1, count_at - 1) .. string.format('%d', count - 1) .. string.sub(limits, after)
  else
    limits = string.sub(limits, 1, at - 1) .. string.sub(limits, after)
  end
  redis.call('SET', key, limits, 'KEEPTTL')
end

local function release(state, fields)
  local bucket = fields[6]
  if state ~= 'I' or bucket == '' then return '' end
  if KEYS[2] == nil then return bucket end
  release_from(KEYS[2], bucket)
  return ''
end

-- issue's arguments (issue.lua): checked before anything is written, also by the
-- one-script generate (store.py) before admit.lua charges the client.
local function issue_refusal()
  if ARGV[1] == nil or ARGV[1] == '' then return {'invalid_argument', 'scope is required'} end
  local ttl = ARGV[4]  -- positive_int(ARGV[4]), spelled out: generate's hot path
  if not (ttl and #ttl <= 15 and string.find(ttl, '^[1-9]%d*$')) then
    return {'invalid_argument', 'ttl_ms must be a positive integer'}
  end
  if string.find(ARGV[1] .. ARGV[2] .. ARGV[3] .. (ARGV[5] or ''), SEP, 1, true) then
    return separator_in(1, 2, 3, 5)
  end
  return nil
end
