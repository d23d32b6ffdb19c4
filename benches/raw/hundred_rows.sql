-- A batch of 100 heartbeats' worth of durable write by hand: one INSERT of 100 rows
-- committed a transaction, the machine's own limit for batches of 100. The ingest benchmark
-- runs it with pgbench at the same concurrency into a table of its own (raw_rows):
--   pgbench -n -f benches/raw/hundred_rows.sql -c N -j 2 -T 12 <database>
\set n random(1, 1000000000)
INSERT INTO raw_rows (org_id, session_id, seq, at) SELECT 'org_' || :client_id, 's' || (:n + g), g, :n FROM generate_series(1, 100) AS g;
