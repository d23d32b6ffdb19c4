-- The console's session list: an org's sessions by creation time.
CREATE INDEX sessions_org_created ON sessions (org_id, created_at, session_id);
