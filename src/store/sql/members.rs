// Inside an org (`MemberStore`), written once for both dialects: the limits an org sets on
// its users, projects and keys, and what those members used in the org's windows (the
// member rollup, and running sessions counted up to now).

impl<'r> sqlx::FromRow<'r, Row> for Rec<Limit> {
    fn from_row(row: &'r Row) -> Result<Self, sqlx::Error> {
        use sqlx::Row as _;
        let kind = named(row, "kind", LimitKind::parse)?
            .ok_or_else(|| decode_error("kind", "a limit without a kind"))?;
        let hours = |column: &str| -> Result<Option<Decimal>, sqlx::Error> {
            let text: Option<String> = row.try_get(column)?;
            text.map(|t| t.parse().map_err(|_| decode_error(column, format!("`{t}`"))))
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

/// The limits of `orgs` (one shard's, or any), by org.
async fn limits_on(
    conn: &mut <DB as sqlx::Database>::Connection,
    orgs: &[&str],
) -> StoreResult<HashMap<String, Vec<Limit>>> {
    let mut out: HashMap<String, Vec<Limit>> = HashMap::new();
    for chunk in orgs.chunks(CHUNK) {
        let rows = sqlx::query_as::<_, Rec<Limit>>(&format!(
            "SELECT * FROM member_limits WHERE {} ORDER BY org_id, kind, member_id",
            org_in(1)
        ))
        .bind(org_list(chunk))
        .fetch_all(&mut *conn)
        .await?;
        for Rec(l) in rows {
            out.entry(l.org_id.clone()).or_default().push(l);
        }
    }
    Ok(out)
}

/// A running session's org, user, project and key, and when it was last booked.
type RunningMembers = (String, Option<String>, Option<String>, Option<String>, Secs);

/// What the users, projects and keys of each of `orgs` used in the org's month and week
/// windows at `now`: the member rollup's buckets in them, and each running session's time
/// since its last heartbeat (at most one interval: `SessionLedger::provisional`).
async fn member_usage_on(
    conn: &mut <DB as sqlx::Database>::Connection,
    orgs: &[&Org],
    now: Secs,
    rules: &Rules,
) -> StoreResult<HashMap<String, MemberUsage>> {
    let mut out: HashMap<String, MemberUsage> = HashMap::new();
    for (w, group) in rush_meter_core::standing::by_windows(orgs.iter().copied(), now) {
        let ids: Vec<&str> = group.iter().map(|o| o.org_id.as_str()).collect();
        for chunk in ids.chunks(CHUNK) {
            let booked: Vec<(String, String, String, i64, i64)> = sqlx::query_as(&format!(
                "SELECT org_id, dimension, member_id, \
                   CAST(SUM(CASE WHEN bucket >= $2 AND bucket < $3 THEN seconds ELSE 0 END) AS BIGINT), \
                   CAST(SUM(CASE WHEN bucket >= $4 AND bucket < $5 THEN seconds ELSE 0 END) AS BIGINT) \
                 FROM member_hourly WHERE {} AND dimension IN ('user', 'project', 'key') \
                   AND bucket >= $6 AND bucket < $7 \
                 GROUP BY org_id, dimension, member_id",
                org_in(1)
            ))
            .bind(org_list(chunk))
            .bind(w.month.start)
            .bind(w.month.end)
            .bind(w.week.start)
            .bind(w.week.end)
            .bind(w.month.start.min(w.week.start))
            .bind(w.month.end.max(w.week.end))
            .fetch_all(&mut *conn)
            .await?;
            for (org, dim, member, m, wk) in booked {
                let Some(dim) = Dimension::parse(&dim) else {
                    continue;
                };
                let e = out.entry(org).or_default().entry((dim, member)).or_default();
                e.0 += m;
                e.1 += wk;
            }
            let running: Vec<RunningMembers> =
                sqlx::query_as(&format!(
                    "SELECT org_id, started_by, project_id, key_id, last_at FROM sessions \
                     WHERE {} AND phase = 'running'",
                    org_in(1)
                ))
                .bind(org_list(chunk))
                .fetch_all(&mut *conn)
                .await?;
            for (org, user, project, key, last_at) in running {
                let Some(stretch) = Interval::new(last_at, now.min(last_at + rules.interval))
                else {
                    continue;
                };
                let clip = |window: Interval| stretch.clip(&window).map_or(0, |c| c.len());
                let (m, wk) = (clip(w.month), clip(w.week));
                let usage = out.entry(org).or_default();
                for (dim, member) in [
                    (Dimension::User, user),
                    (Dimension::Project, project),
                    (Dimension::Key, key),
                ] {
                    if let Some(member) = member {
                        let e = usage.entry((dim, member)).or_default();
                        e.0 += m;
                        e.1 += wk;
                    }
                }
            }
        }
    }
    Ok(out)
}

#[async_trait]
impl MemberStore for Backend {
    async fn put_limit(&self, limit: &Limit, now: Secs, actor: &Actor) -> StoreResult<Limit> {
        let mut tx = begin_write(self.write()).await?;
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
            before.as_ref().map(audit::limit_state),
            Some(audit::limit_state(&after)),
        );
        write_audit(&mut tx, entry).await?;
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
                Some(audit::limit_state(l)),
                None,
            );
            write_audit(&mut tx, entry).await?;
        }
        tx.commit().await?;
        Ok(removed)
    }

    async fn list_limits(&self, org_id: &str) -> StoreResult<Vec<Limit>> {
        let mut conn = self.read().acquire().await?;
        Ok(limits_on(&mut conn, &[org_id])
            .await?
            .remove(org_id)
            .unwrap_or_default())
    }

    async fn limits_of(&self, org_ids: &[&str]) -> StoreResult<HashMap<String, Vec<Limit>>> {
        let mut conn = self.read().acquire().await?;
        limits_on(&mut conn, org_ids).await
    }

    async fn member_usage(
        &self,
        orgs: &[&Org],
        now: Secs,
        rules: &Rules,
    ) -> StoreResult<HashMap<String, MemberUsage>> {
        let mut conn = self.read().acquire().await?;
        member_usage_on(&mut conn, orgs, now, rules).await
    }
}
