-- wrk script for benches/ingest.rs: each request carries `batch` heartbeats of running
-- sessions owned by this wrk thread, every one new (its session's seq advances).
-- Arguments: batch, sessions per thread, orgs, token.
local threads = 0

function setup(thread)
  thread:set("tid", threads)
  threads = threads + 1
end

function init(args)
  batch = tonumber(args[1])
  sessions = tonumber(args[2])
  orgs = tonumber(args[3])
  wrk.headers["Authorization"] = "Bearer " .. args[4]
  wrk.headers["Content-Type"] = "application/json"
  wrk.method = "POST"
  n = 0
end

function request()
  local now = os.date("!%Y-%m-%dT%H:%M:%SZ")
  local parts = {}
  for i = 1, batch do
    local k = n % sessions
    local seq = math.floor(n / sessions) + 1
    n = n + 1
    parts[i] = string.format(
      '{"org_id":"org_%d","session_id":"w%d_%d","vm_id":"vm_%d_%d","seq":%d,"state":"running","sent_at":"%s"}',
      k % orgs, tid, k, tid, k, seq, now)
  end
  return wrk.format(nil, nil, nil, '{"heartbeats":[' .. table.concat(parts, ",") .. ']}')
end
