-- A token's life: an expiry set when it is made, a revocation, and when it was last used
-- (written in batches off the request path: on Citus tokens are a reference table, and a
-- write a request would be a distributed transaction).
ALTER TABLE tokens ADD COLUMN expires_at BIGINT;
ALTER TABLE tokens ADD COLUMN revoked_at BIGINT;
ALTER TABLE tokens ADD COLUMN last_used_at BIGINT;
