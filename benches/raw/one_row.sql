-- One heartbeat's worth of durable write by hand: one row inserted and committed a
-- transaction (autocommit), the machine's own limit for single-heartbeat requests. The
-- ingest benchmark runs it with pgbench at the same concurrency, on the database it has
-- just measured the service on, into a table of its own (raw_rows):
--   pgbench -n -f benches/raw/one_row.sql -c N -j 2 -T 12 <database>
\set n random(1, 1000000000)
INSERT INTO raw_rows (org_id, session_id, seq, at) VALUES ('org_' || :client_id, 's' || :n, :n, :n);
