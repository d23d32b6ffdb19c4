//! The core's types read from rows (the core knows nothing of sqlx): `FromRow` for `Rec<T>`.

use super::*;
use rush_meter_core::auto_topup::AutoTopup;

/// `FromRow` for `Rec<$t>`, each field read from the column of its name.
macro_rules! from_row {
    ($t:ident { $($field:ident),* $(,)? }) => {
        impl<'r> sqlx::FromRow<'r, Row> for Rec<$t> {
            fn from_row(row: &'r Row) -> Result<Self, sqlx::Error> {
                use sqlx::Row as _;
                Ok(Rec($t {
                    $($field: row.try_get(stringify!($field))?,)*
                }))
            }
        }
    };
}

impl<'r> sqlx::FromRow<'r, Row> for Rec<Org> {
    fn from_row(row: &'r Row) -> Result<Self, sqlx::Error> {
        use sqlx::Row as _;
        let cap: Option<String> = row.try_get("overage_cap")?;
        let monthly_cap = match cap {
            Some(text) => text.parse().map_err(|_| sqlx::Error::ColumnDecode {
                index: "overage_cap".into(),
                source: format!("`{text}` is not a decimal").into(),
            })?,
            None => Decimal::ZERO,
        };
        Ok(Rec(Org {
            org_id: row.try_get("org_id")?,
            name: row.try_get("name")?,
            plan_id: row.try_get("plan_id")?,
            plan_version: row.try_get("plan_version")?,
            moving_to_version: row.try_get("moving_to_version")?,
            moving_at: row.try_get("moving_at")?,
            suspended: row.try_get("suspended")?,
            period_start: row.try_get("period_start")?,
            period_end: row.try_get("period_end")?,
            stripe_customer_id: row.try_get("stripe_customer_id")?,
            stripe_subscription_id: row.try_get("stripe_subscription_id")?,
            subscription_status: row.try_get("subscription_status")?,
            created_at: row.try_get("created_at")?,
            updated_at: row.try_get("updated_at")?,
            past_due_since: row.try_get("past_due_since")?,
            cancel_at_period_end: row.try_get("cancel_at_period_end")?,
            scheduled_plan_id: row.try_get("scheduled_plan_id")?,
            scheduled_at: row.try_get("scheduled_at")?,
            scheduled_in_stripe: row.try_get("scheduled_in_stripe")?,
            stripe_synced_at: row.try_get("stripe_synced_at")?,
            stripe_applied_seq: row.try_get("stripe_applied_seq")?,
            overage: Overage {
                enabled: row.try_get("overage_enabled")?,
                monthly_cap,
            },
            sets_limits: row.try_get("sets_limits")?,
            auto_topup: AutoTopup {
                enabled: row.try_get("auto_topup_enabled")?,
                below_seconds: row.try_get("auto_topup_below_seconds")?,
                pack_hours: row.try_get("auto_topup_pack_hours")?,
                monthly_max_packs: row.try_get("auto_topup_max_packs")?,
                opened: row.try_get("auto_topup_opened")?,
                pending: row.try_get("auto_topup_pending")?,
            },
        }))
    }
}

from_row!(Key {
    org_id,
    key_id,
    concurrency_limit,
    created_at,
    updated_at,
});

impl<'r> sqlx::FromRow<'r, Row> for Rec<Decision> {
    fn from_row(row: &'r Row) -> Result<Self, sqlx::Error> {
        use sqlx::Row as _;
        let limit = match named(row, "limit_kind", LimitKind::parse)? {
            Some(kind) => Some(LimitFigures {
                kind,
                member_id: row
                    .try_get::<Option<String>, _>("limit_member")?
                    .unwrap_or_default(),
                month_used: row
                    .try_get::<Option<i64>, _>("limit_month_used")?
                    .unwrap_or(0),
                month_limit: row.try_get("limit_month")?,
                week_used: row
                    .try_get::<Option<i64>, _>("limit_week_used")?
                    .unwrap_or(0),
                week_limit: row.try_get("limit_week")?,
            }),
            None => None,
        };
        Ok(Rec(Decision {
            org_id: row.try_get("org_id")?,
            decision_id: row.try_get("decision_id")?,
            decided_at: row.try_get("decided_at")?,
            session_id: row.try_get("session_id")?,
            key_id: row.try_get("key_id")?,
            decision: required(row, "decision", Verdict::parse)?,
            reason: named(row, "reason", Reason::parse)?,
            rule: required(row, "rule", Rule::parse)?,
            plan_id: row.try_get("plan_id")?,
            plan_version: row.try_get("plan_version")?,
            suspended: row.try_get("suspended")?,
            month_start: row.try_get("month_start")?,
            month_end: row.try_get("month_end")?,
            month_used: row.try_get("month_used")?,
            month_limit: row.try_get("month_limit")?,
            week_start: row.try_get("week_start")?,
            week_end: row.try_get("week_end")?,
            week_used: row.try_get("week_used")?,
            week_limit: row.try_get("week_limit")?,
            running: row.try_get("running")?,
            concurrency_limit: row.try_get("concurrency_limit")?,
            upgrade_plan: row.try_get("upgrade_plan")?,
            funded_by: named(row, "funded_by", Source::parse)?,
            plan_room: row.try_get("plan_room")?,
            grant_room: row.try_get("grant_room")?,
            overage_room: row.try_get("overage_room")?,
            limit,
        }))
    }
}

from_row!(Piece {
    hour,
    session_id,
    project_id,
    started_by,
    agent,
    seconds,
});

/// Export lines come by the million, so they are read by position, in the order both of
/// their statements select them (`frozen_lines_sql`, `live_lines_sql`): a read by name
/// hashes the column's name for every column of every row.
impl<'r> sqlx::FromRow<'r, Row> for Rec<SessionLine> {
    fn from_row(row: &'r Row) -> Result<Self, sqlx::Error> {
        use sqlx::Row as _;
        Ok(Rec(SessionLine {
            org_id: row.try_get(0)?,
            session_id: row.try_get(1)?,
            project_id: row.try_get(2)?,
            started_by: row.try_get(3)?,
            agent: row.try_get(4)?,
            running_seconds: row.try_get(5)?,
            parked_seconds: row.try_get(6)?,
            spans: row.try_get(7)?,
            first_start: row.try_get(8)?,
            last_end: row.try_get(9)?,
            end_status: row.try_get(10)?,
            adjustment_seconds: row.try_get(11)?,
        }))
    }
}

/// A column holding one of an enum's names (or NULL), or the decode error that names
/// the column.
pub(crate) fn named<T>(
    row: &Row,
    column: &str,
    parse: fn(&str) -> Option<T>,
) -> Result<Option<T>, sqlx::Error> {
    use sqlx::Row as _;
    let text: Option<String> = row.try_get(column)?;
    text.map(|t| {
        parse(&t).ok_or_else(|| sqlx::Error::ColumnDecode {
            index: column.to_owned(),
            source: format!("`{t}` is not a value this service writes").into(),
        })
    })
    .transpose()
}

/// A NOT NULL column holding one of an enum's names.
pub(crate) fn required<T>(
    row: &Row,
    column: &str,
    parse: fn(&str) -> Option<T>,
) -> Result<T, sqlx::Error> {
    named(row, column, parse)?.ok_or_else(|| sqlx::Error::ColumnDecode {
        index: column.to_owned(),
        source: "NULL where a value is required".into(),
    })
}

/// A session row's held heartbeats (`held`, `[[seq, at, state], …]`).
pub(crate) fn held(row: &Row) -> Result<Vec<rush_meter_core::ledger::Observation>, sqlx::Error> {
    use sqlx::Row as _;
    let text: Option<String> = row.try_get("held")?;
    let Some(text) = text else {
        return Ok(Vec::new());
    };
    let bad = |why: String| sqlx::Error::ColumnDecode {
        index: "held".into(),
        source: why.into(),
    };
    let rows: Vec<(i64, i64, String)> =
        serde_json::from_str(&text).map_err(|e| bad(format!("{e} in `{text}`")))?;
    rows.into_iter()
        .map(|(seq, at, state)| {
            let state = VmState::parse(&state).ok_or_else(|| bad(format!("state `{state}`")))?;
            Ok(rush_meter_core::ledger::Observation { seq, at, state })
        })
        .collect()
}

/// What a session row keeps of its held heartbeats: the first one's time and all of them
/// (`held`), or nothing.
pub(crate) fn held_columns(
    held: &[rush_meter_core::ledger::Observation],
) -> (Option<i64>, Option<String>) {
    if held.is_empty() {
        return (None, None);
    }
    let rows: Vec<(i64, i64, &str)> = held
        .iter()
        .map(|h| (h.seq, h.at, h.state.as_str()))
        .collect();
    (
        held.first().map(|h| h.at),
        Some(serde_json::to_string(&rows).expect("numbers and names serialize")),
    )
}

impl<'r> sqlx::FromRow<'r, Row> for Rec<Session> {
    fn from_row(row: &'r Row) -> Result<Self, sqlx::Error> {
        use sqlx::Row as _;
        let phase =
            named(row, "phase", Phase::parse)?.ok_or_else(|| sqlx::Error::ColumnDecode {
                index: "phase".into(),
                source: "a session without a phase".into(),
            })?;
        Ok(Rec(Session {
            org_id: row.try_get("org_id")?,
            session_id: row.try_get("session_id")?,
            key_id: row.try_get("key_id")?,
            agent: row.try_get("agent")?,
            project_id: row.try_get("project_id")?,
            started_by: row.try_get("started_by")?,
            vm_id: row.try_get("vm_id")?,
            ledger: SessionLedger {
                phase,
                last_seq: row.try_get("last_seq")?,
                last_at: row.try_get("last_at")?,
                span_start: row.try_get("span_start")?,
                billed_seconds: row.try_get("billed_seconds")?,
                heartbeats: row.try_get("heartbeats")?,
                silences: row.try_get("silences")?,
                ended_at: row.try_get("ended_at")?,
                end_status: named(row, "end_status", EndStatus::parse)?,
                held: held(row)?,
            },
            unadmitted: row.try_get("unadmitted")?,
            created_at: row.try_get("created_at")?,
            heard_at: row.try_get("heard_at")?,
            slot_at: row.try_get("slot_at")?,
        }))
    }
}
