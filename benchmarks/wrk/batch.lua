-- POST /token/generate/batch: args: scope, count per request.
function init(args)
  wrk.method = "POST"
  wrk.path = "/token/generate/batch"
  wrk.headers["Content-Type"] = "application/json"
  wrk.body = string.format('{"scope":"%s","count":%d}', args[1] or "bench.pay", tonumber(args[2] or "1000"))
end
