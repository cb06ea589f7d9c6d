-- Shared helpers, prepended by token_service/store.py to every script below
-- (EVAL scripts cannot share functions any other way on Redis 6/7 and Cluster).
--
-- A token record is one Redis string: a state letter followed by fields joined
-- by \31 (ASCII unit separator). Subjects, fingerprints, request ids and lease
-- ids never contain control characters (validated once, in Python, by
-- token_service/records.py, which builds every script's arguments) and JSON
-- payloads escape them, so \31 can never appear inside a field.
--
-- Two layouts. ISSUED and CONSUMED (no lease): the letter, then scope, subject,
-- fingerprint, request_id, lease_id, bucket, trailing empty fields dropped, so an
-- ISSUED record is just "I<scope>\31<subject>" (182 to 1,414 bytes of Redis memory,
-- docs/topologies.md, "Sizing Redis"):
--
--   field 1 scope          4 request_id   (CONSUMED: the winner's)
--   field 2 subject        5 lease_id     (ISSUED: the lease that released it)
--   field 3 fingerprint    6 what counts the token (ISSUED under a cap or the budget, see
--                            admit.lua): the client's bucket, or
--                            "<client bucket>/<budget bucket>/<bytes>"
--
-- PROCESSING, SUCCEEDED and FAILED (the leased states): the lease header first, so
-- renew, complete and fail compare a prefix and slice instead of parsing:
--
--   <letter> \30 lease_id \31 lease_expires_ms \31 token_expires_ms \31 request_id
--            \31 scope \31 subject \31 fingerprint [\31 payload]
--
-- lease_expires_ms and token_expires_ms are '' when the lease is the key's own
-- expiry: a keyed operation's claim is one plain SET NX GET PX lease_ms (store.py),
-- and its record vanishes when its lease runs out. SUCCEEDED and FAILED empty both
-- and end with the payload (result/error JSON), opaque and never split. A record
-- of the leased states without the \30 is one written before 0.2.0 (the first
-- layout's field order, fields 4-8 request_id, lease_id, lease_expires_ms,
-- token_expires_ms, payload): parse() reads it, every script takes it as it is
-- and writes the new layout (docs/deployment.md, "Upgrading").
--
-- States: I ISSUED, P PROCESSING, C CONSUMED, S SUCCEEDED, F FAILED.
local SEP = '\31'
local HEADED = '\30'  -- after the letter of a leased record in the second layout
local NFIELDS = 8

local function parse(value)
  local fields = {}
  local start = 2
  if string.byte(value, 2) == 30 then
    -- the leased layout: lease_id, lease_expires, token_expires, request_id, scope,
    -- subject, fingerprint, payload -> the fields 5, 6, 7, 4, 1, 2, 3, 8 of the other
    local order = {5, 6, 7, 4, 1, 2, 3}
    start = 3
    for i = 1, 7 do
      local stop = string.find(value, SEP, start, true)
      if not stop then
        fields[order[i]] = string.sub(value, start)
        for j = i + 1, 7 do fields[order[j]] = '' end
        fields[8] = ''
        return string.sub(value, 1, 1), fields
      end
      fields[order[i]] = string.sub(value, start, stop - 1)
      start = stop + 1
    end
    fields[8] = string.sub(value, start)
    return string.sub(value, 1, 1), fields
  end
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
  if state == 'P' or state == 'S' or state == 'F' then
    -- the leased layout (see the top): the lease header first, the payload last
    local leased = state .. HEADED .. fields[5] .. SEP .. (fields[6] or '') .. SEP .. (fields[7] or '')
      .. SEP .. fields[4] .. SEP .. fields[1] .. SEP .. fields[2] .. SEP .. fields[3]
    if state == 'P' then return leased end
    return leased .. SEP .. fields[8]
  end
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
-- Redis clock, the one clock every service instance shares. TIME's two strings are read by
-- Lua's own arithmetic coercion, the whole milliseconds of the microseconds without
-- math.floor: no global lookups nor C calls, 2 k instructions less a call (callgrind).
local function now_ms(arg)
  if arg ~= nil and arg ~= '' then return tonumber(arg) end
  local t = redis.call('TIME')
  local us = t[2] + 0
  return t[1] * 1000 + (us - us % 1000) / 1000
end

-- When a PROCESSING record's lease ends, on the Redis clock: its field 6, or for a keyed
-- claim (field 6 '') the key's own expiry, which is the lease. Returns the lease's end and
-- the token's (a keyed claim's token ends with its lease: the key is gone after it).
local function lease_end(fields, now)
  if fields[6] == '' then
    local left_ms = redis.call('PTTL', KEYS[1])
    return now + left_ms, now + left_ms
  end
  return tonumber(fields[6]), tonumber(fields[7])
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
-- and the anonymous budget (admit.lua): the first consume, begin or revoke takes it out
-- of their buckets. KEYS[2] and KEYS[3], when given, are the client's limit record and
-- the budget's (one round trip); without them (Redis Cluster: another slot) the bucket
-- is returned for the caller to release with release.lua.
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

-- The anonymous budget (admit.lua) takes the token's bytes and itself out of its bucket and
-- out of the totals at its head ("<n>:<b>|<end>:<n>:<b>..."), so the totals stay the sum of
-- the buckets.
local function release_budget(key, bucket, bytes)
  local budget = redis.call('GET', key)
  if not budget then return end
  local at = string.find(budget, '|' .. bucket .. ':', 1, true)
  if not at then return end  -- the bucket ended and is gone
  local counts_at = at + #bucket + 2
  local n, b, after = string.match(budget, '^(%d+):(%d+)()', counts_at)
  local tokens, total, head_end = string.match(budget, '^(%d+):(%d+)()')
  if not (n and tokens) then return end
  local entry = ''
  if n + 0 > 1 then
    if bytes > b + 0 then bytes = b + 0 end
    entry = string.sub(budget, at, counts_at - 1) .. string.format('%d:%d', n - 1, b - bytes)
  else
    bytes = b + 0  -- the bucket's last token takes what is left of it
  end
  redis.call('SET', key, string.format('%d:%d', math.max(tokens - 1, 0), math.max(total - bytes, 0))
    .. string.sub(budget, head_end, at - 1) .. entry .. string.sub(budget, after), 'KEEPTTL')
end

-- Field 6 of an ISSUED record: the client's bucket, or with the budget
-- "<client bucket>/<budget bucket>/<bytes>" (the client's part '' without a cap).
-- budget nil: its part is not released (a caller that does not name the budget's record).
local function release_bucket(bucket, client, budget)
  local slash = string.find(bucket, '/', 1, true)
  if not slash then
    release_from(client, bucket)
    return
  end
  if slash > 1 then release_from(client, string.sub(bucket, 1, slash - 1)) end
  local ends, bytes = string.match(bucket, '^(%d+)/(%d+)$', slash + 1)
  if budget ~= nil and ends then release_budget(budget, ends, bytes + 0) end
end

local function release(state, fields)
  local bucket = fields[6]
  if state ~= 'I' or bucket == '' then return '' end
  if KEYS[2] == nil then return bucket end
  release_bucket(bucket, KEYS[2], KEYS[3])
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
