-- Closed billing periods (calendar months, UTC) and what they froze, so that a closed
-- period's exports come out byte for byte the same forever (DESIGN.md rule 8). Usage that
-- arrives later for the last closed period is an adjustment in the next one (export.rs).
CREATE TABLE periods (
    period_start       BIGINT PRIMARY KEY,
    period_end         BIGINT NOT NULL,
    closed_at          BIGINT NOT NULL,
    orgs               BIGINT NOT NULL,
    sessions           BIGINT NOT NULL,
    agent_seconds      BIGINT NOT NULL,
    adjustment_seconds BIGINT NOT NULL
);

-- One row an org a closed period, with the plan's terms as they were, so that editing a
-- plan file never changes a closed export. Ids sort byte by byte ("C"), as on SQLite, so
-- an export's order is the same on both and survives a change of the server's locale.
CREATE TABLE period_orgs (
    period_start           BIGINT NOT NULL,
    org_id                 TEXT COLLATE "C" NOT NULL,
    plan_id                TEXT NOT NULL,
    stripe_customer_id     TEXT,
    stripe_subscription_id TEXT,
    agent_seconds          BIGINT NOT NULL,
    adjustment_seconds     BIGINT NOT NULL,
    included_hours         TEXT NOT NULL,
    unit_price             TEXT NOT NULL,
    price                  TEXT NOT NULL,
    currency               TEXT NOT NULL,
    PRIMARY KEY (period_start, org_id)
);

-- One row a session a closed period. The key holds org_id, so a distributed PostgreSQL
-- can shard it by org like every other table; period first so an export reads one range.
CREATE TABLE period_sessions (
    period_start       BIGINT NOT NULL,
    org_id             TEXT COLLATE "C" NOT NULL,
    session_id         TEXT COLLATE "C" NOT NULL,
    project_id         TEXT,
    started_by         TEXT,
    agent              TEXT,
    running_seconds    BIGINT NOT NULL,
    parked_seconds     BIGINT NOT NULL,
    spans              BIGINT NOT NULL,
    first_start        BIGINT,
    last_end           BIGINT,
    end_status         TEXT,
    adjustment_seconds BIGINT NOT NULL,
    PRIMARY KEY (period_start, org_id, session_id)
);

-- Usage-threshold notifications: at most one a threshold a window (the key), delivered
-- with retries by whichever instance claims it.
CREATE TABLE notifications (
    org_id          TEXT NOT NULL,
    window_kind     TEXT NOT NULL,
    window_start    BIGINT NOT NULL,
    threshold       BIGINT NOT NULL,
    notification_id TEXT NOT NULL UNIQUE,
    body            TEXT NOT NULL,
    state           TEXT NOT NULL,
    attempts        BIGINT NOT NULL DEFAULT 0,
    next_at         BIGINT NOT NULL,
    last_error      TEXT,
    created_at      BIGINT NOT NULL,
    sent_at         BIGINT,
    PRIMARY KEY (org_id, window_kind, window_start, threshold)
);
CREATE INDEX notifications_due ON notifications (next_at) WHERE state = 'pending';
