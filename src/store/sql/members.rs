//! Inside an org (`MemberStore`), written once for both dialects: the limits an org sets on
//! its users, projects and keys, and what those members used in the org's windows (the
//! member rollup, and running sessions counted up to now).

use super::*;

impl<'r> sqlx::FromRow<'r, Row> for Rec<Limit> {
    fn from_row(row: &'r Row) -> Result<Self, sqlx::Error> {
        use sqlx::Row as _;
        let kind = named(row, "kind", LimitKind::parse)?
            .ok_or_else(|| decode_error("kind", "a limit without a kind"))?;
        let hours = |column: &str| -> Result<Option<Decimal>, sqlx::Error> {
            let text: Option<String> = row.try_get(column)?;
            text.map(|t| {
                t.parse()
                    .map_err(|_| decode_error(column, format!("`{t}`")))
            })
            .transpose()
        };
        Ok(Rec(Limit {
            org_id: row.try_get("org_id")?,
            kind,
            member_id: row.try_get("member_id")?,
            monthly_hours: hours("monthly_hours")?,
            weekly_hours: hours("weekly_hours")?,
            created_at: row.try_get("created_at")?,
            updated_at: row.try_get("updated_at")?,
        }))
    }
}

fn limit_subject(l: &Limit) -> String {
    format!("limit:{}:{}", l.kind.as_str(), l.member_id)
}

/// The limits of each of `orgs` (those that set any: `Org::sets_limits`), each with what
/// its member used in the org's month and week windows at `now`, in one statement a
/// group of orgs that share windows: the member rollup's buckets in them, and each running
/// session's time since its last heartbeat (at most one interval, as
/// `SessionLedger::provisional` counts it). Only limited members are summed; with
/// `members`, only those of them (any kind) that a group of admissions names.
///
/// The statement is a plain `UNION ALL` of the limits and of the use rows (rollup buckets,
/// then running sessions), summed per member here: each branch is an index range of one
/// org, so a generic plan (`begin_hot`) stays right whatever the org's size. The running
/// sessions are read once, summed by their (key, project, user), and only those few sums
/// are spread over the three kinds: a branch for each kind would read every running
/// session three times (reports/admission-notes.md).
pub(crate) async fn limits_with_usage_on(
    conn: &mut <DB as sqlx::Database>::Connection,
    orgs: &[&Org],
    members: Option<&[&str]>,
    now: Secs,
    rules: &Rules,
) -> StoreResult<HashMap<String, (Vec<Limit>, MemberUsage)>> {
    let mut out = LimitsRead::default();
    let sql = limits_sql(0, members.is_some());
    for (w, group) in rush_meter_core::standing::by_windows(orgs.iter().copied(), now) {
        let ids: Vec<&str> = group.iter().map(|o| o.org_id.as_str()).collect();
        for chunk in ids.chunks(CHUNK) {
            let q = bind_limits(sqlx::query(&sql), chunk, &w, members, now, rules);
            out.absorb(&q.fetch_all(&mut *conn).await?)?;
        }
    }
    Ok(out.finish())
}

/// The limits read's statement (see `limits_with_usage_on`), its parameters numbered from
/// `$base + 1`: the orgs; the month, the week and their hull; the interval, now; and, with
/// `members`, the members asked about (any kind).
fn limits_sql(base: usize, members: bool) -> String {
    let p = |n: usize| base + n;
    let only = |column: &str| match members {
        true => format!(" AND {}", D::in_list(column, p(10))),
        false => String::new(),
    };
    let stretch_end = format!("{LEAST}(last_at + ${}, ${})", p(8), p(9));
    // Each running session's (key, project, user) once, then each of them as a member.
    let member = "CASE d.kind WHEN 'key' THEN r.key_id WHEN 'project' THEN r.project_id \
                  ELSE r.started_by END";
    let named = match members {
        true => format!(
            " AND ({} OR {} OR {})",
            D::in_list("key_id", p(10)),
            D::in_list("project_id", p(10)),
            D::in_list("started_by", p(10))
        ),
        false => String::new(),
    };
    let running = format!(
        "SELECT 'used', r.org_id, d.kind, {member}, NULL, NULL, 0, 0, \
           CAST(SUM(r.month_used) AS BIGINT), CAST(SUM(r.week_used) AS BIGINT) \
         FROM (SELECT org_id, key_id, project_id, started_by, \
             SUM({month}) AS month_used, SUM({week}) AS week_used \
           FROM sessions WHERE {orgs} AND phase = 'running'{named} \
           GROUP BY org_id, key_id, project_id, started_by) AS r \
         CROSS JOIN (SELECT 'key' AS kind UNION ALL SELECT 'project' UNION ALL SELECT 'user') AS d \
         WHERE {member} IS NOT NULL \
         GROUP BY r.org_id, d.kind, {member}",
        month = overlap("last_at", &stretch_end, p(2), p(3)),
        week = overlap("last_at", &stretch_end, p(4), p(5)),
        orgs = D::org_in(p(1)),
    );
    format!(
        "{limit_rows} \
         UNION ALL \
         SELECT 'used', h.org_id, h.dimension, h.member_id, NULL, NULL, 0, 0, \
           CAST(SUM(CASE WHEN h.bucket >= ${m0} AND h.bucket < ${m1} THEN h.seconds ELSE 0 END) AS BIGINT), \
           CAST(SUM(CASE WHEN h.bucket >= ${w0} AND h.bucket < ${w1} THEN h.seconds ELSE 0 END) AS BIGINT) \
         FROM member_limits l JOIN member_hourly h ON h.org_id = l.org_id \
           AND h.dimension = l.kind AND h.member_id = l.member_id \
         WHERE {limited_orgs}{only_l} AND h.bucket >= ${h0} AND h.bucket < ${h1} \
         GROUP BY h.org_id, h.dimension, h.member_id \
         UNION ALL {running}",
        limit_rows = limit_rows_sql(p(1), members.then(|| p(10))),
        limited_orgs = D::in_list("l.org_id", p(1)),
        only_l = only("l.member_id"),
        m0 = p(2),
        m1 = p(3),
        w0 = p(4),
        w1 = p(5),
        h0 = p(6),
        h1 = p(7),
    )
}

/// The limits of the orgs listed in parameter `orgs`, with `members` the parameter listing
/// the only members (any kind) wanted; their use columns are zero (`LimitsRead`).
pub(crate) fn limit_rows_sql(orgs: usize, members: Option<usize>) -> String {
    format!(
        "SELECT 'limit' AS row_kind, org_id, kind, member_id, monthly_hours, weekly_hours, \
           created_at, updated_at, CAST(0 AS BIGINT) AS month_used, \
           CAST(0 AS BIGINT) AS week_used \
         FROM member_limits WHERE {}{}",
        D::org_in(orgs),
        members.map_or(String::new(), |m| format!(
            " AND {}",
            D::in_list("member_id", m)
        )),
    )
}

/// Bind the limits read's parameters (`limits_sql`), after those already bound to `q`.
fn bind_limits<'q>(
    q: sqlx::query::Query<'q, DB, <DB as sqlx::Database>::Arguments<'q>>,
    orgs: &[&str],
    w: &Windows,
    members: Option<&[&str]>,
    now: Secs,
    rules: &Rules,
) -> sqlx::query::Query<'q, DB, <DB as sqlx::Database>::Arguments<'q>> {
    let q = q
        .bind(D::id_list(orgs))
        .bind(w.month.start)
        .bind(w.month.end)
        .bind(w.week.start)
        .bind(w.week.end)
        .bind(w.month.start.min(w.week.start))
        .bind(w.month.end.max(w.week.end))
        .bind(rules.interval)
        .bind(now);
    match members {
        Some(m) => q.bind(D::id_list(m)),
        None => q,
    }
}

/// The limits and their members' use, gathered from the rows of limits reads.
#[derive(Default)]
pub(crate) struct LimitsRead {
    out: HashMap<String, (Vec<Limit>, MemberUsage)>,
}

impl LimitsRead {
    /// Take in one statement's rows (`row_kind` `limit` or `used`; others are not its own).
    /// SQL does not promise the branches' order: the use rows are added once every limit of
    /// the statement is known.
    pub(crate) fn absorb(&mut self, rows: &[Row]) -> Result<(), sqlx::Error> {
        use sqlx::Row as _;
        let mut used_rows = Vec::new();
        for row in rows {
            let kind: String = row.try_get("row_kind")?;
            if kind == "limit" {
                let Rec(limit) = <Rec<Limit> as sqlx::FromRow<'_, Row>>::from_row(row)?;
                let (limits, usage) = self.out.entry(limit.org_id.clone()).or_default();
                usage.insert((limit.kind.dimension(), limit.member_id.clone()), (0, 0));
                limits.push(limit);
            } else if kind == "used" {
                if let Some(dimension) = named(row, "kind", Dimension::parse)? {
                    let org: String = row.try_get("org_id")?;
                    let member: String = row.try_get("member_id")?;
                    let used: (i64, i64) = (row.try_get("month_used")?, row.try_get("week_used")?);
                    used_rows.push((org, dimension, member, used));
                }
            }
        }
        for (org, dimension, member, used) in used_rows {
            // Running sessions of members without a limit are read too: skipped here.
            if let Some(u) = self
                .out
                .get_mut(&org)
                .and_then(|(_, usage)| usage.get_mut(&(dimension, member)))
            {
                *u = (u.0 + used.0, u.1 + used.1);
            }
        }
        Ok(())
    }

    /// Each org's limits, as they are listed: by kind, then member, in byte order.
    pub(crate) fn finish(mut self) -> HashMap<String, (Vec<Limit>, MemberUsage)> {
        for (limits, _) in self.out.values_mut() {
            limits.sort_by(|a, b| {
                (a.kind.as_str(), &a.member_id).cmp(&(b.kind.as_str(), &b.member_id))
            });
        }
        self.out
    }
}

/// Make `orgs.sets_limits` say whether `org_id` has a limit left, after a change of its
/// limits made under the org's row lock (so that no other change counts around it).
async fn mark_limited(tx: &mut Tx, org_id: &str) -> StoreResult<()> {
    sqlx::query(
        "UPDATE orgs SET sets_limits = EXISTS (SELECT 1 FROM member_limits WHERE org_id = $1) \
         WHERE org_id = $1",
    )
    .bind(org_id)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

#[async_trait]
impl MemberStore for D {
    async fn put_limit(&self, limit: &Limit, now: Secs, actor: &Actor) -> StoreResult<Limit> {
        let mut tx = begin_write(self.write()).await?;
        // Changes of an org's limits follow each other (`mark_limited`).
        lock_org(&mut tx, &limit.org_id).await?;
        let before = sqlx::query_as::<_, Rec<Limit>>(&format!(
            "SELECT * FROM member_limits WHERE org_id = $1 AND kind = $2 AND member_id = $3{FOR_UPDATE}"
        ))
        .bind(&limit.org_id)
        .bind(limit.kind.as_str())
        .bind(&limit.member_id)
        .fetch_optional(&mut *tx)
        .await?
        .map(|r| r.0);
        let Rec(after) = sqlx::query_as::<_, Rec<Limit>>(
            "INSERT INTO member_limits (org_id, kind, member_id, monthly_hours, weekly_hours, \
               created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $6) \
             ON CONFLICT (org_id, kind, member_id) DO UPDATE SET \
               monthly_hours = excluded.monthly_hours, weekly_hours = excluded.weekly_hours, \
               updated_at = excluded.updated_at \
             RETURNING *",
        )
        .bind(&limit.org_id)
        .bind(limit.kind.as_str())
        .bind(&limit.member_id)
        .bind(limit.monthly_hours.map(|h| h.to_string()))
        .bind(limit.weekly_hours.map(|h| h.to_string()))
        .bind(now)
        .fetch_one(&mut *tx)
        .await?;
        let entry = change(
            &after.org_id,
            now,
            actor,
            Action::LimitSet,
            limit_subject(&after),
            before.as_ref().map(rush_meter_core::audit::limit_state),
            Some(rush_meter_core::audit::limit_state(&after)),
        );
        write_audit(&mut tx, entry).await?;
        if before.is_none() {
            mark_limited(&mut tx, &after.org_id).await?;
        }
        tx.commit().await?;
        Ok(after)
    }

    async fn delete_limit(
        &self,
        org_id: &str,
        kind: LimitKind,
        member_id: &str,
        now: Secs,
        actor: &Actor,
    ) -> StoreResult<Option<Limit>> {
        let mut tx = begin_write(self.write()).await?;
        lock_org(&mut tx, org_id).await?;
        let removed = sqlx::query_as::<_, Rec<Limit>>(
            "DELETE FROM member_limits WHERE org_id = $1 AND kind = $2 AND member_id = $3 \
             RETURNING *",
        )
        .bind(org_id)
        .bind(kind.as_str())
        .bind(member_id)
        .fetch_optional(&mut *tx)
        .await?
        .map(|r| r.0);
        if let Some(l) = &removed {
            let entry = change(
                org_id,
                now,
                actor,
                Action::LimitRemoved,
                limit_subject(l),
                Some(rush_meter_core::audit::limit_state(l)),
                None,
            );
            write_audit(&mut tx, entry).await?;
            mark_limited(&mut tx, org_id).await?;
        }
        tx.commit().await?;
        Ok(removed)
    }

    async fn limits_with_usage(
        &self,
        orgs: &[&Org],
        now: Secs,
        rules: &Rules,
    ) -> StoreResult<HashMap<String, (Vec<Limit>, MemberUsage)>> {
        let mut conn = self.keyed().acquire().await?;
        limits_with_usage_on(&mut conn, orgs, None, now, rules).await
    }

    async fn member_hours(
        &self,
        org_id: &str,
        dimension: Dimension,
        member_id: &str,
        from: Secs,
        to: Secs,
    ) -> StoreResult<Vec<(Secs, i64)>> {
        Ok(sqlx::query_as(
            "SELECT bucket, seconds FROM member_hourly WHERE org_id = $1 AND dimension = $2 \
               AND member_id = $3 AND bucket >= $4 AND bucket < $5 ORDER BY bucket",
        )
        .bind(org_id)
        .bind(dimension.as_str())
        .bind(member_id)
        .bind(from)
        .bind(to)
        .fetch_all(self.keyed())
        .await?)
    }

    async fn open_sessions_of_user(&self, org_id: &str, user: &str) -> StoreResult<Vec<Session>> {
        Ok(unwrap_all(
            sqlx::query_as::<_, Rec<Session>>(
                "SELECT * FROM sessions WHERE org_id = $1 AND started_by = $2 \
                   AND phase IN ('running', 'parked') ORDER BY created_at, session_id",
            )
            .bind(org_id)
            .bind(user)
            .fetch_all(self.read())
            .await?,
        ))
    }
}
