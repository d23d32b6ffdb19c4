-- Plan versions: an org is on a version of its plan (files without `version` are version
-- 1, so every org of an older release is on version 1 of its plan) and keeps it until an
-- operator moves it (`moving_to_version` from `moving_at`). Each version's terms are
-- recorded the first time the service starts with it, so that an edited version is
-- refused at start-up rather than changing what orgs on it were promised.
ALTER TABLE orgs ADD COLUMN plan_version BIGINT NOT NULL DEFAULT 1;
ALTER TABLE orgs ADD COLUMN moving_to_version BIGINT;
ALTER TABLE orgs ADD COLUMN moving_at BIGINT;
-- Decisions and closed periods name the version they were made on.
ALTER TABLE decisions ADD COLUMN plan_version BIGINT NOT NULL DEFAULT 1;
ALTER TABLE period_orgs ADD COLUMN plan_version BIGINT NOT NULL DEFAULT 1;

-- Shared by every org: a reference table on Citus (migrations/citus/distribute.sql).
CREATE TABLE plan_versions (
    plan_id TEXT NOT NULL,
    version BIGINT NOT NULL,
    -- `field=value` lines (core::plans::terms_text).
    terms TEXT NOT NULL,
    -- The file it was first read from, to name in an error.
    file TEXT NOT NULL,
    recorded_at BIGINT NOT NULL,
    PRIMARY KEY (plan_id, version)
);

-- A member token (scope `member`) reads its user's own use in its org: the user it is
-- bound to, beside its org.
ALTER TABLE tokens ADD COLUMN user_id TEXT;
