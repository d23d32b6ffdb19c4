//! Closed periods and the finance export (`PeriodStore`), written once for both dialects.
//!
//! A session's line for a period: its booked running seconds from the per-session hourly
//! rollup, its closed spans clipped to the period, and the stretch it is in up to its last
//! heartbeat. For the first open period after a closed one, its adjustment: what the
//! rollup now holds for the closed period less what was frozen (app/periods.rs).

use super::*;

/// Rows sent down the channel at a time.
const LINE_BATCH: usize = 1024;

/// The stretch a session is in, clipped to the period `[$1, $2)`, is not empty.
fn open_stretch() -> String {
    format!(
        "(s.phase IN ('running', 'parked') AND {LEAST}(s.last_at, $2) > {GREATEST}(s.span_start, $1))"
    )
}

/// The live lines of `[$1, $2)`, with adjustments against the closed period `[$3, $4)`.
pub(crate) fn live_lines_sql() -> String {
    let open = open_stretch();
    format!(
        "SELECT s.org_id, s.session_id, s.project_id, s.started_by, s.agent, \
           COALESCE(r.secs, 0) AS running_seconds, \
           COALESCE(k.parked, 0) + CASE WHEN s.phase = 'parked' AND {open} \
             THEN {LEAST}(s.last_at, $2) - {GREATEST}(s.span_start, $1) ELSE 0 END AS parked_seconds, \
           COALESCE(k.n, 0) + CASE WHEN {open} THEN 1 ELSE 0 END AS spans, \
           COALESCE(k.first_start, CASE WHEN {open} THEN {GREATEST}(s.span_start, $1) END) AS first_start, \
           CASE WHEN {open} THEN {LEAST}(s.last_at, $2) ELSE k.last_end END AS last_end, \
           CASE WHEN s.ended_at <= $2 THEN s.end_status END AS end_status, \
           COALESCE(a.secs, 0) - COALESCE(f.running_seconds, 0) AS adjustment_seconds \
         FROM sessions s \
         LEFT JOIN (SELECT org_id, session_id, CAST(SUM(seconds) AS BIGINT) AS secs FROM session_hourly \
             WHERE hour >= $1 AND hour < $2 GROUP BY org_id, session_id) r \
           ON r.org_id = s.org_id AND r.session_id = s.session_id \
         LEFT JOIN (SELECT org_id, session_id, COUNT(*) AS n, \
               CAST(SUM(CASE WHEN kind = 'parked' THEN {LEAST}(end_at, $2) - {GREATEST}(start_at, $1) ELSE 0 END) AS BIGINT) AS parked, \
               MIN({GREATEST}(start_at, $1)) AS first_start, MAX({LEAST}(end_at, $2)) AS last_end \
             FROM spans WHERE start_at < $2 AND end_at > $1 GROUP BY org_id, session_id) k \
           ON k.org_id = s.org_id AND k.session_id = s.session_id \
         LEFT JOIN (SELECT org_id, session_id, CAST(SUM(seconds) AS BIGINT) AS secs FROM session_hourly \
             WHERE hour >= $3 AND hour < $4 GROUP BY org_id, session_id) a \
           ON a.org_id = s.org_id AND a.session_id = s.session_id \
         LEFT JOIN period_sessions f \
           ON f.period_start = $3 AND f.org_id = s.org_id AND f.session_id = s.session_id \
         WHERE (s.created_at >= $1 AND s.created_at < $2) OR r.secs IS NOT NULL OR k.n IS NOT NULL \
           OR {open} OR COALESCE(a.secs, 0) <> COALESCE(f.running_seconds, 0)"
    )
}

const FROZEN_LINES_COLUMNS: &str = "org_id, session_id, project_id, started_by, agent, \
       running_seconds, parked_seconds, spans, first_start, last_end, end_status, adjustment_seconds";

/// Who paid for each org's seconds in the whole hours of `period`, from the hourly funding
/// rollup (grant seconds by the grant's kind).
async fn funding_sums_on(
    conn: &mut <DB as sqlx::Database>::Connection,
    period: Interval,
) -> StoreResult<HashMap<String, PeriodFunding>> {
    let rows: Vec<(String, String, Option<String>, i64, i64)> = sqlx::query_as(
        "SELECT h.org_id, h.source, g.kind, CAST(SUM(h.seconds) AS BIGINT), \
           CAST(SUM(h.charge_units) AS BIGINT) \
         FROM funding_hourly h LEFT JOIN grants g ON g.org_id = h.org_id AND g.grant_id = h.grant_id \
         WHERE h.hour >= $1 AND h.hour < $2 GROUP BY h.org_id, h.source, g.kind",
    )
    .bind(period.start)
    .bind(period.end)
    .fetch_all(&mut *conn)
    .await?;
    let mut out: HashMap<String, PeriodFunding> = HashMap::new();
    for (org, source, kind, seconds, units) in rows {
        let source = Source::parse(&source).ok_or_else(|| {
            StoreError::Other(decode_error("funding_hourly.source", format!("`{source}`")))
        })?;
        let kind = kind.as_deref().and_then(GrantKind::parse);
        out.entry(org)
            .or_default()
            .add(source, kind, seconds, units);
    }
    Ok(out)
}

/// Each org's funding of `q.period`, and of its adjustment: what the rollup now holds for
/// the closed period it adjusts against, less what was frozen then.
async fn period_funding_on(
    conn: &mut <DB as sqlx::Database>::Connection,
    q: &LineQuery,
) -> StoreResult<HashMap<String, (PeriodFunding, PeriodFunding)>> {
    let mut out: HashMap<String, (PeriodFunding, PeriodFunding)> = funding_sums_on(conn, q.period)
        .await?
        .into_iter()
        .map(|(org, f)| (org, (f, PeriodFunding::default())))
        .collect();
    if let Some(last) = q.adjusts {
        let now = funding_sums_on(conn, last).await?;
        let frozen: Vec<FrozenOrgRow> =
            sqlx::query_as::<_, FrozenOrgRow>("SELECT * FROM period_orgs WHERE period_start = $1")
                .bind(last.start)
                .fetch_all(&mut *conn)
                .await?;
        let frozen: HashMap<&str, PeriodFunding> = frozen
            .iter()
            .map(|r| (r.org_id.as_str(), r.funding()))
            .collect();
        for (org, f) in &now {
            let before = frozen.get(org.as_str()).copied().unwrap_or_default();
            let adjustment = f.minus(&before);
            if adjustment != PeriodFunding::default() {
                out.entry(org.clone()).or_default().1 = adjustment;
            }
        }
    }
    Ok(out)
}

/// The closed period a live query adjusts against, as `($3, $4)` (empty when none).
fn adjusting(q: &LineQuery) -> (Secs, Secs) {
    q.adjusts.map_or((0, 0), |l| (l.start, l.end))
}

/// The frozen lines of the period starting at `start` (a parameter, or an integer for
/// COPY, which takes none), in the export's order: org, then session, in byte order.
pub(crate) fn frozen_lines_sql(start: &str) -> String {
    format!(
        "SELECT {FROZEN_LINES_COLUMNS} FROM period_sessions WHERE period_start = {start} \
         ORDER BY org_id{BYTE_ORDER}, session_id{BYTE_ORDER}"
    )
}

/// Lines gathered into batches of `LINE_BATCH` for the export's channel.
pub(crate) struct LineBatches<'a> {
    tx: &'a mpsc::Sender<Vec<SessionLine>>,
    batch: Vec<SessionLine>,
}

impl<'a> LineBatches<'a> {
    pub(crate) fn new(tx: &'a mpsc::Sender<Vec<SessionLine>>) -> Self {
        LineBatches {
            tx,
            batch: Vec::with_capacity(LINE_BATCH),
        }
    }

    /// Add `line`; false once the receiver is gone (the export's reader hung up).
    pub(crate) async fn push(&mut self, line: SessionLine) -> bool {
        self.batch.push(line);
        if self.batch.len() < LINE_BATCH {
            return true;
        }
        let full = std::mem::replace(&mut self.batch, Vec::with_capacity(LINE_BATCH));
        self.tx.send(full).await.is_ok()
    }

    /// Send the last, partial batch.
    pub(crate) async fn finish(self) {
        if !self.batch.is_empty() {
            let _ = self.tx.send(self.batch).await;
        }
    }
}

/// Send `rows` down `tx` in batches; stop early, without error, when the receiver is gone.
pub(crate) async fn send_lines(
    mut rows: futures_util::stream::BoxStream<'_, Result<Rec<SessionLine>, sqlx::Error>>,
    tx: &mpsc::Sender<Vec<SessionLine>>,
) -> StoreResult<()> {
    use futures_util::TryStreamExt;
    let mut out = LineBatches::new(tx);
    while let Some(Rec(line)) = rows.try_next().await? {
        if !out.push(line).await {
            return Ok(());
        }
    }
    out.finish().await;
    Ok(())
}

#[async_trait]
impl PeriodStore for D {
    async fn send_session_lines(
        &self,
        q: &LineQuery,
        tx: &mpsc::Sender<Vec<SessionLine>>,
    ) -> StoreResult<()> {
        if q.closed {
            return self.send_frozen_lines(q.period.start, tx).await;
        }
        let sql = format!(
            "{} ORDER BY s.org_id{BYTE_ORDER}, s.session_id{BYTE_ORDER}",
            live_lines_sql()
        );
        let (ls, le) = adjusting(q);
        let rows = sqlx::query_as::<_, Rec<SessionLine>>(&sql)
            .bind(q.period.start)
            .bind(q.period.end)
            .bind(ls)
            .bind(le)
            .fetch(self.read());
        send_lines(rows, tx).await
    }

    async fn count_session_lines(&self, q: &LineQuery) -> StoreResult<i64> {
        if q.closed {
            return Ok(sqlx::query_scalar(
                "SELECT COUNT(*) FROM period_sessions WHERE period_start = $1",
            )
            .bind(q.period.start)
            .fetch_one(self.read())
            .await?);
        }
        let (ls, le) = adjusting(q);
        Ok(
            sqlx::query_scalar(&format!("SELECT COUNT(*) FROM ({}) x", live_lines_sql()))
                .bind(q.period.start)
                .bind(q.period.end)
                .bind(ls)
                .bind(le)
                .fetch_one(self.read())
                .await?,
        )
    }

    async fn live_org_sums(&self, q: &LineQuery) -> StoreResult<Vec<(String, i64, i64)>> {
        let (ls, le) = adjusting(q);
        Ok(sqlx::query_as(&format!(
            "SELECT org_id, CAST(SUM(running_seconds) AS BIGINT), CAST(SUM(adjustment_seconds) AS BIGINT) \
             FROM ({}) x GROUP BY org_id",
            live_lines_sql()
        ))
        .bind(q.period.start)
        .bind(q.period.end)
        .bind(ls)
        .bind(le)
        .fetch_all(self.read())
        .await?)
    }

    async fn period_funding(
        &self,
        q: &LineQuery,
    ) -> StoreResult<HashMap<String, (PeriodFunding, PeriodFunding)>> {
        let mut conn = self.read().acquire().await?;
        period_funding_on(&mut conn, q).await
    }

    async fn frozen_orgs(&self, period_start: Secs) -> StoreResult<Vec<FrozenOrgRow>> {
        Ok(sqlx::query_as::<_, FrozenOrgRow>(&format!(
            "SELECT * FROM period_orgs WHERE period_start = $1 ORDER BY org_id{BYTE_ORDER}"
        ))
        .bind(period_start)
        .fetch_all(self.read())
        .await?)
    }

    async fn get_period(&self, period_start: Secs) -> StoreResult<Option<PeriodRow>> {
        Ok(
            sqlx::query_as::<_, PeriodRow>("SELECT * FROM periods WHERE period_start = $1")
                .bind(period_start)
                .fetch_optional(self.read())
                .await?,
        )
    }

    async fn list_periods(&self) -> StoreResult<Vec<PeriodRow>> {
        Ok(
            sqlx::query_as::<_, PeriodRow>("SELECT * FROM periods ORDER BY period_start DESC")
                .fetch_all(self.read())
                .await?,
        )
    }

    async fn close_period(
        &self,
        q: &LineQuery,
        now: Secs,
        terms: TermsOf<'_>,
        actor: &Actor,
    ) -> StoreResult<Option<PeriodRow>> {
        let mut tx = begin_write(self.write()).await?;
        // Taken first: a second closer waits here on PostgreSQL, then finds it done.
        let claimed = sqlx::query(
            "INSERT INTO periods (period_start, period_end, closed_at, orgs, sessions, agent_seconds, \
               adjustment_seconds) VALUES ($1, $2, $3, 0, 0, 0, 0) ON CONFLICT (period_start) DO NOTHING",
        )
        .bind(q.period.start)
        .bind(q.period.end)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        if claimed.rows_affected() == 0 {
            return Ok(None);
        }
        let sessions = freeze_sessions(&mut tx, q).await?;
        let sums: HashMap<String, (i64, i64)> = sqlx::query_as::<_, (String, i64, i64)>(
            "SELECT org_id, CAST(SUM(running_seconds) AS BIGINT), CAST(SUM(adjustment_seconds) AS BIGINT) \
             FROM period_sessions WHERE period_start = $1 GROUP BY org_id",
        )
        .bind(q.period.start)
        .fetch_all(&mut *tx)
        .await?
        .into_iter()
        .map(|(org, run, adj)| (org, (run, adj)))
        .collect();
        let funding = period_funding_on(&mut tx, q).await?;
        let orgs = unwrap_all(
            sqlx::query_as::<_, Rec<Org>>(&format!(
                "SELECT * FROM orgs WHERE created_at < $1 ORDER BY org_id{BYTE_ORDER}"
            ))
            .bind(q.period.end)
            .fetch_all(&mut *tx)
            .await?,
        );
        let (mut total, mut adjusted) = (0, 0);
        for org in &orgs {
            let (run, adj) = sums.get(&org.org_id).copied().unwrap_or((0, 0));
            let (f, fa) = funding.get(&org.org_id).copied().unwrap_or_default();
            let t: Terms = terms(org);
            total += run;
            adjusted += adj;
            freeze_org(&mut tx, q, org, &t, (run, adj), (f, fa)).await?;
        }
        let row = sqlx::query_as::<_, PeriodRow>(
            "UPDATE periods SET orgs = $2, sessions = $3, agent_seconds = $4, adjustment_seconds = $5 \
             WHERE period_start = $1 RETURNING *",
        )
        .bind(q.period.start)
        .bind(orgs.len() as i64)
        .bind(sessions as i64)
        .bind(total)
        .bind(adjusted)
        .fetch_one(&mut *tx)
        .await?;
        write_audit(&mut tx, closed_entry(&row, now, actor)).await?;
        tx.commit().await?;
        Ok(Some(row))
    }
}

/// Freeze every session line of the period (and the adjustments of the month before it
/// closed); the number of lines.
async fn freeze_sessions(tx: &mut Tx, q: &LineQuery) -> StoreResult<u64> {
    let (ls, le) = adjusting(q);
    Ok(sqlx::query(&format!(
        "INSERT INTO period_sessions (period_start, org_id, session_id, project_id, started_by, \
           agent, running_seconds, parked_seconds, spans, first_start, last_end, end_status, \
           adjustment_seconds) SELECT $1, x.* FROM ({}) x",
        live_lines_sql()
    ))
    .bind(q.period.start)
    .bind(q.period.end)
    .bind(ls)
    .bind(le)
    .execute(&mut **tx)
    .await?
    .rows_affected())
}

/// Freeze one org's line of the period: its terms, its time (`run`, `adj`), and who paid
/// for it (`funding`, and the adjustments').
async fn freeze_org(
    tx: &mut Tx,
    q: &LineQuery,
    org: &Org,
    t: &Terms,
    (run, adj): (i64, i64),
    (f, fa): (PeriodFunding, PeriodFunding),
) -> StoreResult<()> {
    sqlx::query(
        "INSERT INTO period_orgs (period_start, org_id, plan_id, stripe_customer_id, \
           stripe_subscription_id, agent_seconds, adjustment_seconds, included_hours, \
           unit_price, price, currency, grant_promo_seconds, grant_make_good_seconds, \
           grant_trial_seconds, grant_purchased_seconds, overage_seconds, grace_seconds, \
           charge_units, adjustment_overage_seconds, adjustment_charge_units, plan_version) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, \
           $17, $18, $19, $20, $21)",
    )
    .bind(q.period.start)
    .bind(&org.org_id)
    .bind(&t.plan_id)
    .bind(&org.stripe_customer_id)
    .bind(&org.stripe_subscription_id)
    .bind(run)
    .bind(adj)
    .bind(t.included_hours.to_string())
    .bind(t.unit_price.to_string())
    .bind(t.price.to_string())
    .bind(&t.currency)
    .bind(f.grant[0])
    .bind(f.grant[1])
    .bind(f.grant[2])
    .bind(f.grant[3])
    .bind(f.overage)
    .bind(f.grace)
    .bind(f.charge_units)
    .bind(fa.overage)
    .bind(fa.charge_units)
    .bind(t.plan_version)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// The audit entry of a closed period.
fn closed_entry(row: &PeriodRow, now: Secs, actor: &Actor) -> Option<Entry> {
    let after = serde_json::json!({
        "period_start": row.period_start,
        "period_end": row.period_end,
        "orgs": row.orgs,
        "sessions": row.sessions,
        "agent_seconds": row.agent_seconds,
        "adjustment_seconds": row.adjustment_seconds,
    });
    change(
        "",
        now,
        actor,
        Action::PeriodClosed,
        format!("period:{}", row.period_start),
        None,
        Some(after),
    )
}
