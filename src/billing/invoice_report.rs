//! The ledger against Stripe's invoices for a closed month: for each org, the agent time
//! the ledger booked, what its plan says it owes, and what Stripe invoiced, with the
//! difference (`rush-meter stripe invoice-report --period YYYY-MM`).

use rust_decimal::Decimal;

use rush_meter_core::time::{calendar_month, hours, Interval, Secs};

use super::api::Readable;
use super::{Billing, BillingResult};

/// One org's line of the report. Amounts are in the plan's currency units (dollars).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Line {
    pub org_id: String,
    pub plan: String,
    pub stripe_customer_id: Option<String>,
    pub agent_seconds: i64,
    pub agent_hours: String,
    /// The price of the org's plan (as it stands now) when it pays through Stripe; 0
    /// otherwise. A plan change within the month shows as a difference.
    pub ledger_owes: Decimal,
    pub stripe_invoiced: Decimal,
    pub invoices: usize,
    /// `stripe_invoiced - ledger_owes`.
    pub difference: Decimal,
    /// Of `ledger_owes`: pay-as-you-go of the billing windows that start in the month.
    pub overage_owed: Decimal,
    /// Of `stripe_invoiced`: the pay-as-you-go items Stripe holds for those windows.
    pub overage_invoiced: Decimal,
    /// Invoices of the org Stripe listed but this could not read (`id: why`), left out of
    /// `stripe_invoiced`: look at them in Stripe before trusting the difference.
    pub unreadable: Vec<String>,
}

/// `YYYY-MM` as its calendar month; the month must have ended by `now`.
pub fn parse_period(period: &str, now: Secs) -> Result<Interval, String> {
    let date = chrono::NaiveDate::parse_from_str(&format!("{period}-01"), "%Y-%m-%d")
        .map_err(|_| format!("--period: `{period}` is not a month such as 2026-11"))?;
    let start = date
        .and_hms_opt(0, 0, 0)
        .expect("midnight exists")
        .and_utc()
        .timestamp();
    let month = calendar_month(start);
    if month.end > now {
        return Err(format!(
            "--period: {period} has not ended yet; report on a closed month"
        ));
    }
    Ok(month)
}

/// Seconds of `hourly` (hour start, seconds) inside `month`.
pub fn seconds_in(hourly: &[(Secs, i64)], month: Interval) -> i64 {
    hourly
        .iter()
        .filter(|(h, _)| *h >= month.start && *h < month.end)
        .map(|(_, s)| s)
        .sum()
}

/// The billing window a pay-as-you-go line charges (its item's metadata), if it is one.
fn overage_window(l: &super::api::InvoiceLine) -> Option<Secs> {
    (l.metadata.get("rush_meter_kind").map(String::as_str) == Some("overage"))
        .then(|| l.metadata.get("window_start")?.parse().ok())
        .flatten()
}

/// What an invoice charges for service that starts in `month`, in cents: the plan's lines
/// by their period, pay-as-you-go by the window it charges (its line's own period is when
/// the item was made). The second figure is the pay-as-you-go part.
pub fn cents_for(inv: &super::api::Invoice, month: Interval) -> (i64, i64) {
    let mut all = 0;
    let mut overage = 0;
    for l in &inv.lines.data {
        let start = match overage_window(l) {
            Some(w) => Some(w),
            None => l.period.map(|p| p.start),
        };
        if start.is_some_and(|s| s >= month.start && s < month.end) {
            all += l.amount;
            if overage_window(l).is_some() {
                overage += l.amount;
            }
        }
    }
    (all, overage)
}

/// Cents as currency units.
fn from_cents(cents: i64) -> Decimal {
    Decimal::new(cents, 2)
}

/// The report for `month`, one line per org, in org id order.
pub async fn invoice_report(
    b: &Billing,
    month: Interval,
    mut progress: impl FnMut(&str),
) -> BillingResult<Vec<Line>> {
    let api = b.api()?;
    let mut lines = Vec::new();
    for org in b.db.list_orgs().await? {
        let hourly = b.db.hourly_totals(&org.org_id).await?;
        let seconds = seconds_in(&hourly, month);
        let mut invoiced = 0_i64;
        let mut overage_invoiced = 0_i64;
        let mut count = 0;
        let mut unreadable = Vec::new();
        if let Some(customer) = &org.stripe_customer_id {
            let mut after: Option<String> = None;
            let mut seen = std::collections::HashSet::new();
            loop {
                let page = api.invoices(customer, after.as_deref()).await?;
                let fresh: Vec<_> = page
                    .data
                    .into_iter()
                    .filter(|i| seen.insert(i.id(|i| &i.id).to_owned()))
                    .collect();
                after = fresh.last().map(|i| i.id(|i| &i.id).to_owned());
                for element in fresh {
                    let inv = match element {
                        Readable::Read(inv) if inv.status.as_deref() != Some("void") => inv,
                        Readable::Read(_) => continue,
                        Readable::Unreadable { id, error } => {
                            tracing::warn!(org_id = %org.org_id, invoice = %id, %error, "invoice report skipped an invoice it cannot read");
                            unreadable.push(format!("{id}: {error}"));
                            continue;
                        }
                    };
                    let inv = api.all_lines(inv).await?;
                    let (cents, overage) = cents_for(&inv, month);
                    if cents != 0 {
                        invoiced += cents;
                        overage_invoiced += overage;
                        count += 1;
                    }
                }
                if !page.has_more || after.is_none() {
                    break;
                }
            }
        }
        let (plan, _) = org.subscribed_plan(&b.plans, b.clock.now());
        let paid_through_stripe =
            org.stripe_subscription_id.is_some() && !plan.stripe_prices.is_empty();
        let overage_owed: Decimal =
            b.db.overage_charges(&org.org_id)
                .await?
                .iter()
                .filter(|c| c.window_start >= month.start && c.window_start < month.end)
                .filter_map(|c| c.amount.parse::<Decimal>().ok())
                .sum();
        let owes = if paid_through_stripe {
            plan.price + overage_owed
        } else {
            Decimal::ZERO
        };
        let stripe_invoiced = from_cents(invoiced);
        lines.push(Line {
            agent_hours: hours(seconds),
            difference: stripe_invoiced - owes,
            org_id: org.org_id.clone(),
            plan: plan.id.clone(),
            stripe_customer_id: org.stripe_customer_id.clone(),
            agent_seconds: seconds,
            ledger_owes: owes,
            stripe_invoiced,
            invoices: count,
            overage_owed: if paid_through_stripe {
                overage_owed
            } else {
                Decimal::ZERO
            },
            overage_invoiced: from_cents(overage_invoiced),
            unreadable,
        });
        progress(&org.org_id);
    }
    Ok(lines)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn periods_are_closed_calendar_months() {
        let now = 1_796_000_000; // 2026-11-30
        let oct = parse_period("2026-10", now).unwrap();
        assert_eq!(
            rush_meter_core::time::format_rfc3339(oct.start),
            "2026-10-01T00:00:00Z"
        );
        assert_eq!(
            rush_meter_core::time::format_rfc3339(oct.end),
            "2026-11-01T00:00:00Z"
        );
        assert!(parse_period("2026-11", now)
            .unwrap_err()
            .contains("has not ended"));
        assert!(parse_period("2026-13", now).is_err());
        assert!(parse_period("nov", now).is_err());
        let hourly = [
            (oct.start - 3600, 100),
            (oct.start, 5),
            (oct.end - 3600, 7),
            (oct.end, 1000),
        ];
        assert_eq!(seconds_in(&hourly, oct), 12);
        assert_eq!(from_cents(2000), Decimal::new(20, 0));
        let inv: crate::billing::api::Invoice = serde_json::from_value(serde_json::json!({
            "id": "in_1", "status": "paid", "period_start": oct.start - 86_400 * 31,
            "lines": {"data": [
                {"amount": 2000, "period": {"start": oct.start, "end": oct.end}},
                {"amount": -500, "period": {"start": oct.start + 86_400, "end": oct.end}},
                {"amount": 9999, "period": {"start": oct.end, "end": oct.end + 86_400}},
                {"amount": 7}
            ]}
        }))
        .unwrap();
        assert_eq!(cents_for(&inv, oct), (1500, 0));
        // Pay-as-you-go counts for the window its metadata names, not its line's period.
        let inv: crate::billing::api::Invoice = serde_json::from_value(serde_json::json!({
            "id": "in_2", "status": "draft",
            "lines": {"data": [
                {"amount": 10, "period": {"start": oct.end + 60, "end": oct.end + 60},
                 "metadata": {"rush_meter_kind": "overage", "window_start": oct.start.to_string()}}
            ]}
        }))
        .unwrap();
        assert_eq!(cents_for(&inv, oct), (10, 10));
    }
}
