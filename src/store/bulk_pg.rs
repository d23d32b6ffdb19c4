// Set-based statements for PostgreSQL: whole columns bound as arrays and read back with
// UNNEST, so each statement has one fixed text (prepared once per connection) whatever
// the row count. Included into `store::pg` after `queries.rs`.

/// One column of `rows` as an array parameter.
fn column<T, F: Fn(&SessionRow) -> T>(rows: &[SessionRow], f: F) -> Vec<T> {
    rows.iter().map(f).collect()
}

const SESSION_ARRAYS: &str = "$1::text[], $2::text[], $3::text[], $4::text[], $5::text[], \
     $6::text[], $7::text[], $8::text[], $9::int8[], $10::int8[], $11::int8[], $12::int8[], \
     $13::int8[], $14::int8[], $15::bool[], $16::int8[], $17::int8[], $18::text[], $19::int8[]";

/// Bind every column of `rows` as one array each, in `SESSION_COLUMNS` order ($1..$19).
fn bind_sessions<'q>(
    q: sqlx::query::Query<'q, DB, sqlx::postgres::PgArguments>,
    rows: &[SessionRow],
) -> sqlx::query::Query<'q, DB, sqlx::postgres::PgArguments> {
    q.bind(column(rows, |r| r.org_id.clone()))
        .bind(column(rows, |r| r.session_id.clone()))
        .bind(column(rows, |r| r.key_id.clone()))
        .bind(column(rows, |r| r.agent.clone()))
        .bind(column(rows, |r| r.project_id.clone()))
        .bind(column(rows, |r| r.started_by.clone()))
        .bind(column(rows, |r| r.vm_id.clone()))
        .bind(column(rows, |r| r.phase.clone()))
        .bind(column(rows, |r| r.last_seq))
        .bind(column(rows, |r| r.last_at))
        .bind(column(rows, |r| r.span_start))
        .bind(column(rows, |r| r.billed_seconds))
        .bind(column(rows, |r| r.heartbeats))
        .bind(column(rows, |r| r.silences))
        .bind(column(rows, |r| r.unadmitted))
        .bind(column(rows, |r| r.created_at))
        .bind(column(rows, |r| r.ended_at))
        .bind(column(rows, |r| r.end_status.clone()))
        .bind(column(rows, |r| r.heard_at))
}

/// Write what one transaction books (session rows, both rollups, closed spans) in one
/// statement: one round trip while the rows stay locked, whatever the group's size.
async fn write_booking(
    tx: &mut Tx,
    shard: i64,
    sessions: &[SessionRow],
    org_hours: &[((String, Secs), i64)],
    session_hours: &[((String, Secs, String), i64)],
    spans: &[(String, String, ledger::Span)],
) -> StoreResult<()> {
    let sql = format!(
        "WITH s AS (INSERT INTO sessions ({SESSION_COLUMNS}) SELECT * FROM UNNEST({SESSION_ARRAYS}){SESSION_UPSERT}), \
         o AS (INSERT INTO org_hourly (org_id, hour, shard, seconds) \
               SELECT o, h, $32::int8, s FROM UNNEST($20::text[], $21::int8[], $22::int8[]) AS u(o, h, s) \
               {ORG_HOURS_CONFLICT}), \
         h AS (INSERT INTO session_hourly (org_id, hour, session_id, seconds) \
               SELECT * FROM UNNEST($23::text[], $24::int8[], $25::text[], $26::int8[]){SESSION_HOURS_CONFLICT}) \
         INSERT INTO spans (org_id, session_id, start_at, end_at, kind) \
         SELECT * FROM UNNEST($27::text[], $28::text[], $29::int8[], $30::int8[], $31::text[])"
    );
    bind_sessions(sqlx::query(&sql), sessions)
        .bind(org_hours.iter().map(|((o, _), _)| o.clone()).collect::<Vec<_>>())
        .bind(org_hours.iter().map(|((_, h), _)| *h).collect::<Vec<_>>())
        .bind(org_hours.iter().map(|(_, s)| *s).collect::<Vec<_>>())
        .bind(session_hours.iter().map(|((o, _, _), _)| o.clone()).collect::<Vec<_>>())
        .bind(session_hours.iter().map(|((_, h, _), _)| *h).collect::<Vec<_>>())
        .bind(session_hours.iter().map(|((_, _, s), _)| s.clone()).collect::<Vec<_>>())
        .bind(session_hours.iter().map(|(_, s)| *s).collect::<Vec<_>>())
        .bind(spans.iter().map(|(o, _, _)| o.clone()).collect::<Vec<_>>())
        .bind(spans.iter().map(|(_, s, _)| s.clone()).collect::<Vec<_>>())
        .bind(spans.iter().map(|(_, _, sp)| sp.interval.start).collect::<Vec<_>>())
        .bind(spans.iter().map(|(_, _, sp)| sp.interval.end).collect::<Vec<_>>())
        .bind(spans.iter().map(|(_, _, sp)| span_kind(sp.kind)).collect::<Vec<_>>())
        .bind(shard)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// Insert sessions first seen now, skipping any another writer inserted first; returns
/// how many were inserted.
async fn insert_new_session_rows(tx: &mut Tx, rows: &[SessionRow]) -> StoreResult<u64> {
    let sql = format!(
        "INSERT INTO sessions ({SESSION_COLUMNS}) SELECT * FROM UNNEST({SESSION_ARRAYS}) ON CONFLICT DO NOTHING"
    );
    Ok(bind_sessions(sqlx::query(&sql), rows)
        .execute(&mut **tx)
        .await?
        .rows_affected())
}

/// Locks are taken in `session_id` byte order (the order the caller's chunks follow, whatever
/// the database's collation), so writers on several instances never deadlock.
async fn select_sessions_for_update(tx: &mut Tx, ids: &[&str]) -> StoreResult<Vec<SessionRow>> {
    Ok(sqlx::query_as::<_, SessionRow>(
        "SELECT * FROM sessions WHERE session_id = ANY($1) \
         ORDER BY session_id COLLATE \"C\" FOR UPDATE",
    )
    .bind(ids)
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

async fn select_orgs(pool: &Pool<DB>, ids: &[&str]) -> StoreResult<Vec<OrgRow>> {
    Ok(
        sqlx::query_as::<_, OrgRow>("SELECT * FROM orgs WHERE org_id = ANY($1)")
            .bind(ids)
            .fetch_all(pool)
            .await?,
    )
}
