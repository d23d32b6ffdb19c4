//! Auto top-up (`AutoTopupStore`), written once for both dialects. Every statement names
//! its org, so each is one shard on Citus; the scan of due packs is the exception, a read.

use super::notifications::INSERT_NOTIFICATION;
use super::*;
use rush_meter_core::audit::auto_topup_state;
use rush_meter_core::auto_topup::{AfterDecline, Settings};

/// The notification kind (`window_kind`) of `auto_topup.failed`: one per declined charge
/// (its pack is the window start, its attempt the threshold).
const AUTO_TOPUP_FAILED: &str = "auto_topup_failed";

/// Turn an org's auto top-up off after its pack ended unpaid, audited; the org is free to
/// open a pack again once it is turned back on.
async fn end_pack(tx: &mut Tx, org_id: &str, now: Secs, actor: &Actor) -> StoreResult<()> {
    let Some(before) = org_for_update(tx, org_id).await? else {
        return Ok(());
    };
    let Rec(after) = sqlx::query_as::<_, Rec<Org>>(
        "UPDATE orgs SET auto_topup_pending = $2, auto_topup_enabled = $2, updated_at = $3 \
         WHERE org_id = $1 RETURNING *",
    )
    .bind(org_id)
    .bind(false)
    .bind(now)
    .fetch_one(&mut **tx)
    .await?;
    if before.auto_topup.enabled != after.auto_topup.enabled {
        let entry = change(
            org_id,
            now,
            actor,
            Action::AutoTopupUpdated,
            "auto_topup".to_owned(),
            Some(auto_topup_state(&before.auto_topup)),
            Some(auto_topup_state(&after.auto_topup)),
        );
        write_audit(tx, entry).await?;
    }
    Ok(())
}

/// The org's pack in flight is over (paid, or called off): it may open another.
async fn clear_pending(tx: &mut Tx, org_id: &str) -> StoreResult<()> {
    sqlx::query("UPDATE orgs SET auto_topup_pending = $2 WHERE org_id = $1")
        .bind(org_id)
        .bind(false)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

#[async_trait]
impl AutoTopupStore for D {
    async fn set_auto_topup(
        &self,
        org_id: &str,
        s: &Settings,
        now: Secs,
        actor: &Actor,
    ) -> StoreResult<Option<Org>> {
        let mut tx = begin_write(self.write()).await?;
        let Some(before) = org_for_update(&mut tx, org_id).await? else {
            return Ok(None);
        };
        let Rec(after) = sqlx::query_as::<_, Rec<Org>>(
            "UPDATE orgs SET auto_topup_enabled = $2, auto_topup_below_seconds = $3, \
               auto_topup_pack_hours = $4, auto_topup_max_packs = $5, updated_at = $6 \
             WHERE org_id = $1 RETURNING *",
        )
        .bind(org_id)
        .bind(s.enabled)
        .bind(s.below_seconds)
        .bind(s.pack_hours)
        .bind(s.monthly_max_packs)
        .bind(now)
        .fetch_one(&mut *tx)
        .await?;
        let entry = change(
            org_id,
            now,
            actor,
            Action::AutoTopupUpdated,
            "auto_topup".to_owned(),
            Some(auto_topup_state(&before.auto_topup)),
            Some(auto_topup_state(&after.auto_topup)),
        );
        write_audit(&mut tx, entry).await?;
        tx.commit().await?;
        Ok(Some(after))
    }

    async fn open_auto_topup(
        &self,
        org_id: &str,
        seen: i64,
        pack: &NewPack,
        now: Secs,
    ) -> StoreResult<Option<AutoTopupRow>> {
        let mut tx = begin_write(self.write()).await?;
        // One guarded update: of every reader that saw this crossing, the first opens the
        // pack; the rest find it pending, or more packs opened than they saw.
        let opened: Option<i64> = sqlx::query_scalar(
            "UPDATE orgs SET auto_topup_opened = auto_topup_opened + 1, auto_topup_pending = $5 \
             WHERE org_id = $1 AND auto_topup_enabled = $5 AND auto_topup_pending = $6 \
               AND auto_topup_opened = $2 AND auto_topup_pack_hours = $3 \
               AND (SELECT COUNT(*) FROM auto_topups a WHERE a.org_id = $1 \
                      AND a.month_start = $4 AND a.status IN ('charging', 'paid')) \
                   < auto_topup_max_packs \
             RETURNING auto_topup_opened",
        )
        .bind(org_id)
        .bind(seen)
        .bind(pack.hours)
        .bind(pack.month_start)
        .bind(true)
        .bind(false)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(seq) = opened else {
            return Ok(None);
        };
        let key = rush_meter_core::auto_topup::charge_key(org_id, seq, 1);
        let row = sqlx::query_as::<_, AutoTopupRow>(
            "INSERT INTO auto_topups (org_id, seq, hours, amount, currency, month_start, status, \
               attempts, next_attempt_at, idempotency_key, created_at, updated_at) \
             VALUES ($1, $2, $3, $4, $5, $6, 'charging', 0, $7, $8, $9, $9) RETURNING *",
        )
        .bind(org_id)
        .bind(seq)
        .bind(pack.hours)
        .bind(&pack.amount)
        .bind(&pack.currency)
        .bind(pack.month_start)
        .bind(pack.hold_until)
        .bind(&key)
        .bind(now)
        .fetch_one(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(Some(row))
    }

    async fn auto_topup(&self, org_id: &str, seq: i64) -> StoreResult<Option<AutoTopupRow>> {
        Ok(
            sqlx::query_as("SELECT * FROM auto_topups WHERE org_id = $1 AND seq = $2")
                .bind(org_id)
                .bind(seq)
                .fetch_optional(self.keyed())
                .await?,
        )
    }

    async fn auto_topups_of(&self, org_id: &str, limit: i64) -> StoreResult<Vec<AutoTopupRow>> {
        Ok(
            sqlx::query_as(
                "SELECT * FROM auto_topups WHERE org_id = $1 ORDER BY seq DESC LIMIT $2",
            )
            .bind(org_id)
            .bind(limit)
            .fetch_all(self.keyed())
            .await?,
        )
    }

    async fn due_auto_topups(&self, now: Secs, limit: i64) -> StoreResult<Vec<AutoTopupRow>> {
        Ok(sqlx::query_as(&format!(
            "SELECT * FROM auto_topups WHERE status = 'charging' AND next_attempt_at <= $1 \
             ORDER BY next_attempt_at, org_id{BYTE_ORDER}, seq LIMIT $2"
        ))
        .bind(now)
        .bind(limit)
        .fetch_all(self.read())
        .await?)
    }

    async fn take_auto_topup(
        &self,
        org_id: &str,
        seq: i64,
        seen_next_at: Secs,
        until: Secs,
        now: Secs,
    ) -> StoreResult<Option<AutoTopupRow>> {
        Ok(sqlx::query_as(
            "UPDATE auto_topups SET next_attempt_at = $4, updated_at = $5 \
             WHERE org_id = $1 AND seq = $2 AND status = 'charging' AND next_attempt_at = $3 \
             RETURNING *",
        )
        .bind(org_id)
        .bind(seq)
        .bind(seen_next_at)
        .bind(until)
        .bind(now)
        .fetch_optional(self.write())
        .await?)
    }

    async fn rekey_auto_topup(
        &self,
        org_id: &str,
        seq: i64,
        key: &str,
        payment_intent: Option<&str>,
    ) -> StoreResult<()> {
        sqlx::query(
            "UPDATE auto_topups SET idempotency_key = $3, \
               payment_intent_id = COALESCE($4, payment_intent_id) \
             WHERE org_id = $1 AND seq = $2 AND status = 'charging'",
        )
        .bind(org_id)
        .bind(seq)
        .bind(key)
        .bind(payment_intent)
        .execute(self.write())
        .await?;
        Ok(())
    }

    async fn pay_auto_topup(
        &self,
        org_id: &str,
        seq: i64,
        payment_intent_id: &str,
        grant: &Grant,
        actor: &Actor,
    ) -> StoreResult<Option<(Grant, bool)>> {
        let mut tx = begin_write(self.write()).await?;
        // The org's lock first, as every booking takes it: the grant and the end of the
        // pack are seen together by the next booking and the next standing.
        if !lock_org(&mut tx, org_id).await? {
            return Ok(None);
        }
        let was: Option<String> = sqlx::query_scalar(&format!(
            "SELECT status FROM auto_topups WHERE org_id = $1 AND seq = $2{FOR_UPDATE}"
        ))
        .bind(org_id)
        .bind(seq)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(was) = was else {
            return Ok(None);
        };
        // Money received is hours granted, whatever the pack was last recorded as.
        let (made, created) = insert_grant(&mut tx, grant, actor).await?;
        sqlx::query(
            "UPDATE auto_topups SET status = 'paid', payment_intent_id = $3, grant_id = $4, \
               last_error = NULL, updated_at = $5 WHERE org_id = $1 AND seq = $2",
        )
        .bind(org_id)
        .bind(seq)
        .bind(payment_intent_id)
        .bind(&made.grant_id)
        .bind(grant.created_at)
        .execute(&mut *tx)
        .await?;
        if was == "charging" {
            clear_pending(&mut tx, org_id).await?;
        }
        tx.commit().await?;
        Ok(Some((made, created)))
    }

    async fn cancel_auto_topup(
        &self,
        org_id: &str,
        seq: i64,
        attempts: i64,
        why: &str,
        now: Secs,
    ) -> StoreResult<bool> {
        let mut tx = begin_write(self.write()).await?;
        if !lock_org(&mut tx, org_id).await? {
            return Ok(false);
        }
        let ended = sqlx::query(
            "UPDATE auto_topups SET status = 'canceled', last_error = $4, updated_at = $5 \
             WHERE org_id = $1 AND seq = $2 AND status = 'charging' AND attempts = $3",
        )
        .bind(org_id)
        .bind(seq)
        .bind(attempts)
        .bind(why)
        .bind(now)
        .execute(&mut *tx)
        .await?
        .rows_affected()
            == 1;
        if ended {
            clear_pending(&mut tx, org_id).await?;
        }
        tx.commit().await?;
        Ok(ended)
    }

    async fn decline_auto_topup(
        &self,
        org_id: &str,
        seq: i64,
        d: &DeclineRecord,
        now: Secs,
        actor: &Actor,
    ) -> StoreResult<bool> {
        let (status, next_at) = match d.next {
            AfterDecline::RetryAt(t) => ("charging", t),
            AfterDecline::GiveUp => ("failed", now),
            AfterDecline::NeedsCustomer => ("needs_customer", now),
        };
        let mut tx = begin_write(self.write()).await?;
        if !lock_org(&mut tx, org_id).await? {
            return Ok(false);
        }
        let recorded = sqlx::query(
            "UPDATE auto_topups SET attempts = $3, status = $4, next_attempt_at = $5, \
               idempotency_key = CASE WHEN $4 = 'charging' THEN $6 ELSE idempotency_key END, \
               payment_intent_id = CASE WHEN $4 = 'charging' THEN NULL ELSE $7 END, \
               last_error = $8, updated_at = $9 \
             WHERE org_id = $1 AND seq = $2 AND status = 'charging' AND attempts = $3 - 1",
        )
        .bind(org_id)
        .bind(seq)
        .bind(d.attempt)
        .bind(status)
        .bind(next_at)
        .bind(&d.next_key)
        .bind(&d.payment_intent_id)
        .bind(&d.error)
        .bind(now)
        .execute(&mut *tx)
        .await?
        .rows_affected()
            == 1;
        if !recorded {
            return Ok(false);
        }
        if status != "charging" {
            end_pack(&mut tx, org_id, now, actor).await?;
        }
        let (id, body) = &d.notification;
        sqlx::query(INSERT_NOTIFICATION)
            .bind(org_id)
            .bind(AUTO_TOPUP_FAILED)
            .bind(seq)
            .bind(d.attempt)
            .bind(id)
            .bind(body)
            .bind(now)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(true)
    }
}
