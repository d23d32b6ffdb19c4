-- Inside an org (docs/limits.md): agent time by member, rolled up in the transaction that
-- books it, and the hour limits an org sets on its users, projects and keys.

-- Seconds by member: dimension is project, user, agent or key; member_id '' for none (a
-- session without a project or user). A bucket is a UTC hour, cut where the org's month
-- window starts inside it (a Stripe period), so a window's use is the sum of the buckets
-- that start in it.
CREATE TABLE member_hourly (
    org_id    TEXT NOT NULL,
    dimension TEXT NOT NULL,
    bucket    BIGINT NOT NULL,
    member_id TEXT NOT NULL,
    seconds   BIGINT NOT NULL,
    PRIMARY KEY (org_id, dimension, bucket, member_id)
) WITH (fillfactor = 70);

-- What was booked before this table, by hour and the sessions' members as they stand.
INSERT INTO member_hourly (org_id, dimension, bucket, member_id, seconds)
    SELECT h.org_id, 'project', h.hour, COALESCE(s.project_id, ''), SUM(h.seconds)
    FROM session_hourly h JOIN sessions s ON s.org_id = h.org_id AND s.session_id = h.session_id
    GROUP BY h.org_id, h.hour, COALESCE(s.project_id, '');
INSERT INTO member_hourly (org_id, dimension, bucket, member_id, seconds)
    SELECT h.org_id, 'user', h.hour, COALESCE(s.started_by, ''), SUM(h.seconds)
    FROM session_hourly h JOIN sessions s ON s.org_id = h.org_id AND s.session_id = h.session_id
    GROUP BY h.org_id, h.hour, COALESCE(s.started_by, '');
INSERT INTO member_hourly (org_id, dimension, bucket, member_id, seconds)
    SELECT h.org_id, 'agent', h.hour, COALESCE(s.agent, ''), SUM(h.seconds)
    FROM session_hourly h JOIN sessions s ON s.org_id = h.org_id AND s.session_id = h.session_id
    GROUP BY h.org_id, h.hour, COALESCE(s.agent, '');
INSERT INTO member_hourly (org_id, dimension, bucket, member_id, seconds)
    SELECT h.org_id, 'key', h.hour, COALESCE(s.key_id, ''), SUM(h.seconds)
    FROM session_hourly h JOIN sessions s ON s.org_id = h.org_id AND s.session_id = h.session_id
    GROUP BY h.org_id, h.hour, COALESCE(s.key_id, '');

-- An org's limits on its users, projects and keys: hours a month and a week (decimal
-- strings; NULL: no limit in that window).
CREATE TABLE member_limits (
    org_id        TEXT NOT NULL,
    kind          TEXT NOT NULL,
    member_id     TEXT NOT NULL,
    monthly_hours TEXT,
    weekly_hours  TEXT,
    created_at    BIGINT NOT NULL,
    updated_at    BIGINT NOT NULL,
    PRIMARY KEY (org_id, kind, member_id)
);

-- Whether the org has a limit (kept by each change of its limits, under the org's row
-- lock): the gate and heartbeat answers read limits and their members' use only then.
ALTER TABLE orgs ADD COLUMN sets_limits BOOLEAN NOT NULL DEFAULT FALSE;

-- The org's limit that decided a denial: its kind and member, and the member's use and
-- the limit in each window (NULL: no limit there).
ALTER TABLE decisions ADD COLUMN limit_kind TEXT;
ALTER TABLE decisions ADD COLUMN limit_member TEXT;
ALTER TABLE decisions ADD COLUMN limit_month_used BIGINT;
ALTER TABLE decisions ADD COLUMN limit_month BIGINT;
ALTER TABLE decisions ADD COLUMN limit_week_used BIGINT;
ALTER TABLE decisions ADD COLUMN limit_week BIGINT;

-- The audit log (docs/audit.md): who changed what of an org, written in the transaction
-- of the change and never updated or deleted. org_id '' holds the service's own changes
-- (tokens for no org, closed periods). entry_id sorts in the order entries were made.
CREATE TABLE audit_log (
    org_id      TEXT NOT NULL,
    at          BIGINT NOT NULL,
    entry_id    TEXT NOT NULL,
    actor_kind  TEXT NOT NULL,
    actor_id    TEXT,
    actor_label TEXT NOT NULL,
    action      TEXT NOT NULL,
    subject     TEXT NOT NULL,
    before      TEXT,
    after       TEXT,
    PRIMARY KEY (org_id, at, entry_id)
);
