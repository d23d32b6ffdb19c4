//! The window sums, written once for both dialects: seconds each org used in its month
//! and week windows, read in one statement (`window_sums_sql`), by the ledger's
//! `window_usage`, the gate (`window_usage_and_limits_on`) and funding.

use super::*;

/// `GREATEST(0, LEAST(hi, $b) - GREATEST(lo, $a))`: seconds of `[lo, hi)` inside `[$a, $b)`.
pub(crate) fn overlap(lo: &str, hi: &str, a: usize, b: usize) -> String {
    format!("{GREATEST}(0, {LEAST}({hi}, ${b}) - {GREATEST}({lo}, ${a}))")
}

/// A window edge that is not there (a window starting or ending on the hour, as every ISO
/// week does): an empty interval past any span, so that its `end_at > $a` reads nothing
/// from `spans_org_running_end` and its overlap is 0. (`(0, 0)` would read every span the
/// org ever had, a cost that grew with its history.)
pub(crate) const NO_EDGE: (Secs, Secs) = (i64::MAX / 4, i64::MAX / 4);

/// Past any instant the ledger holds (2^62 s): the far bound that turns a half-line into a
/// range for a generic plan.
const FAR_END: &str = "4611686018427387904";

/// A query of this dialect, bound step by step.
pub(crate) type Query<'q> = sqlx::query::Query<'q, DB, <DB as sqlx::Database>::Arguments<'q>>;

/// Add a window sums row's figures (`org_id`, then `s1`…`s5` under `names`) to `out`.
pub(crate) fn add_window_sums(
    out: &mut HashMap<String, WindowTotals>,
    row: &Row,
    names: [&str; 5],
) -> Result<(), sqlx::Error> {
    use sqlx::Row as _;
    let e = out.entry(row.try_get("org_id")?).or_default();
    e.month += row.try_get::<i64, _>(names[0])?;
    e.week += row.try_get::<i64, _>(names[1])?;
    e.running += row.try_get::<i64, _>(names[2])?;
    e.month_provisional += row.try_get::<i64, _>(names[3])?;
    e.week_provisional += row.try_get::<i64, _>(names[4])?;
    Ok(())
}

/// Parameters of the window sums before the org ids (`window_sums_sql`).
pub(crate) const WINDOW_SUMS_PARAMETERS: usize = 21;

/// The values the window sums' statement is bound with, for one pair of windows.
pub(crate) struct WindowSums {
    windows: [Interval; 2],
    full: [(Secs, Secs); 2],
    pub(crate) edges: [[(Secs, Secs); 2]; 2],
}

impl WindowSums {
    pub(crate) fn new(windows: &Windows) -> WindowSums {
        let ws = [windows.month, windows.week];
        WindowSums {
            windows: ws,
            full: ws.map(full_hours),
            edges: ws.map(|w| {
                let mut e = partial_hours(w).into_iter().map(|i| (i.start, i.end));
                [e.next().unwrap_or(NO_EDGE), e.next().unwrap_or(NO_EDGE)]
            }),
        }
    }

    /// Bind `window_sums_sql`'s parameters for `orgs` (its first ones) to `q`.
    pub(crate) fn bind<'q>(
        &self,
        mut q: Query<'q>,
        orgs: &[&'q str],
        now: Secs,
        rules: &Rules,
    ) -> Query<'q> {
        let full = self.full;
        let (lo, hi) = (full[0].0.min(full[1].0), full[0].1.max(full[1].1));
        for v in [full[0].0, full[0].1, full[1].0, full[1].1, lo, hi] {
            q = q.bind(v);
        }
        for e in self.edges.iter().flatten() {
            q = q.bind(e.0).bind(e.1);
        }
        for w in self.windows {
            q = q.bind(w.start).bind(w.end);
        }
        q = q.bind(now).bind(rules.interval).bind(rules.lease);
        for id in orgs {
            q = q.bind(*id);
        }
        q
    }
}

/// The window sums' statement for `orgs` org ids (`$22…`) and these window edges (absent
/// ones `NO_EDGE`): see `window_usage_on` for its parameters. Its columns: `org_id`, then
/// `s1`…`s5` (month, week, running, month and week provisional).
pub(crate) fn window_sums_sql(orgs: usize, edges: &[[(Secs, Secs); 2]; 2]) -> String {
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
    // Closed spans inside the edges' part hours, for the edges there are: none for windows
    // that start and end on the hour (every calendar month, every ISO week), so no span is
    // read. Each edge `[$a, $b)` is a range on `end_at` (its far bound past any span), which
    // a generic plan (`begin_hot`) reads from `spans_org_running_end`; a half-line
    // `end_at > $a` it guesses at a third of the table and scans the table.
    let present: Vec<usize> = (0..4)
        .filter(|i| edges[i / 2][i % 2] != NO_EDGE)
        .map(|i| 7 + 2 * i)
        .collect();
    let edge_spans = |list: &str| {
        if present.is_empty() {
            return String::new();
        }
        let ranges: Vec<String> = present
            .iter()
            .map(|a| {
                format!(
                    "(end_at > ${a} AND end_at < {FAR_END} AND start_at < ${})",
                    a + 1
                )
            })
            .collect();
        format!(
            "UNION ALL \
             SELECT org_id, CAST(SUM({}) AS BIGINT), CAST(SUM({}) AS BIGINT), CAST(0 AS BIGINT), \
               CAST(0 AS BIGINT), CAST(0 AS BIGINT) FROM spans \
             WHERE org_id IN ({list}) AND kind = 'running' AND ({}) GROUP BY org_id ",
            sum_edges("start_at", "end_at", 0),
            sum_edges("start_at", "end_at", 1),
            ranges.join(" OR "),
        )
    };
    let list: Vec<String> = (0..orgs).map(|i| format!("${}", 22 + i)).collect();
    let list = list.join(", ");
    format!(
        "SELECT org_id, \
           CAST(COALESCE(SUM(CASE WHEN hour >= $1 AND hour < $2 THEN seconds ELSE 0 END), 0) AS BIGINT) AS s1, \
           CAST(COALESCE(SUM(CASE WHEN hour >= $3 AND hour < $4 THEN seconds ELSE 0 END), 0) AS BIGINT) AS s2, \
           CAST(0 AS BIGINT) AS s3, CAST(0 AS BIGINT) AS s4, CAST(0 AS BIGINT) AS s5 \
         FROM org_hourly WHERE org_id IN ({list}) AND hour >= $5 AND hour < $6 GROUP BY org_id \
         {edge_spans}UNION ALL \
         SELECT org_id, CAST(SUM({oe0} + {p0}) AS BIGINT), CAST(SUM({oe1} + {p1}) AS BIGINT), \
           CAST(SUM(CASE WHEN COALESCE(heard_at, last_at) >= $19 - $21 THEN 1 ELSE 0 END) AS BIGINT), \
           CAST(SUM({p0}) AS BIGINT), CAST(SUM({p1}) AS BIGINT) \
         FROM sessions WHERE org_id IN ({list}) AND phase = 'running' GROUP BY org_id",
        edge_spans = edge_spans(&list),
        oe0 = sum_edges("span_start", "last_at", 0),
        oe1 = sum_edges("span_start", "last_at", 1),
        p0 = provisional(0),
        p1 = provisional(1),
    )
}

/// Seconds used in the month and week windows by each of `org_ids` (which share those
/// windows), in one statement so that one snapshot gives every figure: whole hours from
/// the hourly rollup, part hours at the windows' edges from the spans and open stretches,
/// and each running session counted up to `now` (`SessionLedger::provisional`).
pub(crate) async fn window_usage_on(
    conn: &mut <DB as sqlx::Database>::Connection,
    org_ids: &[&str],
    windows: &Windows,
    now: Secs,
    rules: &Rules,
) -> StoreResult<HashMap<String, WindowTotals>> {
    let mut out: HashMap<String, WindowTotals> = HashMap::new();
    let sums = WindowSums::new(windows);
    for chunk in org_ids.chunks(CHUNK) {
        let sql = window_sums_sql(chunk.len(), &sums.edges);
        let q = sums.bind(sqlx::query(&sql), chunk, now, rules);
        for row in q.fetch_all(&mut *conn).await? {
            add_window_sums(&mut out, &row, ["s1", "s2", "s3", "s4", "s5"])?;
        }
    }
    Ok(out)
}
