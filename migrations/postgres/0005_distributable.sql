-- A schema a distributed PostgreSQL (Citus) can shard by org_id (migrations/citus/):
-- every primary key and unique index of an org's table holds org_id; org_id has one
-- collation everywhere; no foreign key runs from a table shared by every org into org
-- data. What must be unique across orgs lives in a small table of its own, written in
-- the same transaction as the org's rows.

-- A session id belongs to one org (a reused one is a 409).
CREATE TABLE session_owners (
    session_id TEXT PRIMARY KEY,
    org_id     TEXT NOT NULL
);
INSERT INTO session_owners (session_id, org_id) SELECT session_id, org_id FROM sessions;
DROP INDEX sessions_session_id;
-- Not unique now (session_owners is), but still how a group finds its sessions: the
-- lock names orgs and ids, and the primary key alone would probe every pair of them.
CREATE INDEX sessions_by_id ON sessions (session_id);

-- A Stripe customer belongs to one org.
CREATE TABLE stripe_customers (
    customer_id TEXT PRIMARY KEY,
    org_id      TEXT NOT NULL
);
INSERT INTO stripe_customers (customer_id, org_id)
    SELECT stripe_customer_id, org_id FROM orgs WHERE stripe_customer_id IS NOT NULL;
DROP INDEX orgs_stripe_customer;

-- Tokens are few and shared by every instance (a reference table on Citus): the org a
-- console token reads is checked when it is made, not by a foreign key.
ALTER TABLE tokens DROP CONSTRAINT tokens_org_id_fkey;

-- One collation for org_id everywhere; exports sort ids byte by byte with an explicit
-- COLLATE "C" instead, and this index serves that order for closed periods.
ALTER TABLE period_orgs ALTER COLUMN org_id TYPE TEXT COLLATE "default";
ALTER TABLE period_sessions ALTER COLUMN org_id TYPE TEXT COLLATE "default";
ALTER TABLE period_sessions ALTER COLUMN session_id TYPE TEXT COLLATE "default";
CREATE INDEX period_sessions_bytes
    ON period_sessions (period_start, org_id COLLATE "C", session_id COLLATE "C");

-- A notification's id is unique within its org (it is derived from the org and window).
ALTER TABLE notifications DROP CONSTRAINT notifications_notification_id_key;
ALTER TABLE notifications ADD CONSTRAINT notifications_org_notification
    UNIQUE (org_id, notification_id);
