// Set-based statements for PostgreSQL: whole columns bound as arrays and read back with
// UNNEST, so each statement has one fixed text (prepared once per connection) whatever
// the row count. Included into `store::pg` after `queries.rs`.

/// One column of `rows` as an array parameter.
fn column<T, F: Fn(&SessionRow) -> T>(rows: &[SessionRow], f: F) -> Vec<T> {
    rows.iter().map(f).collect()
}

/// Write whole session rows: overwrite existing ones (`upsert`), or insert only new ones.
/// Returns the rows written.
async fn write_session_rows(tx: &mut Tx, rows: &[SessionRow], upsert: bool) -> StoreResult<u64> {
    let sql = format!(
        "INSERT INTO sessions ({SESSION_COLUMNS}) SELECT * FROM UNNEST(\
         $1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], \
         $8::text[], $9::int8[], $10::int8[], $11::int8[], $12::int8[], $13::int8[], \
         $14::int8[], $15::bool[], $16::int8[], $17::int8[], $18::text[]){}",
        if upsert { SESSION_UPSERT } else { " ON CONFLICT DO NOTHING" }
    );
    let done = sqlx::query(&sql)
        .bind(column(rows, |r| r.org_id.clone()))
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
        .execute(&mut **tx)
        .await?;
    Ok(done.rows_affected())
}

async fn add_org_hours(tx: &mut Tx, rows: &[((String, Secs), i64)]) -> StoreResult<()> {
    sqlx::query(&format!(
        "INSERT INTO org_hourly (org_id, hour, seconds) \
         SELECT * FROM UNNEST($1::text[], $2::int8[], $3::int8[]){ORG_HOURS_CONFLICT}"
    ))
    .bind(rows.iter().map(|((o, _), _)| o.clone()).collect::<Vec<_>>())
    .bind(rows.iter().map(|((_, h), _)| *h).collect::<Vec<_>>())
    .bind(rows.iter().map(|(_, s)| *s).collect::<Vec<_>>())
    .execute(&mut **tx)
    .await?;
    Ok(())
}

async fn add_session_hours(tx: &mut Tx, rows: &[((String, Secs, String), i64)]) -> StoreResult<()> {
    sqlx::query(&format!(
        "INSERT INTO session_hourly (org_id, hour, session_id, seconds) \
         SELECT * FROM UNNEST($1::text[], $2::int8[], $3::text[], $4::int8[]){SESSION_HOURS_CONFLICT}"
    ))
    .bind(rows.iter().map(|((o, _, _), _)| o.clone()).collect::<Vec<_>>())
    .bind(rows.iter().map(|((_, h, _), _)| *h).collect::<Vec<_>>())
    .bind(rows.iter().map(|((_, _, s), _)| s.clone()).collect::<Vec<_>>())
    .bind(rows.iter().map(|(_, s)| *s).collect::<Vec<_>>())
    .execute(&mut **tx)
    .await?;
    Ok(())
}

async fn insert_spans(tx: &mut Tx, rows: &[(String, String, ledger::Span)]) -> StoreResult<()> {
    sqlx::query(
        "INSERT INTO spans (org_id, session_id, start_at, end_at, kind) \
         SELECT * FROM UNNEST($1::text[], $2::text[], $3::int8[], $4::int8[], $5::text[])",
    )
    .bind(rows.iter().map(|(o, _, _)| o.clone()).collect::<Vec<_>>())
    .bind(rows.iter().map(|(_, s, _)| s.clone()).collect::<Vec<_>>())
    .bind(rows.iter().map(|(_, _, sp)| sp.interval.start).collect::<Vec<_>>())
    .bind(rows.iter().map(|(_, _, sp)| sp.interval.end).collect::<Vec<_>>())
    .bind(rows.iter().map(|(_, _, sp)| span_kind(sp.kind)).collect::<Vec<_>>())
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Locks are taken in `session_id` order, so writers on several instances never deadlock.
async fn select_sessions_for_update(tx: &mut Tx, ids: &[&str]) -> StoreResult<Vec<SessionRow>> {
    Ok(sqlx::query_as::<_, SessionRow>(
        "SELECT * FROM sessions WHERE session_id = ANY($1) ORDER BY session_id FOR UPDATE",
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
