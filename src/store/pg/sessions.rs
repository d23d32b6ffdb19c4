//! PostgreSQL's set-based statements on session rows, as the ledger books them: a booking
//! written in one statement (sessions, rollups, spans, funding), sessions inserted, locked
//! and read, the claims of session ids (the gate's too), and org ids looked up; whole
//! columns bound as arrays each.

// The dialect's words and the shared SQL's items (`Tx`, `Rec`, the column lists) are the
// parent's.
use super::*;

/// One column of `rows` as an array parameter.
pub(super) fn column<T, F: Fn(&Session) -> T>(rows: &[Session], f: F) -> Vec<T> {
    rows.iter().map(f).collect()
}

pub(super) const SESSION_ARRAYS: &str =
    "$1::text[], $2::text[], $3::text[], $4::text[], $5::text[], \
     $6::text[], $7::text[], $8::text[], $9::int8[], $10::int8[], $11::int8[], $12::int8[], \
     $13::int8[], $14::int8[], $15::bool[], $16::int8[], $17::int8[], $18::text[], $19::int8[], \
     $20::int8[], $21::text[]";

/// Bind every column of `rows` as one array each, in `SESSION_COLUMNS` order ($1..$21).
pub(super) fn bind_sessions<'q>(
    q: sqlx::query::Query<'q, DB, sqlx::postgres::PgArguments>,
    rows: &[Session],
) -> sqlx::query::Query<'q, DB, sqlx::postgres::PgArguments> {
    q.bind(column(rows, |r| r.org_id.clone()))
        .bind(column(rows, |r| r.session_id.clone()))
        .bind(column(rows, |r| r.key_id.clone()))
        .bind(column(rows, |r| r.agent.clone()))
        .bind(column(rows, |r| r.project_id.clone()))
        .bind(column(rows, |r| r.started_by.clone()))
        .bind(column(rows, |r| r.vm_id.clone()))
        .bind(column(rows, |r| r.ledger.phase.as_str()))
        .bind(column(rows, |r| r.ledger.last_seq))
        .bind(column(rows, |r| r.ledger.last_at))
        .bind(column(rows, |r| r.ledger.span_start))
        .bind(column(rows, |r| r.ledger.billed_seconds))
        .bind(column(rows, |r| r.ledger.heartbeats))
        .bind(column(rows, |r| r.ledger.silences))
        .bind(column(rows, |r| r.unadmitted))
        .bind(column(rows, |r| r.created_at))
        .bind(column(rows, |r| r.ledger.ended_at))
        .bind(column(rows, |r| r.ledger.end_status.map(EndStatus::as_str)))
        .bind(column(rows, |r| r.heard_at))
        .bind(column(rows, |r| held_columns(&r.ledger.held).0))
        .bind(column(rows, |r| held_columns(&r.ledger.held).1))
}

/// Write what one transaction books (session rows, both rollups, closed spans, and who
/// pays for it) in one statement: one round trip while the rows stay locked, whatever the
/// group's size.
pub(super) async fn write_booking(tx: &mut Tx, shard: i64, b: &Booking) -> StoreResult<()> {
    if b.is_empty() {
        return Ok(());
    }
    let sessions: Vec<Session> = b.sessions.values().cloned().collect();
    let (org_hours, session_hours, spans) = (&b.org_hours, &b.session_hours, &b.spans);
    let f = &b.funding;
    let m = &b.member_hours;
    let orgs: Vec<String> = sorted_unique(b.sessions.values().map(|s| s.org_id.clone()));
    let sql = format!(
        "WITH s AS (INSERT INTO sessions ({SESSION_COLUMNS}) SELECT * FROM UNNEST({SESSION_ARRAYS}){SESSION_UPSERT}), \
         o AS (INSERT INTO org_hourly (org_id, hour, shard, seconds) \
               SELECT o, h, $34::int8, s FROM UNNEST($22::text[], $23::int8[], $24::int8[]) AS u(o, h, s) \
               {ORG_HOURS_CONFLICT}), \
         h AS (INSERT INTO session_hourly (org_id, hour, session_id, seconds) \
               SELECT * FROM UNNEST($25::text[], $26::int8[], $27::text[], $28::int8[]){SESSION_HOURS_CONFLICT}), \
         fw AS (INSERT INTO funding_windows ({FUNDING_WINDOW_COLUMNS}) \
               SELECT * FROM UNNEST($35::text[], $36::text[], $37::int8[], $38::int8[], $39::int8[], \
                 $40::int8[], $41::int8[], $42::int8[], $43::int8[]){FUNDING_WINDOW_UPSERT}), \
         g AS (UPDATE grants SET used_seconds = u.used, used_up_at = u.used_up_at \
               FROM UNNEST($44::text[], $45::text[], $46::int8[], $54::int8[]) AS u(org_id, grant_id, used, used_up_at) \
               WHERE grants.org_id = ANY($47) AND grants.org_id = u.org_id AND grants.grant_id = u.grant_id), \
         fh AS (INSERT INTO funding_hourly (org_id, hour, source, grant_id, seconds, charge_units) \
               SELECT * FROM UNNEST($48::text[], $49::int8[], $50::text[], $51::text[], $52::int8[], \
                 $53::int8[]){FUNDING_HOURS_CONFLICT}), \
         mh AS (INSERT INTO member_hourly (org_id, dimension, bucket, member_id, seconds) \
               SELECT * FROM UNNEST($55::text[], $56::text[], $57::int8[], $58::text[], $59::int8[]) \
               {MEMBER_HOURS_CONFLICT}) \
         INSERT INTO spans (org_id, session_id, start_at, end_at, kind) \
         SELECT * FROM UNNEST($29::text[], $30::text[], $31::int8[], $32::int8[], $33::text[])"
    );
    fn col<T, U>(rows: impl IntoIterator<Item = T>, f: impl Fn(T) -> U) -> Vec<U> {
        rows.into_iter().map(f).collect()
    }
    bind_sessions(sqlx::query(&sql), &sessions)
        .bind(col(org_hours.keys(), |(o, _)| o.clone()))
        .bind(col(org_hours.keys(), |(_, h)| *h))
        .bind(col(org_hours.values(), |s| *s))
        .bind(col(session_hours.keys(), |(o, _, _)| o.clone()))
        .bind(col(session_hours.keys(), |(_, h, _)| *h))
        .bind(col(session_hours.keys(), |(_, _, s)| s.clone()))
        .bind(col(session_hours.values(), |s| *s))
        .bind(col(spans, |(o, _, _)| o.clone()))
        .bind(col(spans, |(_, s, _)| s.clone()))
        .bind(col(spans, |(_, _, sp)| sp.interval.start))
        .bind(col(spans, |(_, _, sp)| sp.interval.end))
        .bind(col(spans, |(_, _, sp)| span_kind(sp.kind)))
        .bind(shard)
        .bind(col(&f.windows, |(o, _)| o.clone()))
        .bind(col(&f.windows, |(_, w)| w.kind.as_str()))
        .bind(col(&f.windows, |(_, w)| w.window.start))
        .bind(col(&f.windows, |(_, w)| w.window.end))
        .bind(col(&f.windows, |(_, w)| w.funds.plan))
        .bind(col(&f.windows, |(_, w)| w.funds.grant))
        .bind(col(&f.windows, |(_, w)| w.funds.overage))
        .bind(col(&f.windows, |(_, w)| w.funds.grace))
        .bind(col(&f.windows, |(_, w)| w.funds.charge_units))
        .bind(col(&f.grants, |g| g.org_id.clone()))
        .bind(col(&f.grants, |g| g.grant_id.clone()))
        .bind(col(&f.grants, |g| g.used_seconds))
        .bind(&orgs)
        .bind(col(f.hourly.keys(), |(o, _, _, _)| o.clone()))
        .bind(col(f.hourly.keys(), |(_, h, _, _)| *h))
        .bind(col(f.hourly.keys(), |(_, _, s, _)| s.as_str()))
        .bind(col(f.hourly.keys(), |(_, _, _, g)| g.clone()))
        .bind(col(f.hourly.values(), |(s, _)| *s))
        .bind(col(f.hourly.values(), |(_, u)| *u))
        .bind(col(&f.grants, |g| g.used_up_at))
        .bind(col(m.keys(), |(o, _, _, _)| o.clone()))
        .bind(col(m.keys(), |(_, _, d, _)| d.as_str()))
        .bind(col(m.keys(), |(_, b, _, _)| *b))
        .bind(col(m.keys(), |(_, _, _, id)| id.clone()))
        .bind(col(m.values(), |s| *s))
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// Insert sessions first seen now, skipping any another writer inserted first; returns
/// how many were inserted.
pub(super) async fn insert_new_session_rows(tx: &mut Tx, rows: &[Session]) -> StoreResult<u64> {
    // Counted from RETURNING: a distributed PostgreSQL reports the rows offered to an
    // INSERT … SELECT … ON CONFLICT DO NOTHING, not the rows inserted (citus#3377).
    let sql = format!(
        "INSERT INTO sessions ({SESSION_COLUMNS}) SELECT * FROM UNNEST({SESSION_ARRAYS}) \
         ON CONFLICT DO NOTHING RETURNING 1"
    );
    Ok(bind_sessions(sqlx::query(&sql), rows)
        .fetch_all(&mut **tx)
        .await?
        .len() as u64)
}

/// Up to `limit` sessions of `orgs` (one shard's) where `condition` (ending in a
/// comparison with `since`) holds, skipping rows another writer holds.
pub(super) async fn lock_sessions_where(
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

/// Claim session ids for the orgs that name them (a session id belongs to one org); returns
/// the ids claimed: not those another writer holds.
pub(super) async fn claim_owners(tx: &mut Tx, pairs: &[(&str, &str)]) -> StoreResult<Vec<String>> {
    let (orgs, ids): (Vec<&str>, Vec<&str>) = pairs.iter().copied().unzip();
    Ok(sqlx::query_scalar(
        "INSERT INTO session_owners (org_id, session_id) \
         SELECT * FROM UNNEST($1::text[], $2::text[]) ON CONFLICT DO NOTHING RETURNING session_id",
    )
    .bind(orgs)
    .bind(ids)
    .fetch_all(&mut **tx)
    .await?)
}

/// Give back claims of session ids that were not used.
pub(super) async fn release_owners(tx: &mut Tx, ids: &[&str]) -> StoreResult<()> {
    sqlx::query("DELETE FROM session_owners WHERE session_id = ANY($1)")
        .bind(ids)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// The owner of each of these session ids that has one.
pub(super) async fn select_owners(tx: &mut Tx, ids: &[&str]) -> StoreResult<Vec<(String, String)>> {
    Ok(
        sqlx::query_as("SELECT session_id, org_id FROM session_owners WHERE session_id = ANY($1)")
            .bind(ids)
            .fetch_all(&mut **tx)
            .await?,
    )
}

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

pub(super) async fn select_org_ids(tx: &mut Tx, ids: &[&str]) -> StoreResult<Vec<String>> {
    Ok(
        sqlx::query_scalar::<_, String>("SELECT org_id FROM orgs WHERE org_id = ANY($1)")
            .bind(ids)
            .fetch_all(&mut **tx)
            .await?,
    )
}

pub(super) async fn select_orgs_in<'e, E: sqlx::Executor<'e, Database = DB>>(
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
