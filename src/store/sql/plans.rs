//! Plan versions (`PlanStore`): the terms each was first seen with, and the moves of orgs
//! between versions of their plan.

use super::*;

/// The version of its plan an org is on at `$n`, in SQL (`Org::plan_version_at`).
fn version_at(n: usize) -> String {
    format!(
        "CASE WHEN moving_to_version IS NOT NULL AND moving_at <= ${n} \
           THEN moving_to_version ELSE plan_version END"
    )
}

#[async_trait]
impl PlanStore for D {
    async fn record_plan_versions(
        &self,
        seen: &[RecordedVersion],
    ) -> StoreResult<Vec<RecordedVersion>> {
        let mut tx = begin_write(self.write()).await?;
        for v in seen {
            sqlx::query(
                "INSERT INTO plan_versions (plan_id, version, terms, file, recorded_at) \
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT (plan_id, version) DO NOTHING",
            )
            .bind(&v.plan_id)
            .bind(v.version)
            .bind(&v.terms)
            .bind(&v.file)
            .bind(v.recorded_at)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(sqlx::query_as::<_, RecordedVersion>(
            "SELECT plan_id, version, terms, file, recorded_at FROM plan_versions \
             ORDER BY plan_id, version",
        )
        .fetch_all(self.read())
        .await?)
    }

    async fn orgs_by_version(&self, now: Secs) -> StoreResult<Vec<(String, i64, i64)>> {
        // Two statements, not a UNION: each is one pass of every shard on Citus. A move
        // whose time has come is the version the org is on, written back or not.
        let on: Vec<(String, i64, i64)> = sqlx::query_as(&format!(
            "SELECT plan_id, {v} AS v, COUNT(*) FROM orgs GROUP BY plan_id, {v}",
            v = version_at(1)
        ))
        .bind(now)
        .fetch_all(self.read())
        .await?;
        let moving: Vec<(String, i64, i64)> = sqlx::query_as(
            "SELECT plan_id, moving_to_version, COUNT(*) FROM orgs \
             WHERE moving_to_version IS NOT NULL AND moving_at > $1 \
             GROUP BY plan_id, moving_to_version",
        )
        .bind(now)
        .fetch_all(self.read())
        .await?;
        let mut counts: BTreeMap<(String, i64), i64> = BTreeMap::new();
        for (plan, version, n) in on.into_iter().chain(moving) {
            *counts.entry((plan, version)).or_default() += n;
        }
        Ok(counts.into_iter().map(|((p, v), n)| (p, v, n)).collect())
    }

    async fn orgs_on_version(
        &self,
        plan_id: &str,
        version: i64,
        now: Secs,
    ) -> StoreResult<Vec<Org>> {
        Ok(unwrap_all(
            sqlx::query_as::<_, Rec<Org>>(&format!(
                "SELECT * FROM orgs WHERE plan_id = $1 AND {} = $2 ORDER BY org_id{BYTE_ORDER}",
                version_at(3)
            ))
            .bind(plan_id)
            .bind(version)
            .bind(now)
            .fetch_all(self.read())
            .await?,
        ))
    }

    async fn move_version(
        &self,
        org_id: &str,
        m: VersionMove<'_>,
        now: Secs,
        actor: &Actor,
    ) -> StoreResult<Option<Org>> {
        let mut tx = begin_write(self.write()).await?;
        let Some(before) = org_for_update(&mut tx, org_id).await? else {
            return Ok(None);
        };
        let on = before.plan_version_at(now);
        if before.plan_id != m.plan_id || on != m.from {
            return Ok(None);
        }
        // A move due now is the version; one due later waits beside it (and a move to the
        // version it is on calls a waiting one off).
        let (version, moving) = match m.to {
            to if to == on => (on, None),
            to if m.at <= now => (to, None),
            to => (on, Some((to, m.at))),
        };
        let Rec(after) = sqlx::query_as::<_, Rec<Org>>(
            "UPDATE orgs SET plan_version = $2, moving_to_version = $3, moving_at = $4, \
               updated_at = $5 WHERE org_id = $1 RETURNING *",
        )
        .bind(org_id)
        .bind(version)
        .bind(moving.map(|(v, _)| v))
        .bind(moving.map(|(_, at)| at))
        .bind(now)
        .fetch_one(&mut *tx)
        .await?;
        let entry = change(
            org_id,
            now,
            actor,
            Action::PlanVersionMoved,
            "plan_version".to_owned(),
            Some(rush_meter_core::audit::version_state(&before)),
            Some(rush_meter_core::audit::version_state(&after)),
        );
        write_audit(&mut tx, entry).await?;
        tx.commit().await?;
        Ok(Some(after))
    }
}
