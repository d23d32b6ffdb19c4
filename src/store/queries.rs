// The SQL of rush-meter, written once and compiled per backend: this file is
// `include!`d by `store::pg` and `store::sqlite`, each defining `DB`, `BEGIN_WRITE`,
// `FOR_UPDATE` and `SKIP_LOCKED` first.

use std::collections::{BTreeMap, HashMap};

use sqlx::{Pool, QueryBuilder, Transaction};

use super::{
    HeartbeatOutcome, IngestReject, KeyRow, OrgRow, OrgUpsert, SessionCounts, SessionRow,
    StoreResult, TokenRow,
};
use crate::ingest::Heartbeat;
use crate::ledger::{self, Effects, EndStatus, Interval, Rules, Secs, SessionLedger, VmState};

type Tx = Transaction<'static, DB>;

/// Rows a multi-row statement carries at most (SQLite allows 32,766 bound values).
const CHUNK: usize = 500;

async fn begin_write(pool: &Pool<DB>) -> StoreResult<Tx> {
    Ok(pool.begin_with(BEGIN_WRITE).await?)
}

pub async fn ping(pool: &Pool<DB>) -> StoreResult<()> {
    sqlx::query("SELECT 1").execute(pool).await?;
    Ok(())
}

// ----- orgs, keys, tokens -----

pub async fn upsert_org(pool: &Pool<DB>, org: &OrgUpsert, now: Secs) -> StoreResult<OrgRow> {
    Ok(sqlx::query_as::<_, OrgRow>(
        "INSERT INTO orgs (org_id, name, plan_id, suspended, created_at, updated_at) \
         VALUES ($1, COALESCE($2, $1), COALESCE($3, 'free'), COALESCE($4, FALSE), $5, $5) \
         ON CONFLICT (org_id) DO UPDATE SET \
           name = COALESCE($2, orgs.name), plan_id = COALESCE($3, orgs.plan_id), \
           suspended = COALESCE($4, orgs.suspended), updated_at = $5 \
         RETURNING *",
    )
    .bind(&org.org_id)
    .bind(&org.name)
    .bind(&org.plan_id)
    .bind(org.suspended)
    .bind(now)
    .fetch_one(pool)
    .await?)
}

pub async fn get_org(pool: &Pool<DB>, org_id: &str) -> StoreResult<Option<OrgRow>> {
    Ok(sqlx::query_as::<_, OrgRow>("SELECT * FROM orgs WHERE org_id = $1")
        .bind(org_id)
        .fetch_optional(pool)
        .await?)
}

pub async fn upsert_key(
    pool: &Pool<DB>,
    org_id: &str,
    key_id: &str,
    limit: Option<i64>,
    now: Secs,
) -> StoreResult<KeyRow> {
    Ok(sqlx::query_as::<_, KeyRow>(
        "INSERT INTO api_keys (org_id, key_id, concurrency_limit, created_at, updated_at) \
         VALUES ($1, $2, $3, $4, $4) \
         ON CONFLICT (org_id, key_id) DO UPDATE SET \
           concurrency_limit = $3, updated_at = $4 \
         RETURNING *",
    )
    .bind(org_id)
    .bind(key_id)
    .bind(limit)
    .bind(now)
    .fetch_one(pool)
    .await?)
}

pub async fn get_key(pool: &Pool<DB>, org_id: &str, key_id: &str) -> StoreResult<Option<KeyRow>> {
    Ok(
        sqlx::query_as::<_, KeyRow>("SELECT * FROM api_keys WHERE org_id = $1 AND key_id = $2")
            .bind(org_id)
            .bind(key_id)
            .fetch_optional(pool)
            .await?,
    )
}

/// Insert a token, or give an existing secret (the bootstrap token) the row's scopes.
pub async fn insert_token(pool: &Pool<DB>, t: &TokenRow) -> StoreResult<()> {
    sqlx::query(
        "INSERT INTO tokens (token_id, secret_hash, scopes, org_id, label, created_at) \
         VALUES ($1, $2, $3, $4, $5, $6) \
         ON CONFLICT (secret_hash) DO UPDATE SET scopes = $3, org_id = $4, label = $5",
    )
    .bind(&t.token_id)
    .bind(&t.secret_hash)
    .bind(&t.scopes)
    .bind(&t.org_id)
    .bind(&t.label)
    .bind(t.created_at)
    .execute(pool)
    .await?;
    Ok(())
}

pub async fn token_by_hash(pool: &Pool<DB>, hash: &str) -> StoreResult<Option<TokenRow>> {
    Ok(
        sqlx::query_as::<_, TokenRow>("SELECT * FROM tokens WHERE secret_hash = $1")
            .bind(hash)
            .fetch_optional(pool)
            .await?,
    )
}

// ----- the ledger -----

/// What one transaction books, gathered in key order so that concurrent writers on
/// PostgreSQL take their row locks in the same order.
#[derive(Default)]
struct Booking {
    org_hours: BTreeMap<(String, Secs), i64>,
    session_hours: BTreeMap<(String, Secs, String), i64>,
    spans: Vec<(String, String, ledger::Span)>,
    sessions: BTreeMap<String, SessionRow>,
}

impl Booking {
    fn add(&mut self, row: &SessionRow, fx: &Effects) {
        if let Some(billed) = fx.billed {
            for (hour, secs) in ledger::split_hours(billed) {
                *self
                    .org_hours
                    .entry((row.org_id.clone(), hour))
                    .or_default() += secs;
                *self
                    .session_hours
                    .entry((row.org_id.clone(), hour, row.session_id.clone()))
                    .or_default() += secs;
            }
        }
        for span in &fx.closed {
            self.spans
                .push((row.org_id.clone(), row.session_id.clone(), *span));
        }
        self.sessions.insert(row.session_id.clone(), row.clone());
    }

    async fn write(self, tx: &mut Tx) -> StoreResult<()> {
        let sessions: Vec<SessionRow> = self.sessions.into_values().collect();
        for chunk in sessions.chunks(CHUNK) {
            upsert_sessions(tx, chunk).await?;
        }
        let org_hours: Vec<_> = self.org_hours.into_iter().collect();
        for chunk in org_hours.chunks(CHUNK) {
            let mut q = QueryBuilder::<DB>::new("INSERT INTO org_hourly (org_id, hour, seconds) ");
            q.push_values(chunk, |mut b, ((org, hour), secs)| {
                b.push_bind(org).push_bind(*hour).push_bind(*secs);
            });
            q.push(
                " ON CONFLICT (org_id, hour) DO UPDATE \
                  SET seconds = org_hourly.seconds + excluded.seconds",
            );
            q.build().execute(&mut **tx).await?;
        }
        let session_hours: Vec<_> = self.session_hours.into_iter().collect();
        for chunk in session_hours.chunks(CHUNK) {
            let mut q = QueryBuilder::<DB>::new(
                "INSERT INTO session_hourly (org_id, hour, session_id, seconds) ",
            );
            q.push_values(chunk, |mut b, ((org, hour, session), secs)| {
                b.push_bind(org)
                    .push_bind(*hour)
                    .push_bind(session)
                    .push_bind(*secs);
            });
            q.push(
                " ON CONFLICT (org_id, hour, session_id) DO UPDATE \
                  SET seconds = session_hourly.seconds + excluded.seconds",
            );
            q.build().execute(&mut **tx).await?;
        }
        for chunk in self.spans.chunks(CHUNK) {
            let mut q = QueryBuilder::<DB>::new(
                "INSERT INTO spans (org_id, session_id, start_at, end_at, kind) ",
            );
            q.push_values(chunk, |mut b, (org, session, span)| {
                b.push_bind(org)
                    .push_bind(session)
                    .push_bind(span.interval.start)
                    .push_bind(span.interval.end)
                    .push_bind(span_kind(span.kind));
            });
            q.build().execute(&mut **tx).await?;
        }
        Ok(())
    }
}

fn span_kind(kind: VmState) -> &'static str {
    match kind {
        VmState::Running => "running",
        VmState::Parked => "parked",
    }
}

const SESSION_COLUMNS: &str = "org_id, session_id, key_id, agent, project_id, started_by, \
     vm_id, phase, last_seq, last_at, span_start, billed_seconds, heartbeats, silences, \
     unadmitted, created_at, ended_at, end_status";

/// `INSERT INTO sessions … VALUES …` for whole rows; the caller adds the conflict rule.
fn insert_sessions(rows: &[SessionRow]) -> QueryBuilder<'_, DB> {
    let mut q = QueryBuilder::<DB>::new(format!("INSERT INTO sessions ({SESSION_COLUMNS}) "));
    q.push_values(rows, |mut b, r| {
        b.push_bind(&r.org_id)
            .push_bind(&r.session_id)
            .push_bind(&r.key_id)
            .push_bind(&r.agent)
            .push_bind(&r.project_id)
            .push_bind(&r.started_by)
            .push_bind(&r.vm_id)
            .push_bind(&r.phase)
            .push_bind(r.last_seq)
            .push_bind(r.last_at)
            .push_bind(r.span_start)
            .push_bind(r.billed_seconds)
            .push_bind(r.heartbeats)
            .push_bind(r.silences)
            .push_bind(r.unadmitted)
            .push_bind(r.created_at)
            .push_bind(r.ended_at)
            .push_bind(&r.end_status);
    });
    q
}

/// Insert or overwrite whole session rows (the caller holds their row locks).
async fn upsert_sessions(tx: &mut Tx, rows: &[SessionRow]) -> StoreResult<()> {
    let mut q = insert_sessions(rows);
    q.push(
        " ON CONFLICT (session_id) DO UPDATE SET \
          key_id = excluded.key_id, agent = excluded.agent, project_id = excluded.project_id, \
          started_by = excluded.started_by, vm_id = excluded.vm_id, phase = excluded.phase, \
          last_seq = excluded.last_seq, last_at = excluded.last_at, \
          span_start = excluded.span_start, billed_seconds = excluded.billed_seconds, \
          heartbeats = excluded.heartbeats, silences = excluded.silences, \
          unadmitted = excluded.unadmitted, ended_at = excluded.ended_at, \
          end_status = excluded.end_status",
    );
    q.build().execute(&mut **tx).await?;
    Ok(())
}

/// Lock and read the sessions with these ids, in id order.
async fn lock_sessions(tx: &mut Tx, ids: &[&str]) -> StoreResult<Vec<SessionRow>> {
    let mut rows = Vec::with_capacity(ids.len());
    for chunk in ids.chunks(CHUNK) {
        let mut q = QueryBuilder::<DB>::new("SELECT * FROM sessions WHERE session_id IN (");
        let mut sep = q.separated(", ");
        for id in chunk {
            sep.push_bind(*id);
        }
        q.push(") ORDER BY session_id");
        q.push(FOR_UPDATE);
        rows.extend(q.build_query_as::<SessionRow>().fetch_all(&mut **tx).await?);
    }
    Ok(rows)
}

type RequestResult = Result<Vec<HeartbeatOutcome>, IngestReject>;

/// Apply a group of heartbeat requests in one transaction. Each request is accepted or
/// refused whole; the refused ones write nothing. Retries the whole group on a
/// serialization failure, a deadlock, or a session another instance created meanwhile.
pub async fn ingest(
    pool: &Pool<DB>,
    requests: &[Vec<Heartbeat>],
    rules: &Rules,
) -> StoreResult<Vec<RequestResult>> {
    let mut attempt = 0;
    loop {
        match ingest_once(pool, requests, rules).await {
            Ok(Some(done)) => return Ok(done),
            Ok(None) if attempt < 5 => {}
            Err(e) if e.is_retryable() && attempt < 5 => {}
            Ok(None) => {
                return Err(super::StoreError::Conflict(
                    "sessions kept changing owner during ingest".into(),
                ))
            }
            Err(e) => return Err(e),
        }
        attempt += 1;
    }
}

async fn ingest_once(
    pool: &Pool<DB>,
    requests: &[Vec<Heartbeat>],
    rules: &Rules,
) -> StoreResult<Option<Vec<RequestResult>>> {
    let mut tx = begin_write(pool).await?;

    let mut org_ids: Vec<&str> = requests.iter().flatten().map(|h| h.org_id.as_str()).collect();
    org_ids.sort_unstable();
    org_ids.dedup();
    let known_orgs = existing_orgs(&mut tx, &org_ids).await?;

    let mut session_ids: Vec<&str> = requests
        .iter()
        .flatten()
        .map(|h| h.session_id.as_str())
        .collect();
    session_ids.sort_unstable();
    session_ids.dedup();
    let mut rows: HashMap<String, SessionRow> = lock_sessions(&mut tx, &session_ids)
        .await?
        .into_iter()
        .map(|r| (r.session_id.clone(), r))
        .collect();

    // Decide each request whole, in arrival order; new sessions go to the first that names them.
    let mut verdicts: Vec<Result<(), IngestReject>> = Vec::with_capacity(requests.len());
    let mut created: BTreeMap<String, SessionRow> = BTreeMap::new();
    for request in requests {
        let verdict = check_request(request, &known_orgs, &rows, &created);
        if verdict.is_ok() {
            for h in request {
                if !rows.contains_key(h.session_id.as_str()) {
                    created.entry(h.session_id.to_string()).or_insert_with(|| {
                        SessionRow::unadmitted(
                            h.org_id.as_str(),
                            h.session_id.as_str(),
                            h.vm_id.as_str(),
                            h.obs.at,
                        )
                    });
                }
            }
        }
        verdicts.push(verdict);
    }
    if !created.is_empty() {
        let new_rows: Vec<SessionRow> = created.values().cloned().collect();
        if !insert_new_sessions(&mut tx, &new_rows).await? {
            // Another instance created one of them first: start over and see its owner.
            return Ok(None);
        }
        rows.extend(created);
    }

    // Apply every accepted heartbeat in (session, seq) order.
    let mut order: Vec<(usize, usize)> = verdicts
        .iter()
        .enumerate()
        .filter(|(_, v)| v.is_ok())
        .flat_map(|(r, _)| (0..requests[r].len()).map(move |i| (r, i)))
        .collect();
    order.sort_by(|a, b| {
        let (x, y) = (&requests[a.0][a.1], &requests[b.0][b.1]);
        (x.session_id.as_str(), x.obs.seq, a).cmp(&(y.session_id.as_str(), y.obs.seq, b))
    });
    let mut outcomes: Vec<Vec<Option<HeartbeatOutcome>>> =
        requests.iter().map(|r| vec![None; r.len()]).collect();
    let mut booking = Booking::default();
    for (r, i) in order {
        let h = &requests[r][i];
        let row = rows
            .get_mut(h.session_id.as_str())
            .expect("every accepted session was read or created");
        let (led, fx) = ledger::apply_heartbeat(&row.ledger(), &h.obs, rules);
        if !fx.ignored {
            row.set_ledger(&led);
            row.vm_id = Some(h.vm_id.to_string());
            booking.add(row, &fx);
        }
        outcomes[r][i] = Some(HeartbeatOutcome {
            session_id: row.session_id.clone(),
            org_id: row.org_id.clone(),
            duplicate: fx.ignored,
            phase: led.phase,
        });
    }
    booking.write(&mut tx).await?;
    tx.commit().await?;

    Ok(Some(
        verdicts
            .into_iter()
            .zip(outcomes)
            .map(|(v, outs)| v.map(|()| outs.into_iter().map(|o| o.expect("applied")).collect()))
            .collect(),
    ))
}

fn check_request(
    request: &[Heartbeat],
    known_orgs: &[String],
    rows: &HashMap<String, SessionRow>,
    created: &BTreeMap<String, SessionRow>,
) -> Result<(), IngestReject> {
    for (index, h) in request.iter().enumerate() {
        if known_orgs.binary_search_by(|o| o.as_str().cmp(h.org_id.as_str())).is_err() {
            return Err(IngestReject::UnknownOrg {
                index,
                org_id: h.org_id.to_string(),
            });
        }
        let owner = rows
            .get(h.session_id.as_str())
            .or_else(|| created.get(h.session_id.as_str()))
            .map(|r| r.org_id.as_str());
        if owner.is_some_and(|o| o != h.org_id.as_str()) {
            return Err(IngestReject::SessionOfAnotherOrg {
                index,
                session_id: h.session_id.to_string(),
            });
        }
    }
    // Within one request, a session named under two orgs is refused too.
    let mut seen: HashMap<&str, &str> = HashMap::new();
    for (index, h) in request.iter().enumerate() {
        let org = *seen
            .entry(h.session_id.as_str())
            .or_insert(h.org_id.as_str());
        if org != h.org_id.as_str() {
            return Err(IngestReject::SessionOfAnotherOrg {
                index,
                session_id: h.session_id.to_string(),
            });
        }
    }
    Ok(())
}

/// Sorted ids of the orgs that exist among `ids`.
async fn existing_orgs(tx: &mut Tx, ids: &[&str]) -> StoreResult<Vec<String>> {
    let mut found = Vec::with_capacity(ids.len());
    for chunk in ids.chunks(CHUNK) {
        let mut q = QueryBuilder::<DB>::new("SELECT org_id FROM orgs WHERE org_id IN (");
        let mut sep = q.separated(", ");
        for id in chunk {
            sep.push_bind(*id);
        }
        q.push(")");
        found.extend(
            q.build_query_scalar::<String>()
                .fetch_all(&mut **tx)
                .await?,
        );
    }
    found.sort_unstable();
    Ok(found)
}

/// Insert sessions first seen now; false if another writer inserted any of them first.
async fn insert_new_sessions(tx: &mut Tx, rows: &[SessionRow]) -> StoreResult<bool> {
    let mut inserted = 0;
    for chunk in rows.chunks(CHUNK) {
        let mut q = insert_sessions(chunk);
        q.push(" ON CONFLICT DO NOTHING");
        inserted += q.build().execute(&mut **tx).await?.rows_affected();
    }
    Ok(inserted == rows.len() as u64)
}

/// End a session; `None` if it does not exist (or belongs to another org than `scope_org`).
pub async fn end_session(
    pool: &Pool<DB>,
    session_id: &str,
    scope_org: Option<&str>,
    status: EndStatus,
    now: Secs,
    rules: &Rules,
) -> StoreResult<Option<SessionRow>> {
    let mut tx = begin_write(pool).await?;
    let Some(mut row) = lock_sessions(&mut tx, &[session_id]).await?.pop() else {
        return Ok(None);
    };
    if scope_org.is_some_and(|o| o != row.org_id) {
        return Ok(None);
    }
    let (led, fx) = ledger::end_session(&row.ledger(), now, status, rules);
    if !fx.ignored {
        row.set_ledger(&led);
        let mut booking = Booking::default();
        booking.add(&row, &fx);
        booking.write(&mut tx).await?;
        tx.commit().await?;
    }
    Ok(Some(row))
}

/// Book what time alone decides, for up to `limit` sessions. Instances running this at
/// once on PostgreSQL skip each other's rows.
pub async fn expire_sessions(
    pool: &Pool<DB>,
    now: Secs,
    rules: &Rules,
    limit: i64,
) -> StoreResult<usize> {
    let mut tx = begin_write(pool).await?;
    let mut rows = sqlx::query_as::<_, SessionRow>(&format!(
        "SELECT * FROM sessions WHERE phase = 'running' AND last_at < $1 \
         ORDER BY session_id LIMIT $2{SKIP_LOCKED}"
    ))
    .bind(now - 2 * rules.lease)
    .bind(limit)
    .fetch_all(&mut *tx)
    .await?;
    rows.extend(
        sqlx::query_as::<_, SessionRow>(&format!(
            "SELECT * FROM sessions WHERE phase = 'parked' AND span_start <= $1 \
             ORDER BY session_id LIMIT $2{SKIP_LOCKED}"
        ))
        .bind(now - ledger::PARKED_EXPIRY_SECS)
        .bind(limit)
        .fetch_all(&mut *tx)
        .await?,
    );
    let mut booking = Booking::default();
    for mut row in rows {
        if let Some((led, fx)) = ledger::expire(&row.ledger(), now, rules) {
            row.set_ledger(&led);
            booking.add(&row, &fx);
        }
    }
    let changed = booking.sessions.len();
    booking.write(&mut tx).await?;
    tx.commit().await?;
    Ok(changed)
}

pub async fn get_session(pool: &Pool<DB>, session_id: &str) -> StoreResult<Option<SessionRow>> {
    Ok(
        sqlx::query_as::<_, SessionRow>("SELECT * FROM sessions WHERE session_id = $1")
            .bind(session_id)
            .fetch_optional(pool)
            .await?,
    )
}

pub async fn sessions_of_org(pool: &Pool<DB>, org_id: &str) -> StoreResult<Vec<SessionRow>> {
    Ok(sqlx::query_as::<_, SessionRow>(
        "SELECT * FROM sessions WHERE org_id = $1 ORDER BY session_id",
    )
    .bind(org_id)
    .fetch_all(pool)
    .await?)
}

/// Used seconds in each of `windows` (at most two), read in one statement so that one
/// snapshot gives every figure.
pub async fn window_usage(
    pool: &Pool<DB>,
    org_id: &str,
    windows: &[Interval],
    now: Secs,
    rules: &Rules,
) -> StoreResult<Vec<i64>> {
    assert!(windows.len() <= 2, "window_usage reads at most two windows");
    let full: Vec<(Secs, Secs)> = windows.iter().map(|w| crate::usage::full_hours(*w)).collect();
    let full_of = |i: usize| full.get(i).copied().unwrap_or((0, 0));
    let edges: Vec<Interval> = windows
        .iter()
        .flat_map(|w| crate::usage::partial_hours(*w))
        .collect();
    let edge_of = |i: usize| edges.get(i).map_or((0, 0), |e| (e.start, e.end));
    let hull_start = full.iter().map(|f| f.0).min().unwrap_or(0);
    let hull_end = full.iter().map(|f| f.1).max().unwrap_or(0);

    let rows: Vec<(i64, i64, i64)> = sqlx::query_as(
        "SELECT CAST(0 AS BIGINT), \
           CAST(COALESCE(SUM(CASE WHEN hour >= $2 AND hour < $3 THEN seconds END), 0) AS BIGINT), \
           CAST(COALESCE(SUM(CASE WHEN hour >= $4 AND hour < $5 THEN seconds END), 0) AS BIGINT) \
         FROM org_hourly WHERE org_id = $1 AND hour >= $6 AND hour < $7 \
         UNION ALL \
         SELECT CAST(1 AS BIGINT), start_at, end_at FROM spans \
         WHERE org_id = $1 AND kind = 'running' AND ( \
           (end_at > $8 AND start_at < $9) OR (end_at > $10 AND start_at < $11) OR \
           (end_at > $12 AND start_at < $13) OR (end_at > $14 AND start_at < $15)) \
         UNION ALL \
         SELECT CAST(2 AS BIGINT), span_start, last_at FROM sessions \
         WHERE org_id = $1 AND phase = 'running'",
    )
    .bind(org_id)
    .bind(full_of(0).0)
    .bind(full_of(0).1)
    .bind(full_of(1).0)
    .bind(full_of(1).1)
    .bind(hull_start)
    .bind(hull_end)
    .bind(edge_of(0).0)
    .bind(edge_of(0).1)
    .bind(edge_of(1).0)
    .bind(edge_of(1).1)
    .bind(edge_of(2).0)
    .bind(edge_of(2).1)
    .bind(edge_of(3).0)
    .bind(edge_of(3).1)
    .fetch_all(pool)
    .await?;

    let mut totals = crate::usage::LedgerSlice::default();
    for (kind, a, b) in rows {
        match kind {
            0 => totals.full_hours = vec![a, b],
            1 => totals.closed_spans.extend(Interval::new(a, b)),
            _ => totals.running.push(SessionLedger {
                phase: ledger::Phase::Running,
                span_start: a,
                last_at: b,
                ..SessionLedger::admitted(a)
            }),
        }
    }
    Ok(windows
        .iter()
        .enumerate()
        .map(|(i, w)| totals.used(i, *w, now, rules))
        .collect())
}

pub async fn session_counts(pool: &Pool<DB>, org_id: &str) -> StoreResult<SessionCounts> {
    let (running, parked): (i64, i64) = sqlx::query_as(
        "SELECT \
           CAST(COALESCE(SUM(CASE WHEN phase = 'running' THEN 1 ELSE 0 END), 0) AS BIGINT), \
           CAST(COALESCE(SUM(CASE WHEN phase = 'parked' THEN 1 ELSE 0 END), 0) AS BIGINT) \
         FROM sessions WHERE org_id = $1 AND phase IN ('running', 'parked')",
    )
    .bind(org_id)
    .fetch_one(pool)
    .await?;
    Ok(SessionCounts { running, parked })
}

/// `(session_id, start, end)` of every booked running stretch: closed spans, and the
/// booked part of each open one.
pub async fn running_spans(pool: &Pool<DB>, org_id: &str) -> StoreResult<Vec<(String, Secs, Secs)>> {
    Ok(sqlx::query_as(
        "SELECT session_id, start_at, end_at FROM spans WHERE org_id = $1 AND kind = 'running' \
         UNION ALL \
         SELECT session_id, span_start, last_at FROM sessions \
         WHERE org_id = $1 AND phase = 'running' AND last_at > span_start \
         ORDER BY 1, 2",
    )
    .bind(org_id)
    .fetch_all(pool)
    .await?)
}

pub async fn hourly_totals(pool: &Pool<DB>, org_id: &str) -> StoreResult<Vec<(Secs, i64)>> {
    Ok(
        sqlx::query_as("SELECT hour, seconds FROM org_hourly WHERE org_id = $1 ORDER BY hour")
            .bind(org_id)
            .fetch_all(pool)
            .await?,
    )
}

pub async fn session_hourly_totals(
    pool: &Pool<DB>,
    org_id: &str,
) -> StoreResult<Vec<(String, i64)>> {
    Ok(sqlx::query_as(
        "SELECT session_id, CAST(SUM(seconds) AS BIGINT) FROM session_hourly \
         WHERE org_id = $1 GROUP BY session_id ORDER BY session_id",
    )
    .bind(org_id)
    .fetch_all(pool)
    .await?)
}

/// Row counts and sums of every table: equal digests mean no write happened between them.
pub async fn digest(pool: &Pool<DB>) -> StoreResult<Vec<(String, i64, i64)>> {
    Ok(sqlx::query_as(
        "SELECT 'orgs', COUNT(*), CAST(COALESCE(SUM(updated_at), 0) AS BIGINT) FROM orgs \
         UNION ALL SELECT 'api_keys', COUNT(*), CAST(COALESCE(SUM(updated_at + COALESCE(concurrency_limit, 0)), 0) AS BIGINT) FROM api_keys \
         UNION ALL SELECT 'tokens', COUNT(*), CAST(COALESCE(SUM(created_at), 0) AS BIGINT) FROM tokens \
         UNION ALL SELECT 'sessions', COUNT(*), CAST(COALESCE(SUM(billed_seconds + heartbeats + last_at + COALESCE(last_seq, 0)), 0) AS BIGINT) FROM sessions \
         UNION ALL SELECT 'spans', COUNT(*), CAST(COALESCE(SUM(end_at - start_at), 0) AS BIGINT) FROM spans \
         UNION ALL SELECT 'org_hourly', COUNT(*), CAST(COALESCE(SUM(seconds), 0) AS BIGINT) FROM org_hourly \
         UNION ALL SELECT 'session_hourly', COUNT(*), CAST(COALESCE(SUM(seconds), 0) AS BIGINT) FROM session_hourly",
    )
    .fetch_all(pool)
    .await?)
}
