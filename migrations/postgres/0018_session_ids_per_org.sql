-- A session id is its org's own: two orgs' sessions of one id are two sessions, keyed
-- (session_id, org_id) as they already are. The table that made an id unique across orgs
-- goes: it was a second shard in every admission of a new session on Citus (a table
-- distributed by session id beside sessions distributed by org), so every such admission
-- committed in two phases through the coordinator. The routes that name a session
-- without its org find it through the sessions' key, led by session_id.
DROP TABLE session_owners;
