-- Stripe: an org's subscription state, the webhook events received, and the outbound
-- writes made, each stored before it is acted on.

-- past_due_since: when the subscription went past_due (its plan is kept for the plan's
-- past_due_grace_days from then). stripe_synced_at: when the Stripe state last applied was
-- read from Stripe; a read older than that is never applied, so arrival order does not
-- matter.
ALTER TABLE orgs ADD COLUMN past_due_since BIGINT;
ALTER TABLE orgs ADD COLUMN cancel_at_period_end BOOLEAN NOT NULL DEFAULT FALSE;
-- scheduled_plan_id: a downgrade asked for, made in Stripe at scheduled_at (the end of the
-- period it was asked in).
ALTER TABLE orgs ADD COLUMN scheduled_plan_id TEXT;
ALTER TABLE orgs ADD COLUMN scheduled_at BIGINT;
ALTER TABLE orgs ADD COLUMN stripe_synced_at BIGINT;
CREATE UNIQUE INDEX orgs_stripe_customer ON orgs (stripe_customer_id);

-- Webhook events as received (the raw body), stored before the 2xx. Keyed by Stripe's
-- event id: a redelivery is a no-op. state: pending, processed, ignored (a type this
-- service does not act on), quarantined (failed every retry; see
-- GET /v1/admin/stripe/events). Events arrive before their org is known, so this table
-- alone is not keyed by org.
CREATE TABLE stripe_events (
    event_id        TEXT PRIMARY KEY,
    type            TEXT NOT NULL,
    created         BIGINT NOT NULL,
    payload         TEXT NOT NULL,
    received_at     BIGINT NOT NULL,
    state           TEXT NOT NULL,
    attempts        BIGINT NOT NULL DEFAULT 0,
    next_attempt_at BIGINT NOT NULL,
    last_error      TEXT,
    processed_at    BIGINT,
    org_id          TEXT
);
CREATE INDEX stripe_events_due ON stripe_events (next_attempt_at) WHERE state = 'pending';
CREATE INDEX stripe_events_state ON stripe_events (state, received_at);

-- Outbound writes to Stripe, stored (with their idempotency key) before the call, so a
-- crash between Stripe's answer and the local commit is retried with the same key and
-- never creates a second object.
CREATE TABLE stripe_requests (
    org_id          TEXT NOT NULL,
    operation       TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    target          TEXT NOT NULL,
    created_at      BIGINT NOT NULL,
    completed_at    BIGINT,
    object_id       TEXT,
    PRIMARY KEY (org_id, idempotency_key)
);
-- At most one unfinished request per operation and target: concurrent callers share it
-- (and its key) instead of sending two.
CREATE UNIQUE INDEX stripe_requests_open ON stripe_requests (org_id, operation, target)
    WHERE completed_at IS NULL;

-- What webhooks, reconciliation and checkouts changed on an org, for audits.
CREATE TABLE stripe_changes (
    org_id     TEXT NOT NULL,
    changed_at BIGINT NOT NULL,
    seq        BIGINT NOT NULL,
    source     TEXT NOT NULL,
    detail     TEXT NOT NULL,
    PRIMARY KEY (org_id, changed_at, seq)
);
