-- Auto top-up (docs/funding.md): an org's settings and where its packs stand on its row,
-- which every booking locks and every standing reads, so the heartbeat that crosses the
-- threshold sees them without another statement; opening a pack is one guarded update of
-- that row (enabled, none pending, as many opened as the reader saw).
ALTER TABLE orgs ADD COLUMN auto_topup_enabled BOOLEAN NOT NULL DEFAULT FALSE;
ALTER TABLE orgs ADD COLUMN auto_topup_below_seconds BIGINT NOT NULL DEFAULT 0;
ALTER TABLE orgs ADD COLUMN auto_topup_pack_hours BIGINT NOT NULL DEFAULT 0;
ALTER TABLE orgs ADD COLUMN auto_topup_max_packs BIGINT NOT NULL DEFAULT 0;
ALTER TABLE orgs ADD COLUMN auto_topup_opened BIGINT NOT NULL DEFAULT 0;
ALTER TABLE orgs ADD COLUMN auto_topup_pending BOOLEAN NOT NULL DEFAULT FALSE;

-- One row a pack: its charge's idempotency key is recorded here before the first request
-- to Stripe. Distributed by org_id, co-located with orgs (migrations/citus/distribute.sql).
CREATE TABLE auto_topups (
    org_id            TEXT NOT NULL,
    seq               BIGINT NOT NULL,
    hours             BIGINT NOT NULL,
    -- Decimal text, in `currency`: hours x the plan's topup_hour_price when opened.
    amount            TEXT NOT NULL,
    currency          TEXT NOT NULL,
    -- The billing month it counts in against monthly_max_packs.
    month_start       BIGINT NOT NULL,
    -- charging, paid, failed (tries spent), needs_customer (authentication required),
    -- canceled (a retry no longer wanted).
    status            TEXT NOT NULL,
    attempts          BIGINT NOT NULL DEFAULT 0,
    -- The charge in flight, or the next one: any instance may send it from then on.
    next_attempt_at   BIGINT NOT NULL,
    idempotency_key   TEXT NOT NULL,
    payment_intent_id TEXT,
    last_error        TEXT,
    grant_id          TEXT,
    created_at        BIGINT NOT NULL,
    updated_at        BIGINT NOT NULL,
    PRIMARY KEY (org_id, seq)
);
CREATE INDEX auto_topups_due ON auto_topups (next_attempt_at) WHERE status = 'charging';
