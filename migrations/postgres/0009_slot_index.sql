-- The gate's slot count reads only the sessions that may hold a slot: a key's running
-- sessions, and its open sessions admitted or resumed within the lease (a range on
-- `slot_at`). `sessions_key_open` read every open session of the key, parked ones too,
-- and parked sessions pile up (a session parks between turns for days): the count grew
-- with them. A heartbeat never writes `slot_at`, so its updates stay in place (HOT).
-- `sessions_key_open` is no longer read; instances of the previous release still read it
-- (or this index's prefix), so it is dropped in a later release (docs/operations.md).
CREATE INDEX sessions_key_running ON sessions (org_id, key_id) WHERE phase = 'running';
CREATE INDEX sessions_key_slot ON sessions (org_id, key_id, slot_at) WHERE phase <> 'ended';
