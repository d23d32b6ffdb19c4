-- Funding (DESIGN.md rule 9, docs/funding.md): hour grants, pay-as-you-go with a monthly
-- spend cap, and which source paid for each billed second, written in the transaction that
-- books it. Every table is an org's, keyed by org_id first (Citus co-locates them with
-- orgs: migrations/citus/distribute.sql).

-- Pay-as-you-go as the org set it: the cap in its plan's currency, a decimal string.
ALTER TABLE orgs ADD COLUMN overage_enabled BOOLEAN NOT NULL DEFAULT FALSE;
ALTER TABLE orgs ADD COLUMN overage_cap TEXT;

-- The rows updated on every booking keep room in their pages (fillfactor 70, as the
-- hourly rollups do), so an update stays on its page without touching the indexes.

-- Hours granted to an org: promotions, make-goods, trials and bought top-ups. A grant is
-- never deleted: voiding lapses its remainder and keeps what was used.
CREATE TABLE grants (
    org_id          TEXT NOT NULL,
    grant_id        TEXT NOT NULL,
    kind            TEXT NOT NULL,
    seconds         BIGINT NOT NULL CHECK (seconds > 0),
    used_seconds    BIGINT NOT NULL DEFAULT 0 CHECK (used_seconds >= 0 AND used_seconds <= seconds),
    priority        BIGINT NOT NULL CHECK (priority BETWEEN 0 AND 100),
    starts_at       BIGINT NOT NULL,
    expires_at      BIGINT CHECK (expires_at > starts_at),
    note            TEXT,
    -- The caller's key (or the Checkout Session of a top-up): one grant for each.
    idempotency_key TEXT,
    created_at      BIGINT NOT NULL,
    voided_at       BIGINT,
    -- When (in ledger time) its last second was used.
    used_up_at      BIGINT,
    PRIMARY KEY (org_id, grant_id),
    UNIQUE (org_id, idempotency_key)
) WITH (fillfactor = 70);

-- The notifier's look for grants used up lately or about to expire (every few seconds).
CREATE INDEX grants_used_up ON grants (used_up_at) WHERE used_up_at IS NOT NULL;
CREATE INDEX grants_expiring ON grants (expires_at)
    WHERE voided_at IS NULL AND expires_at IS NOT NULL;

-- What each of an org's windows (its billing month, its ISO week) has funded, by source,
-- as booked: the ceilings count plan_seconds, the cap charge_units (price-seconds in
-- ten-thousandths of the currency). Written under the org's row lock.
CREATE TABLE funding_windows (
    org_id          TEXT NOT NULL,
    kind            TEXT NOT NULL,
    window_start    BIGINT NOT NULL,
    window_end      BIGINT NOT NULL,
    plan_seconds    BIGINT NOT NULL,
    grant_seconds   BIGINT NOT NULL,
    overage_seconds BIGINT NOT NULL,
    grace_seconds   BIGINT NOT NULL,
    charge_units    BIGINT NOT NULL,
    PRIMARY KEY (org_id, kind, window_start)
) WITH (fillfactor = 70);

-- The windows whose pay-as-you-go is due to be charged (the billing job's look).
CREATE INDEX funding_windows_overage ON funding_windows (window_end)
    WHERE kind = 'month' AND overage_seconds > 0;

-- Billed seconds that the plan did not pay for, by UTC hour, source and grant ('' for
-- none); an hour's plan seconds are the rest of org_hourly's.
CREATE TABLE funding_hourly (
    org_id       TEXT NOT NULL,
    hour         BIGINT NOT NULL,
    source       TEXT NOT NULL,
    grant_id     TEXT NOT NULL,
    seconds      BIGINT NOT NULL,
    charge_units BIGINT NOT NULL,
    PRIMARY KEY (org_id, hour, source, grant_id)
) WITH (fillfactor = 70);

-- What funds an allowed decision, and the room each source had.
ALTER TABLE decisions ADD COLUMN funded_by TEXT;
ALTER TABLE decisions ADD COLUMN plan_room BIGINT NOT NULL DEFAULT 0;
ALTER TABLE decisions ADD COLUMN grant_room BIGINT NOT NULL DEFAULT 0;
ALTER TABLE decisions ADD COLUMN overage_room BIGINT NOT NULL DEFAULT 0;

-- A closed period's org lines keep who paid (DESIGN.md rule 8): grant seconds by kind,
-- pay-as-you-go seconds and their charge units, grace; and the same of the adjustment.
ALTER TABLE period_orgs ADD COLUMN grant_promo_seconds BIGINT NOT NULL DEFAULT 0;
ALTER TABLE period_orgs ADD COLUMN grant_make_good_seconds BIGINT NOT NULL DEFAULT 0;
ALTER TABLE period_orgs ADD COLUMN grant_trial_seconds BIGINT NOT NULL DEFAULT 0;
ALTER TABLE period_orgs ADD COLUMN grant_purchased_seconds BIGINT NOT NULL DEFAULT 0;
ALTER TABLE period_orgs ADD COLUMN overage_seconds BIGINT NOT NULL DEFAULT 0;
ALTER TABLE period_orgs ADD COLUMN grace_seconds BIGINT NOT NULL DEFAULT 0;
ALTER TABLE period_orgs ADD COLUMN charge_units BIGINT NOT NULL DEFAULT 0;
ALTER TABLE period_orgs ADD COLUMN adjustment_overage_seconds BIGINT NOT NULL DEFAULT 0;
ALTER TABLE period_orgs ADD COLUMN adjustment_charge_units BIGINT NOT NULL DEFAULT 0;

-- Pay-as-you-go charged through Stripe, once for each billing window that had any: an
-- invoice item on the invoice Stripe makes when the window ends (docs/funding.md). Once a
-- window has a row here its funding is closed: time booked for it later is funded in the
-- next window open.
CREATE TABLE overage_charges (
    org_id                 TEXT NOT NULL,
    window_start           BIGINT NOT NULL,
    window_end             BIGINT NOT NULL,
    overage_seconds        BIGINT NOT NULL,
    charge_units           BIGINT NOT NULL,
    amount                 TEXT NOT NULL,
    currency               TEXT NOT NULL,
    -- pending (to send), charged (Stripe holds the item), none (nothing to charge: no
    -- Stripe customer, or a zero amount).
    state                  TEXT NOT NULL,
    stripe_invoice_id      TEXT,
    stripe_invoice_item_id TEXT,
    created_at             BIGINT NOT NULL,
    charged_at             BIGINT,
    PRIMARY KEY (org_id, window_start)
);
