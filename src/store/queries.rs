// The SQL of rush-meter, written once and compiled per backend: this file is
// `include!`d by `store::pg` and `store::sqlite`, each defining `DB`, `BEGIN_WRITE`,
// `SKIP_LOCKED`, `LEAST` and `GREATEST` first.

use std::collections::{BTreeMap, HashMap};

use sqlx::{Pool, Transaction};

use super::{
    AdmissionRequest, AdmitReject, DecisionRow, WindowTotals, HeartbeatOutcome, IngestReject, KeyRow, OrgRow, OrgUpsert, SessionCounts, SessionRow,
    StoreResult, TokenRow,
};
use crate::ingest::Heartbeat;
use crate::ledger::{self, Effects, EndStatus, Rules, Secs, VmState};

type Tx = Transaction<'static, DB>;

/// Rows a multi-row statement carries at most (SQLite allows 32,766 bound values).
const CHUNK: usize = 500;

async fn begin_write(pool: &Pool<DB>) -> StoreResult<Tx> {
    Ok(pool.begin_with(BEGIN_WRITE).await?)
}

/// The claim of a work queue (Stripe events, notifications): take up to `limit` rows of
/// `table` that are pending and due by `due_col`, oldest first by `order`, count an
/// attempt and hold them `hold` seconds, so an instance that dies mid-work leaves them to
/// the others; rows another instance holds are skipped. Rows come back unordered.
#[allow(clippy::too_many_arguments)]
async fn claim_due<R>(
    pool: &Pool<DB>,
    table: &str,
    key: &str,
    due_col: &str,
    order: &str,
    now: Secs,
    hold: Secs,
    limit: i64,
) -> StoreResult<Vec<R>>
where
    R: for<'r> sqlx::FromRow<'r, <DB as sqlx::Database>::Row> + Send + Unpin,
{
    let mut tx = begin_write(pool).await?;
    let rows = sqlx::query_as::<_, R>(&format!(
        "UPDATE {table} SET attempts = attempts + 1, {due_col} = $1 + $2 \
         WHERE {key} IN (SELECT {key} FROM {table} \
           WHERE state = 'pending' AND {due_col} <= $1 \
           ORDER BY {order} LIMIT $3{SKIP_LOCKED}) \
         RETURNING *"
    ))
    .bind(now)
    .bind(hold)
    .bind(limit)
    .fetch_all(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(rows)
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

pub async fn get_orgs(pool: &Pool<DB>, org_ids: &[&str]) -> StoreResult<Vec<OrgRow>> {
    let mut rows = Vec::with_capacity(org_ids.len());
    for chunk in org_ids.chunks(CHUNK) {
        rows.extend(select_orgs(pool, chunk).await?);
    }
    Ok(rows)
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
    /// Which `org_hourly` rows this writer adds to (see `org_hourly` in the migrations).
    shard: i64,
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
        let org_hours: Vec<_> = self.org_hours.into_iter().collect();
        let session_hours: Vec<_> = self.session_hours.into_iter().collect();
        write_booking(tx, self.shard, &sessions, &org_hours, &session_hours, &self.spans).await
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
     unadmitted, created_at, ended_at, end_status, heard_at";

/// Overwrites every column of a locked session row with the new state.
const SESSION_UPSERT: &str = " ON CONFLICT (session_id) DO UPDATE SET \
     key_id = excluded.key_id, agent = excluded.agent, project_id = excluded.project_id, \
     started_by = excluded.started_by, vm_id = excluded.vm_id, phase = excluded.phase, \
     last_seq = excluded.last_seq, last_at = excluded.last_at, \
     span_start = excluded.span_start, billed_seconds = excluded.billed_seconds, \
     heartbeats = excluded.heartbeats, silences = excluded.silences, \
     unadmitted = excluded.unadmitted, ended_at = excluded.ended_at, \
     end_status = excluded.end_status, heard_at = excluded.heard_at";

const ORG_HOURS_CONFLICT: &str = " ON CONFLICT (org_id, hour, shard) DO UPDATE \
     SET seconds = org_hourly.seconds + excluded.seconds";

const SESSION_HOURS_CONFLICT: &str = " ON CONFLICT (org_id, hour, session_id) DO UPDATE \
     SET seconds = session_hourly.seconds + excluded.seconds";

/// Lock and read the sessions with these ids, in id order.
async fn lock_sessions(tx: &mut Tx, ids: &[&str]) -> StoreResult<Vec<SessionRow>> {
    let mut rows = Vec::with_capacity(ids.len());
    for chunk in ids.chunks(CHUNK) {
        rows.extend(select_sessions_for_update(tx, chunk).await?);
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
    shard: i64,
) -> StoreResult<Vec<RequestResult>> {
    retry_group("sessions kept changing owner during ingest", || {
        ingest_once(pool, requests, rules, shard)
    })
    .await
}

/// Run a group's transaction until it completes: again when it saw a row appear that it
/// could not lock (`Ok(None)`), and on a serialization failure or deadlock; 6 tries.
async fn retry_group<T, F, Fut>(what: &str, mut once: F) -> StoreResult<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = StoreResult<Option<T>>>,
{
    let mut attempt = 0;
    loop {
        match once().await {
            Ok(Some(done)) => return Ok(done),
            Ok(None) if attempt < 5 => {}
            Err(e) if e.is_retryable() && attempt < 5 => {}
            Ok(None) => return Err(super::StoreError::Conflict(what.to_owned())),
            Err(e) => return Err(e),
        }
        attempt += 1;
    }
}

async fn ingest_once(
    pool: &Pool<DB>,
    requests: &[Vec<Heartbeat>],
    rules: &Rules,
    shard: i64,
) -> StoreResult<Option<Vec<RequestResult>>> {
    let mut tx = begin_write(pool).await?;

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

    // An org that owns a session exists (orgs are never deleted); ask only about the rest.
    let owners: std::collections::HashSet<&str> = rows.values().map(|r| r.org_id.as_str()).collect();
    let mut known_orgs: Vec<String> = owners.iter().map(|o| o.to_string()).collect();
    let mut unproven: Vec<&str> = requests
        .iter()
        .flatten()
        .map(|h| h.org_id.as_str())
        .filter(|o| !owners.contains(o))
        .collect();
    unproven.sort_unstable();
    unproven.dedup();
    if !unproven.is_empty() {
        known_orgs.extend(existing_orgs(&mut tx, &unproven).await?);
    }
    known_orgs.sort_unstable();
    known_orgs.dedup();

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
    // A new session starts at its earliest heartbeat, whatever the order they came in.
    for h in requests.iter().zip(&verdicts).filter(|(_, v)| v.is_ok()).flat_map(|(r, _)| r) {
        if let Some(row) = created.get_mut(h.session_id.as_str()) {
            if h.obs.at < row.last_at {
                *row = SessionRow::unadmitted(row.org_id.as_str(), row.session_id.as_str(), h.vm_id.as_str(), h.obs.at);
            }
        }
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
    let mut booking = Booking {
        shard,
        ..Booking::default()
    };
    for (r, i) in order {
        let h = &requests[r][i];
        let row = rows
            .get_mut(h.session_id.as_str())
            .expect("every accepted session was read or created");
        let (led, fx) = ledger::apply_heartbeat(&row.ledger(), &h.obs, rules);
        if !fx.ignored {
            row.set_ledger(&led);
            row.vm_id = Some(h.vm_id.to_string());
            row.heard_at = row.heard_at.max(Some(h.received_at));
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
        found.extend(select_org_ids(tx, chunk).await?);
    }
    found.sort_unstable();
    Ok(found)
}

/// Insert sessions first seen now; false if another writer inserted any of them first.
async fn insert_new_sessions(tx: &mut Tx, rows: &[SessionRow]) -> StoreResult<bool> {
    let mut inserted = 0;
    for chunk in rows.chunks(CHUNK) {
        inserted += insert_new_session_rows(tx, chunk).await?;
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
            "SELECT * FROM sessions WHERE phase IN ('parked', 'admitted', 'silent') AND span_start <= $1 \
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

/// `GREATEST(0, LEAST(hi, $b) - GREATEST(lo, $a))`: seconds of `[lo, hi)` inside `[$a, $b)`.
fn overlap(lo: &str, hi: &str, a: usize, b: usize) -> String {
    format!("{GREATEST}(0, {LEAST}({hi}, ${b}) - {GREATEST}({lo}, ${a}))")
}

/// Seconds used in the month and week windows by each of `org_ids` (which share those
/// windows), in one statement so that one snapshot gives every figure: whole hours from
/// the hourly rollup, part hours at the windows' edges from the spans and open stretches,
/// and each running session counted up to `now` (`SessionLedger::provisional`).
pub async fn window_usage(
    pool: &Pool<DB>,
    org_ids: &[&str],
    windows: &crate::quota::Windows,
    now: Secs,
    rules: &Rules,
) -> StoreResult<HashMap<String, WindowTotals>> {
    let mut conn = pool.acquire().await?;
    window_usage_on(&mut conn, org_ids, windows, now, rules).await
}

async fn window_usage_on(
    conn: &mut <DB as sqlx::Database>::Connection,
    org_ids: &[&str],
    windows: &crate::quota::Windows,
    now: Secs,
    rules: &Rules,
) -> StoreResult<HashMap<String, WindowTotals>> {
    use crate::usage::{full_hours, partial_hours};
    let mut out: HashMap<String, WindowTotals> = HashMap::new();
    let ws = [windows.month, windows.week];
    let full = ws.map(full_hours);
    let edges = ws.map(|w| {
        let mut e = partial_hours(w).into_iter().map(|i| (i.start, i.end));
        [e.next().unwrap_or((0, 0)), e.next().unwrap_or((0, 0))]
    });
    let (lo, hi) = (full[0].0.min(full[1].0), full[0].1.max(full[1].1));
    // Parameters: $1..$4 full-hour bounds, $5 $6 hull, $7..$14 edges, $15..$18 windows,
    // $19 now, $20 interval, $21 lease; org ids follow.
    let sum_edges = |lo_col: &str, hi_col: &str, w: usize| {
        let base = 7 + 4 * w;
        format!(
            "{} + {}",
            overlap(lo_col, hi_col, base, base + 1),
            overlap(lo_col, hi_col, base + 2, base + 3)
        )
    };
    let provisional = |w: usize| {
        overlap(
            "last_at",
            &format!("{LEAST}($19, last_at + $20)"),
            15 + 2 * w,
            16 + 2 * w,
        )
    };
    for chunk in org_ids.chunks(CHUNK) {
        let list: Vec<String> = (0..chunk.len()).map(|i| format!("${}", 22 + i)).collect();
        let list = list.join(", ");
        let sql = format!(
            "SELECT org_id, \
               CAST(COALESCE(SUM(CASE WHEN hour >= $1 AND hour < $2 THEN seconds ELSE 0 END), 0) AS BIGINT), \
               CAST(COALESCE(SUM(CASE WHEN hour >= $3 AND hour < $4 THEN seconds ELSE 0 END), 0) AS BIGINT), \
               CAST(0 AS BIGINT) \
             FROM org_hourly WHERE org_id IN ({list}) AND hour >= $5 AND hour < $6 GROUP BY org_id \
             UNION ALL \
             SELECT org_id, CAST(SUM({se0}) AS BIGINT), CAST(SUM({se1}) AS BIGINT), CAST(0 AS BIGINT) FROM spans \
             WHERE org_id IN ({list}) AND kind = 'running' AND ( \
               (end_at > $7 AND start_at < $8) OR (end_at > $9 AND start_at < $10) OR \
               (end_at > $11 AND start_at < $12) OR (end_at > $13 AND start_at < $14)) \
             GROUP BY org_id \
             UNION ALL \
             SELECT org_id, CAST(SUM({oe0} + {p0}) AS BIGINT), CAST(SUM({oe1} + {p1}) AS BIGINT), \
               CAST(SUM(CASE WHEN COALESCE(heard_at, last_at) >= $19 - $21 THEN 1 ELSE 0 END) AS BIGINT) \
             FROM sessions WHERE org_id IN ({list}) AND phase = 'running' GROUP BY org_id",
            se0 = sum_edges("start_at", "end_at", 0),
            se1 = sum_edges("start_at", "end_at", 1),
            oe0 = sum_edges("span_start", "last_at", 0),
            oe1 = sum_edges("span_start", "last_at", 1),
            p0 = provisional(0),
            p1 = provisional(1),
        );
        let mut q = sqlx::query_as::<_, (String, i64, i64, i64)>(&sql)
            .bind(full[0].0)
            .bind(full[0].1)
            .bind(full[1].0)
            .bind(full[1].1)
            .bind(lo)
            .bind(hi);
        for e in edges.iter().flatten() {
            q = q.bind(e.0).bind(e.1);
        }
        for w in ws {
            q = q.bind(w.start).bind(w.end);
        }
        q = q.bind(now).bind(rules.interval).bind(rules.lease);
        for id in chunk {
            q = q.bind(*id);
        }
        for (org, m, w, n) in q.fetch_all(&mut *conn).await? {
            let e = out.entry(org).or_default();
            e.month += m;
            e.week += w;
            e.running += n;
        }
    }
    Ok(out)
}

/// Running sessions heard from within the lease, and parked ones.
pub async fn session_counts(
    pool: &Pool<DB>,
    org_id: &str,
    now: Secs,
    rules: &Rules,
) -> StoreResult<SessionCounts> {
    let (running, parked): (i64, i64) = sqlx::query_as(
        "SELECT \
           CAST(COALESCE(SUM(CASE WHEN phase = 'running' AND COALESCE(heard_at, last_at) >= $2 THEN 1 ELSE 0 END), 0) AS BIGINT), \
           CAST(COALESCE(SUM(CASE WHEN phase = 'parked' THEN 1 ELSE 0 END), 0) AS BIGINT) \
         FROM sessions WHERE org_id = $1 AND phase IN ('running', 'parked')",
    )
    .bind(org_id)
    .bind(now - rules.lease)
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
        sqlx::query_as("SELECT hour, CAST(SUM(seconds) AS BIGINT) FROM org_hourly WHERE org_id = $1 \
             GROUP BY hour ORDER BY hour")
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
         UNION ALL SELECT 'sessions', COUNT(*), CAST(COALESCE(SUM(billed_seconds + heartbeats + last_at + COALESCE(last_seq, 0) + COALESCE(slot_at, 0)), 0) AS BIGINT) FROM sessions \
         UNION ALL SELECT 'spans', COUNT(*), CAST(COALESCE(SUM(end_at - start_at), 0) AS BIGINT) FROM spans \
         UNION ALL SELECT 'org_hourly', COUNT(*), CAST(COALESCE(SUM(seconds), 0) AS BIGINT) FROM org_hourly \
         UNION ALL SELECT 'session_hourly', COUNT(*), CAST(COALESCE(SUM(seconds), 0) AS BIGINT) FROM session_hourly \
         UNION ALL SELECT 'decisions', COUNT(*), CAST(COALESCE(SUM(running), 0) AS BIGINT) FROM decisions \
         UNION ALL SELECT 'periods', COUNT(*), CAST(COALESCE(SUM(agent_seconds + adjustment_seconds), 0) AS BIGINT) FROM periods \
         UNION ALL SELECT 'period_orgs', COUNT(*), CAST(COALESCE(SUM(agent_seconds), 0) AS BIGINT) FROM period_orgs \
         UNION ALL SELECT 'period_sessions', COUNT(*), CAST(COALESCE(SUM(running_seconds + parked_seconds), 0) AS BIGINT) FROM period_sessions \
         UNION ALL SELECT 'notifications', COUNT(*), CAST(COALESCE(SUM(attempts), 0) AS BIGINT) FROM notifications",
    )
    .fetch_all(pool)
    .await?)
}

// ----- the gate: see admissions.rs -----

// ----- the console's breakdown -----

/// An org's booked time in the whole hours `[from, to)`, from the per-session hourly
/// rollup, summed by the database under `by`'s key: each piece carries that key (an hour,
/// a day's start, a session, or the session's project, user or agent) and dummies for the
/// rest, so `breakdown::group` merges them with running sessions' pieces as they are.
pub async fn session_hour_pieces(
    pool: &Pool<DB>,
    org_id: &str,
    from: Secs,
    to: Secs,
    by: crate::breakdown::GroupBy,
) -> StoreResult<Vec<crate::breakdown::Piece>> {
    use crate::breakdown::GroupBy;
    // By time, the org's own hourly rollup (written in the same transaction, so equal)
    // has a row an hour, not a row a session-hour.
    let time = |key: &str| {
        format!(
            "SELECT {key} AS hour, '' AS session_id, NULL AS project_id, NULL AS started_by, \
               NULL AS agent, CAST(SUM(seconds) AS BIGINT) AS seconds FROM org_hourly \
             WHERE org_id = $1 AND hour >= $2 AND hour < $3 GROUP BY {key}"
        )
    };
    // By session, project, user or agent: the per-session rollup, joined for the names.
    let by_session = |select: &str, join: &str, key: &str| {
        format!(
            "SELECT {select}, CAST(SUM(h.seconds) AS BIGINT) AS seconds FROM session_hourly h{join} \
             WHERE h.org_id = $1 AND h.hour >= $2 AND h.hour < $3 GROUP BY {key}"
        )
    };
    let sql = match by {
        GroupBy::Hour => time("hour"),
        GroupBy::Day => time("(hour / 86400) * 86400"),
        GroupBy::Session => by_session("CAST(0 AS BIGINT) AS hour, h.session_id, NULL AS project_id, NULL AS started_by, NULL AS agent", "", "h.session_id"),
        GroupBy::Project => by_session("CAST(0 AS BIGINT) AS hour, '' AS session_id, s.project_id, NULL AS started_by, NULL AS agent", SESSION_JOIN, "s.project_id"),
        GroupBy::User => by_session("CAST(0 AS BIGINT) AS hour, '' AS session_id, NULL AS project_id, s.started_by, NULL AS agent", SESSION_JOIN, "s.started_by"),
        GroupBy::Agent => by_session("CAST(0 AS BIGINT) AS hour, '' AS session_id, NULL AS project_id, NULL AS started_by, s.agent", SESSION_JOIN, "s.agent"),
    };
    Ok(sqlx::query_as::<_, crate::breakdown::Piece>(&sql)
        .bind(org_id)
        .bind(from)
        .bind(to)
        .fetch_all(pool)
        .await?)
}

const SESSION_JOIN: &str =
    " JOIN sessions s ON s.org_id = h.org_id AND s.session_id = h.session_id";

/// An org's running sessions.
pub async fn running_sessions(pool: &Pool<DB>, org_id: &str) -> StoreResult<Vec<SessionRow>> {
    Ok(sqlx::query_as::<_, SessionRow>(
        "SELECT * FROM sessions WHERE org_id = $1 AND phase = 'running'",
    )
    .bind(org_id)
    .fetch_all(pool)
    .await?)
}

/// A session's closed spans `(start, end, kind)`, in order.
pub async fn session_spans(
    pool: &Pool<DB>,
    org_id: &str,
    session_id: &str,
) -> StoreResult<Vec<(Secs, Secs, String)>> {
    Ok(sqlx::query_as(
        "SELECT start_at, end_at, kind FROM spans WHERE org_id = $1 AND session_id = $2 \
         ORDER BY start_at",
    )
    .bind(org_id)
    .bind(session_id)
    .fetch_all(pool)
    .await?)
}

/// An org's sessions created in `[from, to)`, in `phase` if given, oldest first, after the
/// `(created_at, session_id)` cursor, at most `limit`.
pub async fn list_sessions(
    pool: &Pool<DB>,
    org_id: &str,
    phase: Option<&str>,
    from: Secs,
    to: Secs,
    after: Option<(Secs, String)>,
    limit: i64,
) -> StoreResult<Vec<SessionRow>> {
    let (after_at, after_id) = after.unwrap_or((i64::MIN, String::new()));
    Ok(sqlx::query_as::<_, SessionRow>(
        "SELECT * FROM sessions WHERE org_id = $1 AND ($2 IS NULL OR phase = $2) \
           AND created_at >= $3 AND created_at < $4 \
           AND (created_at > $5 OR (created_at = $5 AND session_id > $6)) \
         ORDER BY created_at, session_id LIMIT $7",
    )
    .bind(org_id)
    .bind(phase)
    .bind(from)
    .bind(to)
    .bind(after_at)
    .bind(after_id)
    .bind(limit)
    .fetch_all(pool)
    .await?)
}
