-- A session id is its org's own (PostgreSQL's 0018): the table that made an id unique
-- across orgs goes. The routes that name a session without its org find it through
-- sessions_by_id.
DROP TABLE session_owners;
