-- Distribute rush-meter's tables over a Citus cluster: run once on the coordinator, after
-- `rush-meter migrate` (or the first start) has created them, then restart every instance
-- so that it reads the new layout (docs/operations.md, "From one PostgreSQL to Citus").
--
--   psql "$RUSH_METER_DATABASE_URL" -v ON_ERROR_STOP=1 -f migrations/citus/distribute.sql
--
-- Every table that holds an org's rows is distributed by org_id and co-located with orgs,
-- so that an org's sessions, bookings, keys and notifications sit on one worker and every
-- statement the service sends for an org is routed to one shard. The lookup keyed by an
-- id of its own (which org a Stripe customer belongs to) is distributed by that id; the
-- small tables every org reads are reference tables (a copy on each node).
-- tests/citus.rs checks that this file names every table, the right way.

CREATE EXTENSION IF NOT EXISTS citus;

BEGIN;
-- One connection per worker for the whole transaction: the foreign keys between the org
-- tables are created over the same connections as the shards they join.
SET LOCAL citus.multi_shard_modify_mode TO 'sequential';

-- Run again after a release adds a table: a table Citus already holds is left as it is.
CREATE FUNCTION pg_temp.undistributed(t regclass) RETURNS boolean LANGUAGE sql AS
  $$ SELECT NOT EXISTS (SELECT 1 FROM pg_dist_partition WHERE logicalrelid = t) $$;

-- Shared by every org.
SELECT create_reference_table('tokens')
  WHERE pg_temp.undistributed('tokens');
SELECT create_reference_table('stripe_events')
  WHERE pg_temp.undistributed('stripe_events');
SELECT create_reference_table('periods')
  WHERE pg_temp.undistributed('periods');
SELECT create_reference_table('plan_versions')
  WHERE pg_temp.undistributed('plan_versions');

-- An org's rows, in the order their foreign keys need (parents first).
SELECT create_distributed_table('orgs', 'org_id')
  WHERE pg_temp.undistributed('orgs');
SELECT create_distributed_table('api_keys', 'org_id', colocate_with => 'orgs')
  WHERE pg_temp.undistributed('api_keys');
SELECT create_distributed_table('sessions', 'org_id', colocate_with => 'orgs')
  WHERE pg_temp.undistributed('sessions');
SELECT create_distributed_table('spans', 'org_id', colocate_with => 'orgs')
  WHERE pg_temp.undistributed('spans');
SELECT create_distributed_table('org_hourly', 'org_id', colocate_with => 'orgs')
  WHERE pg_temp.undistributed('org_hourly');
SELECT create_distributed_table('session_hourly', 'org_id', colocate_with => 'orgs')
  WHERE pg_temp.undistributed('session_hourly');
SELECT create_distributed_table('decisions', 'org_id', colocate_with => 'orgs')
  WHERE pg_temp.undistributed('decisions');
SELECT create_distributed_table('stripe_requests', 'org_id', colocate_with => 'orgs')
  WHERE pg_temp.undistributed('stripe_requests');
SELECT create_distributed_table('stripe_changes', 'org_id', colocate_with => 'orgs')
  WHERE pg_temp.undistributed('stripe_changes');
SELECT create_distributed_table('period_orgs', 'org_id', colocate_with => 'orgs')
  WHERE pg_temp.undistributed('period_orgs');
SELECT create_distributed_table('period_sessions', 'org_id', colocate_with => 'orgs')
  WHERE pg_temp.undistributed('period_sessions');
SELECT create_distributed_table('notifications', 'org_id', colocate_with => 'orgs')
  WHERE pg_temp.undistributed('notifications');
SELECT create_distributed_table('grants', 'org_id', colocate_with => 'orgs')
  WHERE pg_temp.undistributed('grants');
SELECT create_distributed_table('funding_windows', 'org_id', colocate_with => 'orgs')
  WHERE pg_temp.undistributed('funding_windows');
SELECT create_distributed_table('funding_hourly', 'org_id', colocate_with => 'orgs')
  WHERE pg_temp.undistributed('funding_hourly');
SELECT create_distributed_table('overage_charges', 'org_id', colocate_with => 'orgs')
  WHERE pg_temp.undistributed('overage_charges');
SELECT create_distributed_table('member_hourly', 'org_id', colocate_with => 'orgs')
  WHERE pg_temp.undistributed('member_hourly');
SELECT create_distributed_table('member_limits', 'org_id', colocate_with => 'orgs')
  WHERE pg_temp.undistributed('member_limits');
SELECT create_distributed_table('audit_log', 'org_id', colocate_with => 'orgs')
  WHERE pg_temp.undistributed('audit_log');
SELECT create_distributed_table('room_waits', 'org_id', colocate_with => 'orgs')
  WHERE pg_temp.undistributed('room_waits');
SELECT create_distributed_table('auto_topups', 'org_id', colocate_with => 'orgs')
  WHERE pg_temp.undistributed('auto_topups');

-- Keyed by an id of its own; written in the transaction that writes the org's rows. After
-- the org tables: a group made with 'none' first would be the one `orgs` joins by default.
SELECT create_distributed_table('stripe_customers', 'customer_id', colocate_with => 'none')
  WHERE pg_temp.undistributed('stripe_customers');

COMMIT;
