-- POST /token/consume with a fresh, pre-generated token per request.
-- args: file of tokens (one a line), scope, service key ('' for none).
-- Running out of tokens is the harness's bug: the repeats would fail with
-- 409 and show up as status errors, which fail the run.
local tokens = {}
local scope
local next_index = 0
local headers = {["Content-Type"] = "application/json"}

function init(args)
  for line in io.lines(args[1]) do tokens[#tokens + 1] = line end
  scope = args[2]
  if args[3] and args[3] ~= "" then headers["Authorization"] = "Bearer " .. args[3] end
end

function request()
  next_index = next_index % #tokens + 1
  local body = string.format('{"token":"%s","scope":"%s"}', tokens[next_index], scope)
  return wrk.format("POST", "/token/consume", headers, body)
end
