-- Plans for a large org among many small ones (reports/growth.md). The group commits and
-- the console's reads of one org keep a generic plan (src/store/pg.rs `begin_hot`,
-- `keyed`), which estimates `org_id = $1` from the average org. With 100,000 orgs and
-- 41,496 sessions that is one row, every index led by `org_id` looks alike, and a large
-- org's reads of its sessions by phase took the primary key and filtered: 5,250 rows read
-- for 5 running, 4-9 ms a statement, and a decision, the usage page and a breakdown 4-6x
-- slower than with ten orgs. Declared as holding about 100 sessions an org (distinct
-- values 1% of the rows), the estimate makes reading a whole org cost what it may, and
-- the indexes that name the phase, key or slot win. Custom plans are not affected: they
-- read the org's own count from the statistics where it is a common one.
ALTER TABLE sessions ALTER COLUMN org_id SET (n_distinct = -0.01);

-- The slot count's indexes, full instead of partial. Partial ones over the phases a
-- session passes through (`running`, not yet `ended`) keep the pages of every session
-- that passed, and the planner prices an index by its pages: with a month of sessions
-- ended, a generic plan read a large org's 5,250 sessions by the primary key rather
-- than the few in `sessions_key_slot` (reports/growth.md). A full index's pages hold
-- its rows. A heartbeat never writes `slot_at`, and writes `phase` only when the session
-- parks or resumes (indexed already by sessions_org_phase): its updates stay HOT as
-- before. (SQLite keeps the partial indexes: its planner does not price them by pages,
-- and its plans held flat.)
CREATE INDEX sessions_key_phase ON sessions (org_id, key_id, phase);
CREATE INDEX sessions_key_slot_at ON sessions (org_id, key_id, slot_at);
DROP INDEX IF EXISTS sessions_key_running;
DROP INDEX IF EXISTS sessions_key_slot;

-- Read by no statement since 0009 (sessions_key_slot and sessions_key_running took its
-- place), kept one release for the instances of the release before (docs/operations.md),
-- and a tie for the planner beside sessions_key_slot.
DROP INDEX IF EXISTS sessions_key_open;

ANALYZE sessions;
