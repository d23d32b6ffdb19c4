//! Funding (`core::funding`), written once for both dialects: each org's row read with its
//! funding state (the windows it funds in, its open grants) in one statement, after a
//! booking has locked the rows until it commits, so that what the booking attributes is
//! exact on any number of instances; and the reads the gate, heartbeat answers and the
//! usage page make of it.

use super::*;

pub(crate) const FUNDING_WINDOW_COLUMNS: &str =
    "org_id, kind, window_start, window_end, plan_seconds, \
     grant_seconds, overage_seconds, grace_seconds, charge_units";

/// A window's funds as they now stand (written under the org's lock).
pub(crate) const FUNDING_WINDOW_UPSERT: &str =
    " ON CONFLICT (org_id, kind, window_start) DO UPDATE SET \
     window_end = excluded.window_end, plan_seconds = excluded.plan_seconds, \
     grant_seconds = excluded.grant_seconds, overage_seconds = excluded.overage_seconds, \
     grace_seconds = excluded.grace_seconds, charge_units = excluded.charge_units";

pub(crate) const FUNDING_HOURS_CONFLICT: &str =
    " ON CONFLICT (org_id, hour, source, grant_id) DO UPDATE \
     SET seconds = funding_hourly.seconds + excluded.seconds, \
     charge_units = funding_hourly.charge_units + excluded.charge_units";

/// An org with what the store records of its funding, as one row reads it.
pub(crate) struct FundingRow {
    pub(crate) org: Org,
    pub(crate) recorded: rush_meter_core::funding::Recorded,
}

/// A window's funds as the row's JSON array holds them.
type WindowJson = (String, Secs, Secs, i64, i64, i64, i64, i64);
/// An open grant as the row's JSON array holds it.
type GrantJson = (
    String,
    String,
    String,
    i64,
    i64,
    i64,
    Secs,
    Option<Secs>,
    Secs,
);

/// A window's funds from its columns, in `WindowJson`'s order.
fn window_funds(w: WindowJson) -> Result<WindowFunds, String> {
    let (kind, start, end, plan, grant, overage, grace, units) = w;
    let kind = WindowKind::parse(&kind).ok_or_else(|| format!("kind `{kind}`"))?;
    let window = Interval::new(start, end).ok_or("an empty window")?;
    Ok(WindowFunds {
        kind,
        window,
        funds: Funds {
            plan,
            grant,
            overage,
            grace,
            charge_units: units,
        },
    })
}

pub(crate) fn decode_error(column: &str, e: impl std::fmt::Display) -> sqlx::Error {
    sqlx::Error::ColumnDecode {
        index: column.to_owned(),
        source: e.to_string().into(),
    }
}

impl<'r> sqlx::FromRow<'r, Row> for FundingRow {
    fn from_row(row: &'r Row) -> Result<Self, sqlx::Error> {
        use sqlx::Row as _;
        let Rec(org) = Rec::<Org>::from_row(row)?;
        let text: String = row.try_get("funding_windows")?;
        let windows: Vec<WindowJson> =
            serde_json::from_str(&text).map_err(|e| decode_error("funding_windows", e))?;
        let windows = windows
            .into_iter()
            .map(|w| window_funds(w).map_err(|e| decode_error("funding_windows", e)))
            .collect::<Result<_, sqlx::Error>>()?;
        let text: String = row.try_get("open_grants")?;
        let grants: Vec<GrantJson> =
            serde_json::from_str(&text).map_err(|e| decode_error("open_grants", e))?;
        let grants = grants
            .into_iter()
            .map(
                |(
                    org_id,
                    grant_id,
                    kind,
                    seconds,
                    used,
                    priority,
                    starts_at,
                    expires_at,
                    created_at,
                )| {
                    let kind = GrantKind::parse(&kind)
                        .ok_or_else(|| decode_error("open_grants", format!("kind `{kind}`")))?;
                    Ok(Grant {
                        org_id,
                        grant_id,
                        kind,
                        seconds,
                        used_seconds: used,
                        priority,
                        starts_at,
                        expires_at,
                        note: None,
                        idempotency_key: None,
                        created_at,
                        voided_at: None,
                        used_up_at: None,
                    })
                },
            )
            .collect::<Result<_, sqlx::Error>>()?;
        Ok(FundingRow {
            org,
            recorded: rush_meter_core::funding::Recorded {
                windows,
                grants,
                holds_grants: row.try_get("holds_grants")?,
                floor: row.try_get("funding_floor")?,
            },
        })
    }
}

/// Orgs of `$1` (one shard's) with the windows they fund in that end after `$2` and their
/// grants open at `$2`, and with `counting_parked` their parked sessions (counted from the
/// index led by (org_id, phase) without reading their rows: they pile up, a session parks
/// between turns for days). Never with a lock in the same statement: a booking locks the
/// rows first (`lock_orgs`), so that its read sees the bookings it waited for.
///
/// `spread` (`Dialect::spread`): each subquery names the orgs `$1` as well (Citus routes a
/// statement to one shard only when every org table in it is filtered by org: a correlation
/// alone does not prune), and the periods' floor is correlated with the org's row, so that
/// it is read beside it on the org's worker (a reference table is on every node) rather
/// than first, through the coordinator.
pub(crate) fn funding_select_with(counting_parked: bool, spread: bool) -> String {
    let named = |alias: &str| {
        if spread {
            format!(" AND {}", D::in_list(&format!("{alias}.org_id"), 1))
        } else {
            String::new()
        }
    };
    let (w, g, c, s) = (named("w"), named("g"), named("c"), named("s"));
    let beside = if spread {
        " WHERE o.org_id IS NOT NULL"
    } else {
        ""
    };
    let parked = if counting_parked {
        format!(
            ", (SELECT COUNT(*) FROM sessions s \
             WHERE s.org_id = o.org_id{s} AND s.phase = 'parked') AS parked_sessions"
        )
    } else {
        String::new()
    };
    format!(
        "SELECT o.*, \
           (SELECT COALESCE(CAST({JSON_AGG}({JSON_ARRAY}(w.kind, w.window_start, w.window_end, \
              w.plan_seconds, w.grant_seconds, w.overage_seconds, w.grace_seconds, w.charge_units)) AS TEXT), '[]') \
            FROM funding_windows w WHERE w.org_id = o.org_id{w} AND w.window_end > $2) AS funding_windows, \
           (SELECT COALESCE(CAST({JSON_AGG}({JSON_ARRAY}(g.org_id, g.grant_id, g.kind, g.seconds, \
              g.used_seconds, g.priority, g.starts_at, g.expires_at, g.created_at)) AS TEXT), '[]') \
            FROM grants g WHERE g.org_id = o.org_id{g} AND g.voided_at IS NULL \
              AND g.used_seconds < g.seconds AND (g.expires_at IS NULL OR g.expires_at > $2)) AS open_grants, \
           EXISTS (SELECT 1 FROM grants g WHERE g.org_id = o.org_id{g} AND g.voided_at IS NULL \
              AND g.starts_at <= $2 AND (g.expires_at IS NULL OR g.expires_at > $2)) AS holds_grants, \
           {GREATEST}(COALESCE((SELECT MAX(p.period_end) FROM periods p{beside}), 0), \
             COALESCE((SELECT MAX(c.window_end) FROM overage_charges c WHERE c.org_id = o.org_id{c}), 0)) \
             AS funding_floor{parked} \
         FROM orgs o WHERE o.{} ORDER BY o.org_id{BYTE_ORDER}",
        D::org_in(1)
    )
}

/// `funding_select_with` of orgs `orgs` at `since`, without the parked count.
pub(crate) async fn select_funding<'e, E: sqlx::Executor<'e, Database = DB>>(
    ex: E,
    orgs: &[&str],
    since: Secs,
    spread: bool,
) -> StoreResult<Vec<FundingRow>> {
    Ok(
        sqlx::query_as::<_, FundingRow>(&funding_select_with(false, spread))
            .bind(D::id_list(orgs))
            .bind(since)
            .fetch_all(ex)
            .await?,
    )
}

impl D {
    /// Lock the rows of the orgs `booking` billed (shard after shard, in byte order: the
    /// order every writer takes them in, after its sessions), read their funding state and
    /// attribute what was billed (`Booking::fund`).
    pub(crate) async fn fund(
        &self,
        tx: &mut Tx,
        booking: &mut Booking,
        plans: &Plans,
        now: Secs,
        rules: &Rules,
    ) -> StoreResult<()> {
        let orgs: Vec<String> = booking
            .billed_orgs()
            .into_iter()
            .map(str::to_owned)
            .collect();
        let Some(since) = booking.billed.iter().map(|b| b.2.start).min() else {
            return Ok(());
        };
        let mut rows = Vec::with_capacity(orgs.len());
        for shard in self
            .by_shard(tx, orgs.iter().map(String::as_str))
            .await?
            .values()
        {
            for chunk in shard.chunks(CHUNK) {
                // Locked, then read: a statement reads from the snapshot it began with, so
                // one that waited for the lock would miss what the booking holding it
                // committed (its grants used, its windows' funds) and write over it.
                lock_orgs(tx, chunk).await?;
                rows.extend(select_funding(&mut **tx, chunk, since, self.spread()).await?);
            }
        }
        if let Some(missing) = orgs
            .iter()
            .find(|o| !rows.iter().any(|r| &r.org.org_id == *o))
        {
            return Err(StoreError::Conflict(format!(
                "org `{missing}` was billed but does not exist"
            )));
        }
        let booked = booked_before_funding(tx, &rows, now, rules).await?;
        let mut states = BTreeMap::new();
        for FundingRow { org, recorded } in rows {
            let used = booked.get(&org.org_id).copied().unwrap_or_default();
            let state = rush_meter_core::standing::funding_state(&org, plans, now, recorded, &used);
            states.insert(org.org_id, state);
        }
        booking.fund(&mut states);
        Ok(())
    }
}

/// What was booked (not counting running sessions' time since) in the current windows of
/// each org none of whose bookings funded them yet: what `funding_state` seeds them from.
/// None in steady state; once an org and window after a release that added funding.
async fn booked_before_funding(
    tx: &mut Tx,
    rows: &[FundingRow],
    now: Secs,
    rules: &Rules,
) -> StoreResult<HashMap<String, WindowTotals>> {
    let unfunded: Vec<&Org> = rows
        .iter()
        .filter(|r| {
            let w = Windows::at(now, r.org.billing_period());
            let has = |kind, start| {
                r.recorded
                    .windows
                    .iter()
                    .any(|f| f.kind == kind && f.window.start == start)
            };
            !has(WindowKind::Month, w.month.start) || !has(WindowKind::Week, w.week.start)
        })
        .map(|r| &r.org)
        .collect();
    let mut out = HashMap::new();
    for (windows, orgs) in rush_meter_core::standing::by_windows(unfunded, now) {
        let ids: Vec<&str> = orgs.iter().map(|o| o.org_id.as_str()).collect();
        for (org, t) in window_usage_on(tx, &ids, &windows, now, rules).await? {
            let booked = WindowTotals {
                month: t.month - t.month_provisional,
                week: t.week - t.week_provisional,
                ..WindowTotals::default()
            };
            out.insert(org, booked);
        }
    }
    Ok(out)
}

/// Each org of `org_ids` that exists, with what is recorded of its funding at `now`.
async fn funding_records(
    pool: &Pool<DB>,
    org_ids: &[&str],
    now: Secs,
    spread: bool,
) -> StoreResult<Vec<(Org, rush_meter_core::funding::Recorded)>> {
    let mut out = Vec::with_capacity(org_ids.len());
    for chunk in org_ids.chunks(CHUNK) {
        for row in select_funding(pool, chunk, now, spread).await? {
            out.push((row.org, row.recorded));
        }
    }
    Ok(out)
}

impl<'r> sqlx::FromRow<'r, Row> for Rec<Grant> {
    fn from_row(row: &'r Row) -> Result<Self, sqlx::Error> {
        use sqlx::Row as _;
        let kind = named(row, "kind", GrantKind::parse)?
            .ok_or_else(|| decode_error("kind", "a grant without a kind"))?;
        Ok(Rec(Grant {
            org_id: row.try_get("org_id")?,
            grant_id: row.try_get("grant_id")?,
            kind,
            seconds: row.try_get("seconds")?,
            used_seconds: row.try_get("used_seconds")?,
            priority: row.try_get("priority")?,
            starts_at: row.try_get("starts_at")?,
            expires_at: row.try_get("expires_at")?,
            note: row.try_get("note")?,
            idempotency_key: row.try_get("idempotency_key")?,
            created_at: row.try_get("created_at")?,
            voided_at: row.try_get("voided_at")?,
            used_up_at: row.try_get("used_up_at")?,
        }))
    }
}

/// Lock the rows of `orgs` (one shard's, sorted) in byte order, as every booking does: the
/// order every writer takes them in. Nothing to do where the transaction holds the
/// database's write lock (SQLite's `BEGIN IMMEDIATE`).
async fn lock_orgs(tx: &mut Tx, orgs: &[&str]) -> StoreResult<()> {
    if LOCK_ORGS.is_empty() {
        return Ok(());
    }
    sqlx::query(&format!(
        "SELECT o.org_id FROM orgs o WHERE o.{} ORDER BY o.org_id{BYTE_ORDER}{LOCK_ORGS}",
        D::org_in(1)
    ))
    .bind(D::id_list(orgs))
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Lock an org's row as a booking does, so that a change to its funding is ordered with
/// every booking of the org; false if the org does not exist.
pub(crate) async fn lock_org(tx: &mut Tx, org_id: &str) -> StoreResult<bool> {
    let found: Option<String> = sqlx::query_scalar(&format!(
        "SELECT o.org_id FROM orgs o WHERE o.org_id = $1{LOCK_ORGS}"
    ))
    .bind(org_id)
    .fetch_optional(&mut **tx)
    .await?;
    Ok(found.is_some())
}

/// Make a grant (audited), or answer the one made before with its idempotency key
/// (`false`: nothing was made), in a transaction holding the org's lock.
pub(crate) async fn insert_grant(
    tx: &mut Tx,
    g: &Grant,
    actor: &Actor,
) -> StoreResult<(Grant, bool)> {
    let created = sqlx::query_as::<_, Rec<Grant>>(
        "INSERT INTO grants (org_id, grant_id, kind, seconds, used_seconds, priority, \
           starts_at, expires_at, note, idempotency_key, created_at) \
         VALUES ($1, $2, $3, $4, 0, $5, $6, $7, $8, $9, $10) \
         ON CONFLICT (org_id, idempotency_key) DO NOTHING RETURNING *",
    )
    .bind(&g.org_id)
    .bind(&g.grant_id)
    .bind(g.kind.as_str())
    .bind(g.seconds)
    .bind(g.priority)
    .bind(g.starts_at)
    .bind(g.expires_at)
    .bind(&g.note)
    .bind(&g.idempotency_key)
    .bind(g.created_at)
    .fetch_optional(&mut **tx)
    .await?;
    Ok(match created {
        Some(Rec(made)) => {
            let entry = change(
                &made.org_id,
                made.created_at,
                actor,
                Action::GrantCreated,
                format!("grant:{}", made.grant_id),
                None,
                Some(rush_meter_core::audit::grant_state(&made)),
            );
            write_audit(tx, entry).await?;
            (made, true)
        }
        None => {
            let Rec(first) = sqlx::query_as::<_, Rec<Grant>>(
                "SELECT * FROM grants WHERE org_id = $1 AND idempotency_key = $2",
            )
            .bind(&g.org_id)
            .bind(&g.idempotency_key)
            .fetch_one(&mut **tx)
            .await?;
            (first, false)
        }
    })
}

#[async_trait]
impl FundingStore for D {
    async fn funding_records(
        &self,
        org_ids: &[&str],
        now: Secs,
    ) -> StoreResult<Vec<(Org, rush_meter_core::funding::Recorded)>> {
        let mut reads: Vec<BoxFuture<'_, _>> = Vec::new();
        for orgs in self.parts_by_shard(org_ids).await? {
            reads.push(Box::pin(async move {
                funding_records(self.keyed(), &orgs, now, self.spread()).await
            }));
        }
        Ok(shards_at_once(reads).await?.into_iter().flatten().collect())
    }

    async fn funding_record_counting_parked(
        &self,
        org_id: &str,
        now: Secs,
    ) -> StoreResult<Option<(Org, rush_meter_core::funding::Recorded, i64)>> {
        use sqlx::{FromRow, Row as _};
        let row = sqlx::query(&funding_select_with(true, self.spread()))
            .bind(D::id_list(&[org_id]))
            .bind(now)
            .fetch_optional(self.keyed())
            .await?;
        let Some(row) = row else { return Ok(None) };
        let FundingRow { org, recorded } = FundingRow::from_row(&row)?;
        Ok(Some((org, recorded, row.try_get("parked_sessions")?)))
    }

    async fn create_grant(&self, g: &Grant, actor: &Actor) -> StoreResult<Option<(Grant, bool)>> {
        let mut tx = begin_write(self.write()).await?;
        if !lock_org(&mut tx, &g.org_id).await? {
            return Ok(None);
        }
        let out = insert_grant(&mut tx, g, actor).await?;
        tx.commit().await?;
        Ok(Some(out))
    }

    async fn funding_totals(
        &self,
        org_id: &str,
        from: Secs,
        to: Secs,
    ) -> StoreResult<BTreeMap<Source, (i64, i64)>> {
        let rows: Vec<(String, i64, i64)> = sqlx::query_as(
            "SELECT source, CAST(SUM(seconds) AS BIGINT), CAST(SUM(charge_units) AS BIGINT) \
             FROM funding_hourly WHERE org_id = $1 AND hour >= $2 AND hour < $3 GROUP BY source",
        )
        .bind(org_id)
        .bind(from)
        .bind(to)
        .fetch_all(self.keyed())
        .await?;
        rows.into_iter()
            .map(|(source, s, u)| {
                let source = Source::parse(&source).ok_or_else(|| {
                    StoreError::Other(decode_error("funding_hourly.source", format!("`{source}`")))
                })?;
                Ok((source, (s, u)))
            })
            .collect()
    }

    async fn grants_to_notify(&self, now: Secs, since: Secs) -> StoreResult<Vec<Grant>> {
        Ok(unwrap_all(
            sqlx::query_as::<_, Rec<Grant>>(
                "SELECT * FROM grants WHERE voided_at IS NULL AND ( \
                   (used_up_at IS NOT NULL AND used_up_at >= $2) OR \
                   (used_seconds < seconds AND expires_at > $1 AND expires_at <= $1 + $3)) \
                 LIMIT 1000",
            )
            .bind(now)
            .bind(since)
            .bind(rush_meter_core::thresholds::EXPIRY_NOTICE_DAYS * 86_400)
            .fetch_all(self.read())
            .await?,
        ))
    }

    async fn funding_windows_of(&self, org_id: &str) -> StoreResult<Vec<WindowFunds>> {
        let rows: Vec<WindowJson> = sqlx::query_as(
            "SELECT kind, window_start, window_end, plan_seconds, grant_seconds, \
               overage_seconds, grace_seconds, charge_units \
             FROM funding_windows WHERE org_id = $1 ORDER BY window_start, kind",
        )
        .bind(org_id)
        .fetch_all(self.read())
        .await?;
        rows.into_iter()
            .map(|w| {
                window_funds(w).map_err(|e| StoreError::Other(decode_error("funding_windows", e)))
            })
            .collect()
    }

    async fn list_grants(&self, org_id: &str) -> StoreResult<Vec<Grant>> {
        Ok(unwrap_all(
            sqlx::query_as::<_, Rec<Grant>>(&format!(
                "SELECT * FROM grants WHERE org_id = $1 ORDER BY created_at, grant_id{BYTE_ORDER}"
            ))
            .bind(org_id)
            .fetch_all(self.read())
            .await?,
        ))
    }

    async fn void_grant(
        &self,
        org_id: &str,
        grant_id: &str,
        now: Secs,
        actor: &Actor,
    ) -> StoreResult<Option<Grant>> {
        let mut tx = begin_write(self.write()).await?;
        if !lock_org(&mut tx, org_id).await? {
            return Ok(None);
        }
        let before = sqlx::query_as::<_, Rec<Grant>>(
            "SELECT * FROM grants WHERE org_id = $1 AND grant_id = $2",
        )
        .bind(org_id)
        .bind(grant_id)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(Rec(before)) = before else {
            return Ok(None);
        };
        let Rec(after) = sqlx::query_as::<_, Rec<Grant>>(
            "UPDATE grants SET voided_at = COALESCE(voided_at, $3) \
             WHERE org_id = $1 AND grant_id = $2 RETURNING *",
        )
        .bind(org_id)
        .bind(grant_id)
        .bind(now)
        .fetch_one(&mut *tx)
        .await?;
        let entry = change(
            org_id,
            now,
            actor,
            Action::GrantVoided,
            format!("grant:{grant_id}"),
            Some(rush_meter_core::audit::grant_state(&before)),
            Some(rush_meter_core::audit::grant_state(&after)),
        );
        write_audit(&mut tx, entry).await?;
        tx.commit().await?;
        Ok(Some(after))
    }

    async fn set_overage(
        &self,
        org_id: &str,
        overage: &Overage,
        now: Secs,
        actor: &Actor,
    ) -> StoreResult<Option<Org>> {
        let mut tx = begin_write(self.write()).await?;
        let Some(before) = org_for_update(&mut tx, org_id).await? else {
            return Ok(None);
        };
        let Rec(after) = sqlx::query_as::<_, Rec<Org>>(
            "UPDATE orgs SET overage_enabled = $2, overage_cap = $3, updated_at = $4 \
             WHERE org_id = $1 RETURNING *",
        )
        .bind(org_id)
        .bind(overage.enabled)
        .bind(overage.monthly_cap.to_string())
        .bind(now)
        .fetch_one(&mut *tx)
        .await?;
        let entry = change(
            org_id,
            now,
            actor,
            Action::OverageUpdated,
            "overage".to_owned(),
            Some(rush_meter_core::audit::overage_state(&before.overage)),
            Some(rush_meter_core::audit::overage_state(&after.overage)),
        );
        write_audit(&mut tx, entry).await?;
        tx.commit().await?;
        Ok(Some(after))
    }
}
