-- Heartbeats received but not applied yet, because one before them may be missing (the
-- session's seq skipped one, or a running session's came more than an interval and a half
-- after its last): applied in seq order once nothing is missing before them, or after a
-- lease (core::ledger::receive). Kept in the session's row, as `[[seq, at, state], …]`:
-- acknowledged means durable. `held_at` is the first one's time, for the expiry job.
ALTER TABLE sessions ADD COLUMN held_at INTEGER;
ALTER TABLE sessions ADD COLUMN held TEXT;
CREATE INDEX sessions_held ON sessions (held_at) WHERE held_at IS NOT NULL;
