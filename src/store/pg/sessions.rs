//! PostgreSQL's set-based statements on session rows, as the ledger books them: a booking
//! written in one statement (sessions, rollups, spans, funding), sessions inserted, locked
//! and read, and org ids looked up; whole columns bound as arrays each.

// The dialect's words and the shared SQL's items (`Tx`, `Rec`, the column lists) are the
// parent's.
use super::params::Params;
use super::*;

/// The sessions of orgs `$1` with ids `$2`, locked, on one PostgreSQL.
pub(super) const SESSION_LOCK: &str =
    "SELECT * FROM sessions WHERE org_id IN (SELECT UNNEST($1::text[])) \
     AND session_id = ANY($2) ORDER BY session_id COLLATE \"C\" FOR UPDATE";

/// The same on a spread layout.
const SHARD_SESSION_LOCK: &str = "SELECT * FROM sessions WHERE org_id = ANY($1) \
     AND session_id = ANY($2) ORDER BY session_id COLLATE \"C\" FOR UPDATE";

/// Lock and read the sessions with these ids of these orgs (one shard's). Locks are taken
/// in `session_id` byte order (the order the caller's chunks follow, whatever the
/// database's collation), shard after shard, so writers on several instances never
/// deadlock. Found by id (the primary key is led by `session_id`), the orgs a filter.
///
/// `one` (every org's rows in one place): the orgs are a hashed semi-join. A generic plan
/// (`begin_hot`) cannot hash `org_id = ANY($1)`, whose array is a parameter, so it tests
/// each row against every org of the group in turn. Spread layouts keep `= ANY($1)`: it
/// is what routes the statement to the orgs' shard (Citus, partition pruning).
pub(super) async fn select_sessions_for_update(
    tx: &mut Tx,
    one: bool,
    orgs: &[&str],
    pairs: &[(&str, &str)],
) -> StoreResult<Vec<Rec<Session>>> {
    let ids: Vec<&str> = pairs.iter().map(|(id, _)| *id).collect();
    // A table not yet analyzed gets its statistics within seconds (`gather_statistics`).
    let sql = if one {
        SESSION_LOCK
    } else {
        SHARD_SESSION_LOCK
    };
    Ok(sqlx::query_as::<_, Rec<Session>>(sql)
        .bind(orgs)
        .bind(ids)
        .fetch_all(&mut **tx)
        .await?)
}

impl SessionRows for Pg {
    /// Write what one transaction books (session rows, both rollups, closed spans, and who
    /// pays for it) in one statement: one round trip while the rows stay locked, whatever the
    /// group's size. On Citus, a statement a table (`values`).
    async fn write_booking(&self, tx: &mut Tx, shard: i64, b: &Booking) -> StoreResult<()> {
        if b.is_empty() {
            return Ok(());
        }
        if self.distributed() {
            let sessions: Vec<&Session> = b.sessions.values().collect();
            for chunk in sessions.chunks(CHUNK) {
                insert_sessions(tx, chunk, Slot::Without, SESSION_UPSERT).await?;
            }
            return write_booking_rollups(tx, shard, b).await;
        }
        let sessions: Vec<Session> = b.sessions.values().cloned().collect();
        let (oh, sh, spans) = (&b.org_hours, &b.session_hours, &b.spans);
        let (f, m) = (&b.funding, &b.member_hours);
        let mut p = Params::new();
        let session_arrays = p.sessions(&sessions);
        let org_hours = [
            p.column("text[]", oh.keys(), |(o, _)| o.clone()),
            p.column("int8[]", oh.keys(), |(_, h)| *h),
            p.column("int8[]", oh.values(), |s| *s),
        ]
        .join(", ");
        let session_hours = [
            p.column("text[]", sh.keys(), |(o, _, _)| o.clone()),
            p.column("int8[]", sh.keys(), |(_, h, _)| *h),
            p.column("text[]", sh.keys(), |(_, _, s)| s.clone()),
            p.column("int8[]", sh.values(), |s| *s),
        ]
        .join(", ");
        let span_rows = [
            p.column("text[]", spans, |(o, _, _)| o.clone()),
            p.column("text[]", spans, |(_, s, _)| s.clone()),
            p.column("int8[]", spans, |(_, _, sp)| sp.interval.start),
            p.column("int8[]", spans, |(_, _, sp)| sp.interval.end),
            p.column("text[]", spans, |(_, _, sp)| span_kind(sp.kind)),
        ]
        .join(", ");
        let shard = p.add("int8", shard);
        let windows = [
            p.column("text[]", &f.windows, |(o, _)| o.clone()),
            p.column("text[]", &f.windows, |(_, w)| w.kind.as_str()),
            p.column("int8[]", &f.windows, |(_, w)| w.window.start),
            p.column("int8[]", &f.windows, |(_, w)| w.window.end),
            p.column("int8[]", &f.windows, |(_, w)| w.funds.plan),
            p.column("int8[]", &f.windows, |(_, w)| w.funds.grant),
            p.column("int8[]", &f.windows, |(_, w)| w.funds.overage),
            p.column("int8[]", &f.windows, |(_, w)| w.funds.grace),
            p.column("int8[]", &f.windows, |(_, w)| w.funds.charge_units),
        ]
        .join(", ");
        let grants = [
            p.column("text[]", &f.grants, |g| g.org_id.clone()),
            p.column("text[]", &f.grants, |g| g.grant_id.clone()),
            p.column("int8[]", &f.grants, |g| g.used_seconds),
            p.column("int8[]", &f.grants, |g| g.used_up_at),
        ]
        .join(", ");
        let grant_orgs = p.add(
            "text[]",
            sorted_unique(b.sessions.values().map(|s| s.org_id.clone())),
        );
        let funding_hours = [
            p.column("text[]", f.hourly.keys(), |(o, _, _, _)| o.clone()),
            p.column("int8[]", f.hourly.keys(), |(_, h, _, _)| *h),
            p.column("text[]", f.hourly.keys(), |(_, _, s, _)| s.as_str()),
            p.column("text[]", f.hourly.keys(), |(_, _, _, g)| g.clone()),
            p.column("int8[]", f.hourly.values(), |(s, _)| *s),
            p.column("int8[]", f.hourly.values(), |(_, u)| *u),
        ]
        .join(", ");
        let member_hours = [
            p.column("text[]", m.keys(), |(o, _, _, _)| o.clone()),
            p.column("text[]", m.keys(), |(_, _, d, _)| d.as_str()),
            p.column("int8[]", m.keys(), |(_, b, _, _)| *b),
            p.column("text[]", m.keys(), |(_, _, _, id)| id.clone()),
            p.column("int8[]", m.values(), |s| *s),
        ]
        .join(", ");
        let sql = format!(
            "WITH s AS (INSERT INTO sessions ({SESSION_COLUMNS}) SELECT * FROM UNNEST({session_arrays}){SESSION_UPSERT}), \
             o AS (INSERT INTO org_hourly (org_id, hour, shard, seconds) \
                   SELECT o, h, {shard}, s FROM UNNEST({org_hours}) AS u(o, h, s) {ORG_HOURS_CONFLICT}), \
             h AS (INSERT INTO session_hourly (org_id, hour, session_id, seconds) \
                   SELECT * FROM UNNEST({session_hours}){SESSION_HOURS_CONFLICT}), \
             fw AS (INSERT INTO funding_windows ({FUNDING_WINDOW_COLUMNS}) \
                   SELECT * FROM UNNEST({windows}){FUNDING_WINDOW_UPSERT}), \
             g AS (UPDATE grants SET used_seconds = u.used, used_up_at = u.used_up_at \
                   FROM UNNEST({grants}) AS u(org_id, grant_id, used, used_up_at) \
                   WHERE grants.org_id = ANY({grant_orgs}) AND grants.org_id = u.org_id \
                     AND grants.grant_id = u.grant_id), \
             fh AS (INSERT INTO funding_hourly (org_id, hour, source, grant_id, seconds, charge_units) \
                   SELECT * FROM UNNEST({funding_hours}){FUNDING_HOURS_CONFLICT}), \
             mh AS (INSERT INTO member_hourly (org_id, dimension, bucket, member_id, seconds) \
                   SELECT * FROM UNNEST({member_hours}) {MEMBER_HOURS_CONFLICT}) \
             INSERT INTO spans (org_id, session_id, start_at, end_at, kind) SELECT * FROM UNNEST({span_rows})"
        );
        sqlx::query_with(&sql, p.args).execute(&mut **tx).await?;
        Ok(())
    }

    /// Insert sessions first seen now, skipping any another writer inserted first; returns
    /// how many were inserted.
    async fn insert_new_session_rows(&self, tx: &mut Tx, rows: &[Session]) -> StoreResult<u64> {
        if self.distributed() {
            return insert_sessions(tx, rows, Slot::Without, " ON CONFLICT DO NOTHING").await;
        }
        // Counted from RETURNING: a distributed PostgreSQL reports the rows offered to an
        // INSERT … SELECT … ON CONFLICT DO NOTHING, not the rows inserted (citus#3377).
        let mut p = Params::new();
        let arrays = p.sessions(rows);
        let sql = format!(
            "INSERT INTO sessions ({SESSION_COLUMNS}) SELECT * FROM UNNEST({arrays}) \
             ON CONFLICT DO NOTHING RETURNING 1"
        );
        Ok(sqlx::query_with(&sql, p.args)
            .fetch_all(&mut **tx)
            .await?
            .len() as u64)
    }

    /// Up to `limit` sessions of `orgs` (one shard's) where `condition` (ending in a
    /// comparison with `since`) holds, skipping rows another writer holds.
    async fn lock_sessions_where(
        tx: &mut Tx,
        orgs: &[&str],
        condition: &str,
        since: Secs,
        limit: i64,
    ) -> StoreResult<Vec<Rec<Session>>> {
        Ok(sqlx::query_as::<_, Rec<Session>>(&format!(
            "SELECT * FROM sessions WHERE org_id = ANY($2) AND {condition}$1 \
             ORDER BY session_id LIMIT $3{}",
            Pg::SKIP_LOCKED
        ))
        .bind(since)
        .bind(orgs)
        .bind(limit)
        .fetch_all(&mut **tx)
        .await?)
    }

    async fn select_org_ids(tx: &mut Tx, ids: &[&str]) -> StoreResult<Vec<String>> {
        Ok(
            sqlx::query_scalar::<_, String>("SELECT org_id FROM orgs WHERE org_id = ANY($1)")
                .bind(ids)
                .fetch_all(&mut **tx)
                .await?,
        )
    }

    async fn select_orgs_in<'e, E: sqlx::Executor<'e, Database = DB>>(
        ex: E,
        ids: &[&str],
    ) -> StoreResult<Vec<Rec<Org>>> {
        Ok(
            sqlx::query_as::<_, Rec<Org>>("SELECT * FROM orgs WHERE org_id = ANY($1)")
                .bind(ids)
                .fetch_all(ex)
                .await?,
        )
    }
}
