//! The audit log (`AuditStore`), written once for both dialects: entries are inserted by
//! the store's changing methods, in their transactions (`write_audit`), and only read here.

use super::*;

impl<'r> sqlx::FromRow<'r, Row> for Rec<Entry> {
    fn from_row(row: &'r Row) -> Result<Self, sqlx::Error> {
        use sqlx::Row as _;
        let json = |column: &str| -> Result<Option<serde_json::Value>, sqlx::Error> {
            let text: Option<String> = row.try_get(column)?;
            text.map(|t| serde_json::from_str(&t).map_err(|e| decode_error(column, e.to_string())))
                .transpose()
        };
        Ok(Rec(Entry {
            org_id: row.try_get("org_id")?,
            entry_id: row.try_get("entry_id")?,
            at: row.try_get("at")?,
            actor: Actor {
                kind: named(row, "actor_kind", ActorKind::parse)?
                    .ok_or_else(|| decode_error("actor_kind", "an entry without an actor"))?,
                id: row.try_get("actor_id")?,
                label: row.try_get("actor_label")?,
            },
            action: named(row, "action", Action::parse)?
                .ok_or_else(|| decode_error("action", "an entry without an action"))?,
            subject: row.try_get("subject")?,
            before: json("before")?,
            after: json("after")?,
        }))
    }
}

/// Record `entries` in the transaction of their changes.
pub(crate) async fn write_audit(
    tx: &mut Tx,
    entries: impl IntoIterator<Item = Entry>,
) -> StoreResult<()> {
    for e in entries {
        sqlx::query(
            "INSERT INTO audit_log (org_id, at, entry_id, actor_kind, actor_id, actor_label, \
               action, subject, before, after) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
        )
        .bind(&e.org_id)
        .bind(e.at)
        .bind(&e.entry_id)
        .bind(e.actor.kind.as_str())
        .bind(&e.actor.id)
        .bind(&e.actor.label)
        .bind(e.action.as_str())
        .bind(&e.subject)
        .bind(e.before.as_ref().map(|v| v.to_string()))
        .bind(e.after.as_ref().map(|v| v.to_string()))
        .execute(&mut **tx)
        .await?;
    }
    Ok(())
}

/// The entry of a change (none when nothing changed), with a fresh id.
pub(crate) fn change(
    org_id: &str,
    at: Secs,
    actor: &Actor,
    action: Action,
    subject: String,
    before: Option<serde_json::Value>,
    after: Option<serde_json::Value>,
) -> Option<Entry> {
    Entry::of_change(
        org_id,
        crate::ids::audit(),
        at,
        actor,
        action,
        subject,
        before,
        after,
    )
}

#[async_trait]
impl AuditStore for D {
    async fn list_audit(
        &self,
        org_id: &str,
        from: Secs,
        to: Secs,
        after: Option<(Secs, String)>,
        limit: i64,
    ) -> StoreResult<Vec<Entry>> {
        let (after_at, after_id) = after.unwrap_or((i64::MIN, String::new()));
        Ok(unwrap_all(
            sqlx::query_as::<_, Rec<Entry>>(
                "SELECT * FROM audit_log WHERE org_id = $1 AND at >= $2 AND at < $3 \
                   AND (at > $4 OR (at = $4 AND entry_id > $5)) \
                 ORDER BY at, entry_id LIMIT $6",
            )
            .bind(org_id)
            .bind(from)
            .bind(to)
            .bind(after_at)
            .bind(after_id)
            .bind(limit)
            .fetch_all(self.read())
            .await?,
        ))
    }
}
