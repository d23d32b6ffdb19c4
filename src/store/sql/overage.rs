//! Pay-as-you-go charges (`OverageStore`), written once for both dialects: a month
//! window that ended with overage is closed under its org's lock and recorded as a
//! charge (`pending`), which billing then sends to Stripe and records as it went.

use super::*;

/// A charge as the audit log names it: its window's start.
fn charge_subject(window_start: Secs) -> String {
    format!(
        "overage_charge:{}",
        rush_meter_core::time::format_rfc3339(window_start)
    )
}

#[async_trait]
impl OverageStore for D {
    async fn due_overage_windows(
        &self,
        before: Secs,
        limit: i64,
    ) -> StoreResult<Vec<(String, Interval)>> {
        let rows: Vec<(String, Secs, Secs)> = sqlx::query_as(
            "SELECT w.org_id, w.window_start, w.window_end FROM funding_windows w \
             WHERE w.kind = 'month' AND w.overage_seconds > 0 AND w.window_end <= $1 \
               AND NOT EXISTS (SELECT 1 FROM overage_charges c \
                 WHERE c.org_id = w.org_id AND c.window_start = w.window_start) \
             ORDER BY w.window_end LIMIT $2",
        )
        .bind(before)
        .bind(limit)
        .fetch_all(self.read())
        .await?;
        Ok(rows
            .into_iter()
            .filter_map(|(org, s, e)| Interval::new(s, e).map(|w| (org, w)))
            .collect())
    }

    async fn close_overage_window(
        &self,
        org_id: &str,
        window_start: Secs,
        currency: &str,
        now: Secs,
    ) -> StoreResult<Option<OverageChargeRow>> {
        let mut tx = begin_write(self.write()).await?;
        if !lock_org(&mut tx, org_id).await? {
            return Ok(None);
        }
        let get = "SELECT * FROM overage_charges WHERE org_id = $1 AND window_start = $2";
        if let Some(row) = sqlx::query_as::<_, OverageChargeRow>(get)
            .bind(org_id)
            .bind(window_start)
            .fetch_optional(&mut *tx)
            .await?
        {
            return Ok(Some(row));
        }
        let window: Option<(Secs, i64, i64)> = sqlx::query_as(
            "SELECT window_end, overage_seconds, charge_units FROM funding_windows \
             WHERE org_id = $1 AND kind = 'month' AND window_start = $2",
        )
        .bind(org_id)
        .bind(window_start)
        .fetch_optional(&mut *tx)
        .await?;
        let Some((window_end, seconds, units)) = window else {
            return Ok(None);
        };
        let row = sqlx::query_as::<_, OverageChargeRow>(
            "INSERT INTO overage_charges (org_id, window_start, window_end, overage_seconds, \
               charge_units, amount, currency, state, created_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, 'pending', $8) RETURNING *",
        )
        .bind(org_id)
        .bind(window_start)
        .bind(window_end)
        .bind(seconds)
        .bind(units)
        .bind(format!("{:.2}", rush_meter_core::funding::amount(units)))
        .bind(currency)
        .bind(now)
        .fetch_one(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(Some(row))
    }

    async fn finish_overage_charge(
        &self,
        org_id: &str,
        window_start: Secs,
        state: &str,
        invoice_id: Option<&str>,
        item_id: Option<&str>,
        now: Secs,
    ) -> StoreResult<()> {
        sqlx::query(
            "UPDATE overage_charges SET state = $3, stripe_invoice_id = $4, \
               stripe_invoice_item_id = $5, charged_at = $6 \
             WHERE org_id = $1 AND window_start = $2",
        )
        .bind(org_id)
        .bind(window_start)
        .bind(state)
        .bind(invoice_id)
        .bind(item_id)
        .bind(now)
        .execute(self.write())
        .await?;
        Ok(())
    }

    async fn pending_overage_charges(
        &self,
        now: Secs,
        org_id: Option<&str>,
        limit: i64,
    ) -> StoreResult<Vec<OverageChargeRow>> {
        Ok(sqlx::query_as::<_, OverageChargeRow>(
            "SELECT * FROM overage_charges WHERE state = 'pending' \
               AND (next_attempt_at <= $1 OR org_id = $2) \
             ORDER BY CASE WHEN org_id = $2 THEN 0 ELSE 1 END, next_attempt_at, created_at \
             LIMIT $3",
        )
        .bind(now)
        .bind(org_id)
        .bind(limit)
        .fetch_all(self.read())
        .await?)
    }

    async fn retry_overage_charge(
        &self,
        org_id: &str,
        window_start: Secs,
        error: &str,
        next_at: Secs,
        failed: bool,
        now: Secs,
        actor: &Actor,
    ) -> StoreResult<Option<OverageChargeRow>> {
        let mut tx = begin_write(self.write()).await?;
        let row = sqlx::query_as::<_, OverageChargeRow>(
            "UPDATE overage_charges SET attempts = attempts + 1, next_attempt_at = $3, \
               last_error = $4, state = CASE WHEN $5 THEN 'failed' ELSE state END \
             WHERE org_id = $1 AND window_start = $2 AND state = 'pending' RETURNING *",
        )
        .bind(org_id)
        .bind(window_start)
        .bind(next_at)
        .bind(error)
        .bind(failed)
        .fetch_optional(&mut *tx)
        .await?;
        if let Some(r) = row.as_ref().filter(|r| r.state == "failed") {
            let entry = change(
                org_id,
                now,
                actor,
                Action::OverageChargeFailed,
                charge_subject(window_start),
                Some(rush_meter_core::audit::charge_state(
                    "pending",
                    r.attempts - 1,
                    None,
                )),
                Some(rush_meter_core::audit::charge_state(
                    &r.state,
                    r.attempts,
                    r.last_error.as_deref(),
                )),
            );
            write_audit(&mut tx, entry).await?;
        }
        tx.commit().await?;
        Ok(row)
    }

    async fn requeue_overage_charges(
        &self,
        org_id: &str,
        now: Secs,
        actor: &Actor,
    ) -> StoreResult<u64> {
        let mut tx = begin_write(self.write()).await?;
        if !lock_org(&mut tx, org_id).await? {
            return Ok(0);
        }
        let rows = sqlx::query_as::<_, OverageChargeRow>(
            "SELECT * FROM overage_charges WHERE org_id = $1 AND state = 'failed'",
        )
        .bind(org_id)
        .fetch_all(&mut *tx)
        .await?;
        sqlx::query(
            "UPDATE overage_charges SET state = 'pending', attempts = 0, next_attempt_at = $2 \
             WHERE org_id = $1 AND state = 'failed'",
        )
        .bind(org_id)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        for r in &rows {
            let entry = change(
                org_id,
                now,
                actor,
                Action::OverageChargeRequeued,
                charge_subject(r.window_start),
                Some(rush_meter_core::audit::charge_state(
                    "failed",
                    r.attempts,
                    r.last_error.as_deref(),
                )),
                Some(rush_meter_core::audit::charge_state(
                    "pending",
                    0,
                    r.last_error.as_deref(),
                )),
            );
            write_audit(&mut tx, entry).await?;
        }
        tx.commit().await?;
        Ok(rows.len() as u64)
    }

    async fn overage_charges(&self, org_id: &str) -> StoreResult<Vec<OverageChargeRow>> {
        Ok(sqlx::query_as::<_, OverageChargeRow>(
            "SELECT * FROM overage_charges WHERE org_id = $1 ORDER BY window_start DESC",
        )
        .bind(org_id)
        .fetch_all(self.read())
        .await?)
    }
}
