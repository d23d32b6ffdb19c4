-- The sessions' primary key led by session_id: (session_id, org_id). Every write of a
-- session finds its row by id (the group's lock names ids and orgs; the write's upsert is
-- arbitrated by this key), and before 0005 one unique index on session_id served both.
-- Since 0005 the lock went through sessions_by_id and the upsert through the key led by
-- org_id: two indexes where one did, and a heartbeat group of 100 spent 16% more in its
-- lock and write (reports/citus.md). Led by session_id, the key does both again and
-- sessions_by_id goes. It still holds org_id, as Citus and hash partitioning require.
-- An org's reads of its sessions go through the indexes led by org_id (sessions_org_phase,
-- sessions_org_created, sessions_key_*), as they did.
--
-- Instances of the release before keep working on it (their upsert names the key's
-- columns, which match in any order). The new key is built under the table's lock: on a
-- large table, run this in a quiet window (docs/operations.md).
ALTER TABLE sessions DROP CONSTRAINT sessions_pkey;
ALTER TABLE sessions ADD CONSTRAINT sessions_pkey PRIMARY KEY (session_id, org_id);
DROP INDEX sessions_by_id;
