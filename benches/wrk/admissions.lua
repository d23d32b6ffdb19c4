-- wrk script for benches/admission.rs: each request asks the gate to admit a new session
-- of a random key. Arguments: keys, orgs, token.
local threads = 0

function setup(thread)
  thread:set("tid", threads)
  threads = threads + 1
end

function init(args)
  keys = tonumber(args[1])
  orgs = tonumber(args[2])
  wrk.headers["Authorization"] = "Bearer " .. args[3]
  wrk.headers["Content-Type"] = "application/json"
  wrk.method = "POST"
  n = 0
  math.randomseed(tid + 1)
end

function request()
  n = n + 1
  local k = math.random(0, keys - 1)
  return wrk.format(nil, nil, nil, string.format(
    '{"org_id":"org_%d","key_id":"k%d","session_id":"a%d_%d","agent":"claude","project_id":"web","started_by":"u1"}',
    k % orgs, k, tid, n))
end
