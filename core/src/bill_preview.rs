//! The bill of an org's current billing period as it will be invoiced, and where its pace
//! takes it by the period's end (pure: the shells read the org's funding, its top-ups and its
//! charges not yet invoiced, and hand them here).
//!
//! Money is exact (docs/exports.md): pay-as-you-go is its charge units, rounded once to the
//! cent, half away from zero (`charges::amount`), the same figure the billing job sends
//! Stripe as the window's invoice item; totals add lines already in cents.

use rust_decimal::Decimal;
use serde::Serialize;

use crate::charges::{amount, money, unit_price};
use crate::funding::{State, WindowKind};
use crate::plans::Plan;
use crate::time::{format_rfc3339, Interval, Secs};

const DAY: Secs = 86_400;

/// A top-up bought in the period: paid when bought, listed, never invoiced again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Purchase {
    pub grant_id: String,
    pub seconds: i64,
    pub bought_at: Secs,
}

/// Pay-as-you-go of an earlier window, recorded and not yet on an invoice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owed {
    pub window: Interval,
    pub overage_seconds: i64,
    pub charge_units: i64,
}

/// What kind of line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum LineKind {
    /// The plan version's price for the period.
    Plan,
    /// Pay-as-you-go of a month window: this period's so far, or an earlier one's not yet
    /// invoiced.
    PayAsYouGo,
    /// A top-up bought in the period: paid already, not charged again.
    Topup,
    /// Time paid by grants in the period: no charge.
    Grants,
}

/// One line of the preview.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Line {
    pub kind: LineKind,
    pub description: String,
    /// The window or time the line is of (RFC 3339).
    #[schema(format = DateTime)]
    pub from: String,
    #[schema(format = DateTime)]
    pub to: String,
    /// Agent seconds the line is of (pay-as-you-go, grants, a top-up's hours); 0 for the
    /// plan.
    pub seconds: i64,
    /// The price an hour, exact (pay-as-you-go, top-ups); `null` otherwise.
    pub unit_price: Option<String>,
    /// Decimal, to the cent.
    pub amount: String,
    /// Whether the line is on the invoice: top-ups were paid when bought, grants cost
    /// nothing.
    pub invoiced: bool,
}

/// The preview of a period's bill.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Preview {
    pub currency: String,
    #[schema(format = DateTime)]
    pub period_start: String,
    #[schema(format = DateTime)]
    pub period_end: String,
    pub lines: Vec<Line>,
    /// The invoiced lines as they stand now, to the cent.
    pub due: String,
    /// This period's pay-as-you-go at the period's end at the pace so far (its use since
    /// the period began spread evenly over the rest), funded as it would be: the plan's
    /// room (week by week), grants in force, then pay-as-you-go up to the cap.
    pub projected_pay_as_you_go_seconds: i64,
    pub projected_pay_as_you_go_amount: String,
    /// `due` with this period's pay-as-you-go at its projection.
    pub projected: String,
    /// What Stripe adds on its own, not in these figures.
    pub not_included: Vec<&'static str>,
}

/// What the preview is made from.
pub struct Reads<'a> {
    pub plan: &'a Plan,
    /// The period: the org's month window now.
    pub period: Interval,
    /// The org's funding with running sessions counted up to `now` (`Standing::funding`).
    pub funding: &'a State,
    /// Agent seconds used in the period so far.
    pub used: i64,
    pub purchases: &'a [Purchase],
    pub owed: &'a [Owed],
    pub now: Secs,
}

/// What Stripe adds on its own to an invoice, which the ledger does not know.
pub const NOT_INCLUDED: [&str; 4] = ["proration", "tax", "discounts", "customer balance"];

/// The preview of `r.period`'s bill at `r.now`.
pub fn preview(r: &Reads<'_>) -> Preview {
    let period = r.period;
    let funds = r.funding.funds(WindowKind::Month, period);
    let price = unit_price(r.plan.overage_unit_price);
    let name = format!("{} v{}", r.plan.name, r.plan.version);
    let mut lines = vec![Line {
        kind: LineKind::Plan,
        description: format!("{name}, the period's price"),
        from: format_rfc3339(period.start),
        to: format_rfc3339(period.end),
        seconds: 0,
        unit_price: None,
        amount: format!("{:.2}", money(r.plan.price)),
        invoiced: true,
    }];
    for o in r.owed {
        lines.push(pay_as_you_go(
            "earlier window, not yet invoiced",
            o.window,
            (o.overage_seconds, o.charge_units),
            &price,
        ));
    }
    let so_far = (funds.overage, funds.charge_units);
    if so_far.0 > 0 || r.funding.terms.pay_as_you_go() {
        lines.push(pay_as_you_go("this period so far", period, so_far, &price));
    }
    for p in r.purchases {
        let hour_price = r.plan.topup_hour_price;
        lines.push(Line {
            kind: LineKind::Topup,
            description: format!("top-up {}, paid when bought", p.grant_id),
            from: format_rfc3339(p.bought_at),
            to: format_rfc3339(p.bought_at),
            seconds: p.seconds,
            unit_price: Some(unit_price(hour_price)),
            amount: format!(
                "{:.2}",
                money(hour_price * Decimal::from(p.seconds) / Decimal::from(3600))
            ),
            invoiced: false,
        });
    }
    if funds.grant > 0 {
        lines.push(Line {
            kind: LineKind::Grants,
            description: "time paid by grants: no charge".into(),
            from: format_rfc3339(period.start),
            to: format_rfc3339(r.now.min(period.end)),
            seconds: funds.grant,
            unit_price: None,
            amount: "0.00".into(),
            invoiced: false,
        });
    }
    let due: Decimal = lines
        .iter()
        .filter(|l| l.invoiced)
        .map(|l| l.amount.parse::<Decimal>().unwrap_or_default())
        .sum();
    let (seconds, units) = projected_overage(r);
    let now_amount = amount(funds.charge_units);
    let projected_amount = amount(units);
    Preview {
        currency: r.plan.currency.clone(),
        period_start: format_rfc3339(period.start),
        period_end: format_rfc3339(period.end),
        lines,
        due: format!("{due:.2}"),
        projected_pay_as_you_go_seconds: seconds,
        projected_pay_as_you_go_amount: format!("{projected_amount:.2}"),
        projected: format!("{:.2}", due - now_amount + projected_amount),
        not_included: NOT_INCLUDED.to_vec(),
    }
}

fn pay_as_you_go(what: &str, window: Interval, (seconds, units): (i64, i64), price: &str) -> Line {
    Line {
        kind: LineKind::PayAsYouGo,
        description: format!("pay-as-you-go, {what}"),
        from: format_rfc3339(window.start),
        to: format_rfc3339(window.end),
        seconds,
        unit_price: Some(price.to_owned()),
        amount: format!("{:.2}", amount(units)),
        invoiced: true,
    }
}

/// This period's pay-as-you-go `(seconds, charge units)` at its end, at the pace so far:
/// the seconds to come (`used × rest / elapsed`, as the upgrade prompt projects) spread
/// evenly over the rest of the period a day at a time, each day's funded in its own
/// windows, so that a week's reset gives the plan room back and the cap stops the rest.
fn projected_overage(r: &Reads<'_>) -> (i64, i64) {
    let period = r.period;
    let mut state = r.funding.clone();
    let now = r.now.clamp(period.start, period.end);
    let elapsed = (now - period.start).max(1);
    let rest = period.end - now;
    let to_come = (i128::from(r.used) * i128::from(rest) / i128::from(elapsed)) as i64;
    let mut given = 0;
    let mut t = now;
    while t < period.end && to_come > 0 {
        let next = ((t.div_euclid(DAY) + 1) * DAY).min(period.end);
        // Whole seconds, the remainder on the last day: the days add up to `to_come`.
        let upto = (i128::from(to_come) * i128::from(next - now) / i128::from(rest)) as i64;
        state.project(t, upto - given);
        given = upto;
        t = next;
    }
    let f = state.funds(WindowKind::Month, period);
    (f.overage, f.charge_units)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::funding::{Grant, GrantKind, Overage, Terms};

    const H: i64 = 3600;

    /// Mini: 360 s a month, 180 s a week, pay-as-you-go at 3.60 an hour (a tenth of a cent
    /// a second), top-ups at 1.00 an hour.
    fn mini() -> Plan {
        let mut p = crate::shipped_plans().get("pro").unwrap().clone();
        p.monthly_limit_seconds = 360;
        p.weekly_limit_seconds = 180;
        p.overage_unit_price = "3.60".parse().unwrap();
        p.topup_hour_price = "1.00".parse().unwrap();
        p
    }

    fn state(plan: &Plan, cap: &str, period: Interval, grants: Vec<Grant>) -> State {
        let overage = Overage {
            enabled: true,
            monthly_cap: cap.parse().unwrap(),
        };
        State::new(
            Terms::of(plan, &overage),
            Some(period),
            period.start,
            [],
            grants,
        )
    }

    /// Monday 2026-11-02 00:00 UTC, a 28-day period of four ISO weeks.
    const START: Secs = 1_793_577_600;

    #[test]
    fn lines_add_up_to_the_cent_and_the_cap_bounds_the_projection() {
        let plan = mini();
        let period = Interval::new(START, START + 28 * DAY).unwrap();
        let mut s = state(&plan, "1.00", period, vec![]);
        // 600 s on the first day: 180 s of plan (the week's), 420 s of pay-as-you-go.
        s.fund("s1", Interval::new(START + H, START + H + 600).unwrap());
        let purchases = [Purchase {
            grant_id: "gr_1".into(),
            seconds: 2 * H,
            bought_at: START + 2 * H,
        }];
        let owed = [Owed {
            window: Interval::new(START - 30 * DAY, START).unwrap(),
            overage_seconds: 5,
            charge_units: 5 * 36_000,
        }];
        let now = START + DAY;
        let r = Reads {
            plan: &plan,
            period,
            funding: &s,
            used: 600,
            purchases: &purchases,
            owed: &owed,
            now,
        };
        let p = preview(&r);
        let amounts: Vec<(LineKind, &str, bool)> = p
            .lines
            .iter()
            .map(|l| (l.kind, l.amount.as_str(), l.invoiced))
            .collect();
        assert_eq!(
            amounts,
            [
                (LineKind::Plan, "20.00", true),
                (LineKind::PayAsYouGo, "0.01", true),
                (LineKind::PayAsYouGo, "0.42", true),
                (LineKind::Topup, "2.00", false),
            ]
        );
        assert_eq!(p.due, "20.43");
        // 600 s a day for 27 more days: each week's 180 s of plan, then pay-as-you-go,
        // stopped by the cap at 1,000 s (1.00).
        assert_eq!(
            (
                p.projected_pay_as_you_go_seconds,
                p.projected_pay_as_you_go_amount.as_str()
            ),
            (1000, "1.00")
        );
        assert_eq!(p.projected, "21.01");
    }

    #[test]
    fn a_week_reset_gives_the_plan_room_back_in_the_projection() {
        let plan = mini();
        let period = Interval::new(START, START + 14 * DAY).unwrap();
        let mut s = state(&plan, "100", period, vec![]);
        s.fund("s1", Interval::new(START, START + 180).unwrap());
        let at = |now: Secs, used: i64| Reads {
            plan: &plan,
            period,
            funding: &s,
            used,
            purchases: &[],
            owed: &[],
            now,
        };
        // 180 s in the first 7 days: 180 s more in the second week, all of it plan (the
        // month's 360 s), none of it pay-as-you-go.
        let p = preview(&at(START + 7 * DAY, 180));
        assert_eq!(p.projected_pay_as_you_go_seconds, 0, "{p:?}");
        assert_eq!(p.due, p.projected);
    }

    #[test]
    fn grant_time_is_listed_free_and_used_before_pay_as_you_go() {
        let plan = mini();
        let period = Interval::new(START, START + 28 * DAY).unwrap();
        let grant = Grant {
            org_id: "o".into(),
            grant_id: "gr_1".into(),
            kind: GrantKind::Promo,
            seconds: 100,
            used_seconds: 0,
            priority: 50,
            starts_at: START,
            expires_at: None,
            note: None,
            idempotency_key: None,
            created_at: START,
            voided_at: None,
            used_up_at: None,
        };
        let mut s = state(&plan, "1.00", period, vec![grant]);
        s.fund("s1", Interval::new(START, START + 300).unwrap());
        let p = preview(&Reads {
            plan: &plan,
            period,
            funding: &s,
            used: 300,
            purchases: &[],
            owed: &[],
            now: START + 28 * DAY,
        });
        let grants = p.lines.iter().find(|l| l.kind == LineKind::Grants).unwrap();
        assert_eq!(
            (grants.seconds, grants.amount.as_str(), grants.invoiced),
            (100, "0.00", false)
        );
        let paygo = p
            .lines
            .iter()
            .find(|l| l.kind == LineKind::PayAsYouGo)
            .unwrap();
        assert_eq!((paygo.seconds, paygo.amount.as_str()), (20, "0.02"));
        // At the period's end nothing is to come.
        assert_eq!(
            (p.projected_pay_as_you_go_seconds, p.projected.as_str()),
            (20, "20.02")
        );
    }
}
