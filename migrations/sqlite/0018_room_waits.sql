-- An org whose sessions were told to park for want of room, waiting for it to return
-- (with notifications on): a row an org, taken away in the transaction that records its
-- `org.room_restored` notification, so that one instance records it once. Distributed by
-- org_id, co-located with orgs (migrations/citus/distribute.sql).
CREATE TABLE room_waits (
    org_id       TEXT NOT NULL,
    since        INTEGER NOT NULL,
    -- core::room::ParkReason.
    reason       TEXT NOT NULL,
    -- When a reset was to bring the plan's room back.
    resume_at    INTEGER NOT NULL,
    -- The plan and version it waited on: another is a room restored by a plan change.
    plan_id      TEXT NOT NULL,
    plan_version INTEGER NOT NULL,
    PRIMARY KEY (org_id)
);
