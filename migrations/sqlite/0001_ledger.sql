-- rush-meter schema: every table is keyed by org first, so a distributed PostgreSQL
-- (Citus) can shard by org_id. Times are Unix seconds (INTEGER, UTC); durations whole seconds.

CREATE TABLE orgs (
    org_id                 TEXT PRIMARY KEY,
    name                   TEXT NOT NULL,
    plan_id                TEXT NOT NULL,
    suspended              INTEGER NOT NULL DEFAULT 0,
    period_start           INTEGER,
    period_end             INTEGER,
    stripe_customer_id     TEXT,
    stripe_subscription_id TEXT,
    subscription_status    TEXT,
    created_at             INTEGER NOT NULL,
    updated_at             INTEGER NOT NULL
);

CREATE TABLE api_keys (
    org_id            TEXT NOT NULL REFERENCES orgs (org_id),
    key_id            TEXT NOT NULL,
    concurrency_limit INTEGER,
    created_at        INTEGER NOT NULL,
    updated_at        INTEGER NOT NULL,
    PRIMARY KEY (org_id, key_id)
);

CREATE TABLE tokens (
    token_id    TEXT PRIMARY KEY,
    secret_hash TEXT NOT NULL UNIQUE,
    scopes      TEXT NOT NULL,
    org_id      TEXT REFERENCES orgs (org_id),
    label       TEXT NOT NULL DEFAULT '',
    created_at  INTEGER NOT NULL
);

-- One row a session: its ledger state (ledger.rs SessionLedger) and who started it.
CREATE TABLE sessions (
    org_id         TEXT NOT NULL REFERENCES orgs (org_id),
    session_id     TEXT NOT NULL,
    key_id         TEXT,
    agent          TEXT,
    project_id     TEXT,
    started_by     TEXT,
    vm_id          TEXT,
    phase          TEXT NOT NULL,
    last_seq       INTEGER,
    last_at        INTEGER NOT NULL,
    span_start     INTEGER NOT NULL,
    billed_seconds INTEGER NOT NULL DEFAULT 0,
    heartbeats     INTEGER NOT NULL DEFAULT 0,
    silences       INTEGER NOT NULL DEFAULT 0,
    unadmitted     INTEGER NOT NULL DEFAULT 0,
    created_at     INTEGER NOT NULL,
    ended_at       INTEGER,
    end_status     TEXT,
    -- The meter's clock when a heartbeat of it was last applied: slots and "running" are
    -- judged by this, never by a reporter's clock.
    heard_at       INTEGER,
    -- When the gate last admitted (or resumed) it: it holds a slot from then until it is
    -- next heard from or the lease passes (gate.rs holds_slot).
    slot_at        INTEGER,
    PRIMARY KEY (org_id, session_id)
);
-- Session ids are global (a reused id is a 409); with Citus this becomes a lookup table.
CREATE UNIQUE INDEX sessions_session_id ON sessions (session_id);
-- Open sessions for the expiry job. No index holds a column a heartbeat changes (last_at,
-- last_seq, billed_seconds…), so PostgreSQL can update a session in place (HOT).
CREATE INDEX sessions_open ON sessions (phase) WHERE phase <> 'ended';
CREATE INDEX sessions_org_phase ON sessions (org_id, phase);
-- A key's open sessions, for the gate's slot count.
CREATE INDEX sessions_key_open ON sessions (org_id, key_id) WHERE phase <> 'ended';

-- Closed spans of each session's timeline; running ones are the ledger.
CREATE TABLE spans (
    org_id     TEXT NOT NULL,
    session_id TEXT NOT NULL,
    start_at   INTEGER NOT NULL,
    end_at     INTEGER NOT NULL,
    kind       TEXT NOT NULL,
    PRIMARY KEY (org_id, session_id, start_at)
);
CREATE INDEX spans_org_running_end ON spans (org_id, end_at) WHERE kind = 'running';

-- Billed seconds by org and UTC hour, written in the same transaction as the spans. Each
-- ingest writer of an instance adds to its own shard's row, so the writers of one instance
-- never wait on one another's lock on a busy org's current hour (instances share shard
-- numbers; their writers may wait, never deadlock: locks are taken in key order).
-- Readers sum the shards.
CREATE TABLE org_hourly (
    org_id  TEXT NOT NULL,
    hour    INTEGER NOT NULL,
    shard   INTEGER NOT NULL,
    seconds INTEGER NOT NULL,
    PRIMARY KEY (org_id, hour, shard)
);

-- Billed seconds by org, hour and session: the breakdowns by session, project, user, agent.
CREATE TABLE session_hourly (
    org_id     TEXT NOT NULL,
    hour       INTEGER NOT NULL,
    session_id TEXT NOT NULL,
    seconds    INTEGER NOT NULL,
    PRIMARY KEY (org_id, hour, session_id)
);

-- Every decision of the gate, with what it was made from, so support can answer "why was
-- my run refused at 14:02?".
CREATE TABLE decisions (
    org_id            TEXT NOT NULL,
    decision_id       TEXT NOT NULL,
    decided_at        INTEGER NOT NULL,
    session_id        TEXT NOT NULL,
    key_id            TEXT NOT NULL,
    decision          TEXT NOT NULL,
    reason            TEXT,
    rule              TEXT NOT NULL,
    plan_id           TEXT NOT NULL,
    suspended         INTEGER NOT NULL,
    month_start       INTEGER NOT NULL,
    month_end         INTEGER NOT NULL,
    month_used        INTEGER NOT NULL,
    month_limit       INTEGER NOT NULL,
    week_start        INTEGER NOT NULL,
    week_end          INTEGER NOT NULL,
    week_used         INTEGER NOT NULL,
    week_limit        INTEGER NOT NULL,
    running           INTEGER NOT NULL,
    concurrency_limit INTEGER NOT NULL,
    upgrade_plan      TEXT,
    PRIMARY KEY (org_id, decision_id)
);
CREATE INDEX decisions_org_time ON decisions (org_id, decided_at, decision_id);
