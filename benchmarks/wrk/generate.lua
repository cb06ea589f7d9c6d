-- POST /token/generate, one token per request.
-- args: scope, number of distinct subjects (0 = no subject).
-- For paced runs the harness appends a delay() (see benchmarks/load.py).
local scope, subjects
local counter = 0
local headers = {["Content-Type"] = "application/json"}

function init(args)
  scope = args[1] or "bench.pay"
  subjects = tonumber(args[2] or "0")
  math.randomseed(os.time())
  counter = math.random(0, 1000000)
end

function request()
  counter = counter + 1
  local body
  if subjects > 0 then
    body = string.format('{"scope":"%s","subject":"user-%d"}', scope, counter % subjects)
  else
    body = string.format('{"scope":"%s"}', scope)
  end
  return wrk.format("POST", "/token/generate", headers, body)
end
