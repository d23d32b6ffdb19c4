-- One durable admission written by hand, as one transaction: what POST /v1/admissions
-- does for a decision that allows, without HTTP, batching or the service. It locks the
-- key, reads the org, counts the key's running slots, sums the month and the week from
-- the hourly rollup, claims the session id, writes the session and the decision record,
-- and commits. The admission benchmark runs it with pgbench on the database it has just
-- measured the service on (same orgs, keys and rows), as the machine's own limit:
--   pgbench -n -f benches/raw/admission.sql -D orgs=100 -D keys=1000 -D now=… \
--     -D month_start=… -D week_start=… -c N -j 2 -T 8 <database>
-- The open phases are named, not `phase <> 'ended'`, so that the count is a range of the
-- index on (org_id, phase, key_id, slot_at) (migration 0012), as the service's is.
\set k random(0, :keys - 1)
\set o :k % :orgs
\set s random(1, 1000000000000)
BEGIN;
SELECT concurrency_limit FROM api_keys WHERE org_id = 'org_' || :o AND key_id = 'k' || :k FOR UPDATE;
SELECT plan_id, suspended, period_start, period_end FROM orgs WHERE org_id = 'org_' || :o;
SELECT count(*) FROM sessions WHERE org_id = 'org_' || :o AND key_id = 'k' || :k AND phase IN ('admitted', 'running', 'parked', 'silent') AND (COALESCE(heard_at, last_at) >= :now - 45 OR slot_at >= :now - 45);
SELECT COALESCE(SUM(CASE WHEN hour >= :month_start THEN seconds ELSE 0 END), 0), COALESCE(SUM(CASE WHEN hour >= :week_start THEN seconds ELSE 0 END), 0) FROM org_hourly WHERE org_id = 'org_' || :o AND hour >= LEAST(CAST(:month_start AS BIGINT), CAST(:week_start AS BIGINT)) AND hour <= :now;
INSERT INTO sessions (org_id, session_id, key_id, agent, phase, last_at, span_start, created_at, slot_at) VALUES ('org_' || :o, 'raw_' || :client_id || '_' || :s, 'k' || :k, 'codex', 'admitted', :now, :now, :now, :now);
INSERT INTO decisions (org_id, decision_id, decided_at, session_id, key_id, decision, rule, plan_id, suspended, month_start, month_end, month_used, month_limit, week_start, week_end, week_used, week_limit, running, concurrency_limit) VALUES ('org_' || :o, 'raw_' || :client_id || '_' || :s, :now, 'raw_' || :client_id || '_' || :s, 'k' || :k, 'allow', 'allowed', 'team', false, :month_start, :month_start + 2678400, 0, 720000, :week_start, :week_start + 604800, 0, 180000, 0, 100);
END;
