-- The schema of PostgreSQL's 0005: global uniqueness in tables of its own (session ids,
-- Stripe customers), no foreign key from tokens into org data, notification ids unique
-- within their org. SQLite serves one instance and is never distributed; its schema
-- follows PostgreSQL's so that one SQL serves both.

CREATE TABLE session_owners (
    session_id TEXT PRIMARY KEY,
    org_id     TEXT NOT NULL
);
INSERT INTO session_owners (session_id, org_id) SELECT session_id, org_id FROM sessions;
DROP INDEX sessions_session_id;
CREATE INDEX sessions_by_id ON sessions (session_id);

CREATE TABLE stripe_customers (
    customer_id TEXT PRIMARY KEY,
    org_id      TEXT NOT NULL
);
INSERT INTO stripe_customers (customer_id, org_id)
    SELECT stripe_customer_id, org_id FROM orgs WHERE stripe_customer_id IS NOT NULL;
DROP INDEX orgs_stripe_customer;

-- SQLite drops a constraint by building the table again.
CREATE TABLE tokens_new (
    token_id    TEXT PRIMARY KEY,
    secret_hash TEXT NOT NULL UNIQUE,
    scopes      TEXT NOT NULL,
    org_id      TEXT,
    label       TEXT NOT NULL DEFAULT '',
    created_at  INTEGER NOT NULL
);
INSERT INTO tokens_new SELECT token_id, secret_hash, scopes, org_id, label, created_at FROM tokens;
DROP TABLE tokens;
ALTER TABLE tokens_new RENAME TO tokens;

CREATE TABLE notifications_new (
    org_id          TEXT NOT NULL,
    window_kind     TEXT NOT NULL,
    window_start    INTEGER NOT NULL,
    threshold       INTEGER NOT NULL,
    notification_id TEXT NOT NULL,
    body            TEXT NOT NULL,
    state           TEXT NOT NULL,
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_at         INTEGER NOT NULL,
    last_error      TEXT,
    created_at      INTEGER NOT NULL,
    sent_at         INTEGER,
    PRIMARY KEY (org_id, window_kind, window_start, threshold),
    UNIQUE (org_id, notification_id)
);
INSERT INTO notifications_new SELECT org_id, window_kind, window_start, threshold,
    notification_id, body, state, attempts, next_at, last_error, created_at, sent_at
    FROM notifications;
DROP TABLE notifications;
ALTER TABLE notifications_new RENAME TO notifications;
CREATE INDEX notifications_due ON notifications (next_at) WHERE state = 'pending';
