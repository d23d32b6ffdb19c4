-- Read by no statement since 0009 (sessions_key_slot and sessions_key_running took its
-- place), kept one release for the instances of the release before (docs/operations.md).
-- The PostgreSQL migration of the same number also sets the planner's estimate of an
-- org's sessions; SQLite has no such setting, and its plans held flat with history
-- (reports/growth.md).
DROP INDEX IF EXISTS sessions_key_open;
