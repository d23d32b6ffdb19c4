//! Orgs, keys and tokens (`OrgStore`), written once for both dialects.

use super::*;

/// A token as the audit log records it (never its secret).
fn token_state(t: &TokenRow) -> serde_json::Value {
    let mut state = rush_meter_core::audit::token_state(
        &t.token_id,
        &t.scopes,
        t.org_id.as_deref(),
        &t.label,
        t.expires_at,
        t.revoked_at,
    );
    // Only on member tokens, so that other tokens read as before.
    if let Some(user) = &t.user_id {
        state["user_id"] = serde_json::json!(user);
    }
    state
}

/// An org's row, locked for the change the transaction makes (its state before, for the
/// audit log); `None` if there is no such org.
pub(crate) async fn org_for_update(tx: &mut Tx, org_id: &str) -> StoreResult<Option<Org>> {
    Ok(
        sqlx::query_as::<_, Rec<Org>>(&format!("SELECT * FROM orgs WHERE org_id = $1{FOR_UPDATE}"))
            .bind(org_id)
            .fetch_optional(&mut **tx)
            .await?
            .map(|r| r.0),
    )
}

async fn select_orgs<'e, E: sqlx::Executor<'e, Database = DB>>(
    ex: E,
    ids: &[&str],
) -> StoreResult<Vec<Org>> {
    D::select_orgs_in(ex, ids).await.map(unwrap_all)
}

/// A `LIKE` pattern (escape `\\`) matching any text that contains `q`. The statement
/// lowercases it with the column, by the database's `LOWER`, so that both sides fold case
/// alike (SQLite folds ASCII letters only).
fn contains_pattern(q: &str) -> String {
    let mut p = String::with_capacity(q.len() + 2);
    p.push('%');
    for c in q.chars() {
        if matches!(c, '%' | '_' | '\\') {
            p.push('\\');
        }
        p.push(c);
    }
    p.push('%');
    p
}

#[async_trait]
impl OrgStore for D {
    async fn upsert_org(&self, org: &OrgUpsert, now: Secs, actor: &Actor) -> StoreResult<Org> {
        let mut tx = begin_write(self.write()).await?;
        let created = sqlx::query_as::<_, Rec<Org>>(
            "INSERT INTO orgs (org_id, name, plan_id, suspended, created_at, updated_at, \
               plan_version) \
             VALUES ($1, COALESCE($2, $1), COALESCE($3, 'free'), COALESCE($4, FALSE), $5, $5, \
               COALESCE($6, 1)) \
             ON CONFLICT (org_id) DO NOTHING RETURNING *",
        )
        .bind(&org.org_id)
        .bind(&org.name)
        .bind(&org.plan_id)
        .bind(org.suspended)
        .bind(now)
        .bind(org.plan_version)
        .fetch_optional(&mut *tx)
        .await?;
        let (before, Rec(after)) = match created {
            Some(row) => (None, row),
            None => {
                // Found by the insert that did nothing; orgs are never deleted.
                let before = org_for_update(&mut tx, &org.org_id)
                    .await?
                    .ok_or(sqlx::Error::RowNotFound)?;
                let after = sqlx::query_as::<_, Rec<Org>>(
                    // Another plan starts at its newest version, and calls off a move
                    // between versions of the old one; the same plan keeps its version.
                    "UPDATE orgs SET name = COALESCE($2, name), plan_id = COALESCE($3, plan_id), \
                       suspended = COALESCE($4, suspended), updated_at = $5, \
                       plan_version = CASE WHEN $3 IS NULL OR $3 = plan_id THEN plan_version \
                         ELSE COALESCE($6, 1) END, \
                       moving_to_version = CASE WHEN $3 IS NULL OR $3 = plan_id \
                         THEN moving_to_version END, \
                       moving_at = CASE WHEN $3 IS NULL OR $3 = plan_id THEN moving_at END \
                     WHERE org_id = $1 RETURNING *",
                )
                .bind(&org.org_id)
                .bind(&org.name)
                .bind(&org.plan_id)
                .bind(org.suspended)
                .bind(now)
                .bind(org.plan_version)
                .fetch_one(&mut *tx)
                .await?;
                (Some(before), after)
            }
        };
        let action = if before.is_none() {
            Action::OrgCreated
        } else {
            Action::OrgUpdated
        };
        let entry = change(
            &after.org_id,
            now,
            actor,
            action,
            after.org_id.clone(),
            before.as_ref().map(rush_meter_core::audit::org_state),
            Some(rush_meter_core::audit::org_state(&after)),
        );
        write_audit(&mut tx, entry).await?;
        tx.commit().await?;
        Ok(after)
    }

    async fn get_org(&self, org_id: &str) -> StoreResult<Option<Org>> {
        Ok(
            sqlx::query_as::<_, Rec<Org>>("SELECT * FROM orgs WHERE org_id = $1")
                .bind(org_id)
                .fetch_optional(self.keyed())
                .await?
                .map(|r| r.0),
        )
    }

    async fn get_orgs(&self, org_ids: &[&str]) -> StoreResult<Vec<Org>> {
        let mut rows = Vec::with_capacity(org_ids.len());
        for chunk in org_ids.chunks(CHUNK) {
            rows.extend(select_orgs(self.read(), chunk).await?);
        }
        Ok(rows)
    }

    async fn list_orgs(&self) -> StoreResult<Vec<Org>> {
        Ok(unwrap_all(
            sqlx::query_as::<_, Rec<Org>>("SELECT * FROM orgs ORDER BY org_id")
                .fetch_all(self.read())
                .await?,
        ))
    }

    async fn search_orgs(
        &self,
        q: &str,
        after: Option<&str>,
        limit: i64,
        only: Option<&str>,
    ) -> StoreResult<Vec<String>> {
        // Named only when it is one org, so that Citus routes the search to its shard.
        let one = if only.is_some() {
            " AND org_id = $4"
        } else {
            ""
        };
        let sql = format!(
            "SELECT org_id FROM orgs \
             WHERE (LOWER(org_id) LIKE LOWER($1) ESCAPE '\\' OR LOWER(name) LIKE LOWER($1) ESCAPE '\\') \
               AND ($2 IS NULL OR org_id{BYTE_ORDER} > $2){one} \
             ORDER BY org_id{BYTE_ORDER} LIMIT $3"
        );
        let query = sqlx::query_scalar(&sql)
            .bind(contains_pattern(q))
            .bind(after)
            .bind(limit);
        let query = match only {
            Some(org) => query.bind(org),
            None => query,
        };
        Ok(query.fetch_all(self.read()).await?)
    }

    async fn orgs_before(&self, end: Secs) -> StoreResult<Vec<Org>> {
        Ok(unwrap_all(
            sqlx::query_as::<_, Rec<Org>>(&format!(
                "SELECT * FROM orgs WHERE created_at < $1 ORDER BY org_id{BYTE_ORDER}"
            ))
            .bind(end)
            .fetch_all(self.read())
            .await?,
        ))
    }

    async fn first_org_created(&self) -> StoreResult<Option<Secs>> {
        Ok(sqlx::query_scalar("SELECT MIN(created_at) FROM orgs")
            .fetch_one(self.read())
            .await?)
    }

    async fn upsert_key(
        &self,
        org_id: &str,
        key_id: &str,
        limit: Option<i64>,
        now: Secs,
        actor: &Actor,
    ) -> StoreResult<Key> {
        let mut tx = begin_write(self.write()).await?;
        let created = sqlx::query_as::<_, Rec<Key>>(
            "INSERT INTO api_keys (org_id, key_id, concurrency_limit, created_at, updated_at) \
             VALUES ($1, $2, $3, $4, $4) ON CONFLICT (org_id, key_id) DO NOTHING RETURNING *",
        )
        .bind(org_id)
        .bind(key_id)
        .bind(limit)
        .bind(now)
        .fetch_optional(&mut *tx)
        .await?;
        let (before, Rec(after)) = match created {
            Some(row) => (None, row),
            None => {
                let Rec(before) = sqlx::query_as::<_, Rec<Key>>(&format!(
                    "SELECT * FROM api_keys WHERE org_id = $1 AND key_id = $2{FOR_UPDATE}"
                ))
                .bind(org_id)
                .bind(key_id)
                .fetch_one(&mut *tx)
                .await?;
                let after = sqlx::query_as::<_, Rec<Key>>(
                    "UPDATE api_keys SET concurrency_limit = $3, updated_at = $4 \
                     WHERE org_id = $1 AND key_id = $2 RETURNING *",
                )
                .bind(org_id)
                .bind(key_id)
                .bind(limit)
                .bind(now)
                .fetch_one(&mut *tx)
                .await?;
                (Some(before), after)
            }
        };
        let action = if before.is_none() {
            Action::KeyCreated
        } else {
            Action::KeyUpdated
        };
        let entry = change(
            org_id,
            now,
            actor,
            action,
            format!("key:{key_id}"),
            before.as_ref().map(rush_meter_core::audit::key_state),
            Some(rush_meter_core::audit::key_state(&after)),
        );
        write_audit(&mut tx, entry).await?;
        tx.commit().await?;
        Ok(after)
    }

    async fn get_key(&self, org_id: &str, key_id: &str) -> StoreResult<Option<Key>> {
        Ok(sqlx::query_as::<_, Rec<Key>>(
            "SELECT * FROM api_keys WHERE org_id = $1 AND key_id = $2",
        )
        .bind(org_id)
        .bind(key_id)
        .fetch_optional(self.read())
        .await?
        .map(|r| r.0))
    }

    async fn insert_token(&self, t: &TokenRow, actor: &Actor) -> StoreResult<()> {
        let mut tx = begin_write(self.write()).await?;
        let before: Option<TokenRow> = sqlx::query_as(&format!(
            "SELECT * FROM tokens WHERE secret_hash = $1{FOR_UPDATE}"
        ))
        .bind(&t.secret_hash)
        .fetch_optional(&mut *tx)
        .await?;
        // A revoked secret stays revoked: the bootstrap token's row is updated in place.
        let after: TokenRow = sqlx::query_as(
            "INSERT INTO tokens (token_id, secret_hash, scopes, org_id, label, created_at, \
               expires_at, user_id) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
             ON CONFLICT (secret_hash) DO UPDATE SET scopes = $3, org_id = $4, label = $5, \
               expires_at = $7, user_id = $8 \
             RETURNING *",
        )
        .bind(&t.token_id)
        .bind(&t.secret_hash)
        .bind(&t.scopes)
        .bind(&t.org_id)
        .bind(&t.label)
        .bind(t.created_at)
        .bind(t.expires_at)
        .bind(&t.user_id)
        .fetch_one(&mut *tx)
        .await?;
        let entry = change(
            after.org_id.as_deref().unwrap_or(""),
            t.created_at,
            actor,
            Action::TokenCreated,
            format!("token:{}", after.token_id),
            before.as_ref().map(token_state),
            Some(token_state(&after)),
        );
        write_audit(&mut tx, entry).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn list_tokens(&self, org_id: Option<&str>) -> StoreResult<Vec<TokenRow>> {
        let sql = match org_id {
            Some(_) => "SELECT * FROM tokens WHERE org_id = $1 ORDER BY created_at, token_id",
            None => "SELECT * FROM tokens ORDER BY created_at, token_id",
        };
        let query = sqlx::query_as::<_, TokenRow>(sql);
        let query = match org_id {
            Some(org) => query.bind(org),
            None => query,
        };
        Ok(query.fetch_all(self.read()).await?)
    }

    async fn revoke_token(
        &self,
        token_id: &str,
        within: Option<&str>,
        now: Secs,
        actor: &Actor,
    ) -> StoreResult<Option<TokenRow>> {
        let mut tx = begin_write(self.write()).await?;
        let before: Option<TokenRow> = sqlx::query_as(&format!(
            "SELECT * FROM tokens WHERE token_id = $1{FOR_UPDATE}"
        ))
        .bind(token_id)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(before) = before.filter(|t| within.is_none_or(|o| t.org_id.as_deref() == Some(o)))
        else {
            return Ok(None);
        };
        if before.revoked_at.is_some() {
            return Ok(Some(before));
        }
        let after: TokenRow =
            sqlx::query_as("UPDATE tokens SET revoked_at = $2 WHERE token_id = $1 RETURNING *")
                .bind(token_id)
                .bind(now)
                .fetch_one(&mut *tx)
                .await?;
        let entry = change(
            after.org_id.as_deref().unwrap_or(""),
            now,
            actor,
            Action::TokenRevoked,
            format!("token:{}", after.token_id),
            Some(token_state(&before)),
            Some(token_state(&after)),
        );
        write_audit(&mut tx, entry).await?;
        tx.commit().await?;
        Ok(Some(after))
    }

    async fn touch_tokens(&self, used: &[(String, Secs)]) -> StoreResult<()> {
        if used.is_empty() {
            return Ok(());
        }
        let mut tx = begin_write(self.write()).await?;
        for (token_id, at) in used {
            sqlx::query(&format!(
                "UPDATE tokens SET last_used_at = {GREATEST}(COALESCE(last_used_at, 0), $2) \
                 WHERE token_id = $1"
            ))
            .bind(token_id)
            .bind(at)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn token_by_hash(&self, hash: &str) -> StoreResult<Option<TokenRow>> {
        Ok(
            sqlx::query_as::<_, TokenRow>("SELECT * FROM tokens WHERE secret_hash = $1")
                .bind(hash)
                .fetch_optional(self.read())
                .await?,
        )
    }
}
