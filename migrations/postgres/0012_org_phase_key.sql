-- One index for an org's sessions by phase and the gate's slot count,
-- (org_id, phase, key_id, slot_at), where three stood: (org_id, phase) and the slot
-- count's (org_id, key_id, phase) and (org_id, key_id, slot_at) of 0010. A generic plan
-- estimates a key at about one session and priced those alike, breaking the tie by size:
-- on the growth benchmark's 10⁷ heartbeats (reports/growth.md) it counted a key's
-- running sessions through `slot_at` and its slots through `phase`, each reading all 46
-- sessions the key had run, ended ones too, where 4 were open (a decision's cost grew
-- with a key's history); with phases asked by equality it took (org_id, phase), reading
-- the org's sessions of a phase over all its keys. With one index no other can pass for
-- it: the count asks each open phase by equality (src/store/pg/gate.rs `slots_held`), a
-- range of this index each, the phase as a parameter so that the fleet's partial index
-- over open phases (`sessions_open`) cannot serve it either; an org's reads by phase use
-- its first two columns as they used (org_id, phase). A new session's insert writes two
-- index entries fewer. A heartbeat writes neither `phase` (except when a session parks or
-- resumes, as before) nor `slot_at`: its updates stay HOT.
CREATE INDEX sessions_org_phase_key ON sessions (org_id, phase, key_id, slot_at);
DROP INDEX IF EXISTS sessions_org_phase;
DROP INDEX IF EXISTS sessions_key_phase;
DROP INDEX IF EXISTS sessions_key_slot_at;
ANALYZE sessions;
