//! Money: what a period costs on a plan's terms.
//!
//! Rounding (docs/exports.md): seconds are whole; hours are seconds / 3600 to 4 places and
//! money to 2, both rounded once from exact whole seconds, half away from zero.

use rust_decimal::{Decimal, RoundingStrategy};

use crate::plans::Plan;

/// A plan's terms as a period is billed on them (frozen when the period closes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Terms {
    pub plan_id: String,
    pub included_hours: Decimal,
    pub unit_price: Decimal,
    pub price: Decimal,
    pub currency: String,
}

impl Terms {
    pub fn of(plan: &Plan) -> Terms {
        Terms {
            plan_id: plan.id.clone(),
            included_hours: plan.monthly_agent_hours,
            unit_price: plan.overage_unit_price,
            price: plan.price,
            currency: plan.currency.clone(),
        }
    }
}

/// The money columns of an org's line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Charge {
    pub overage_seconds: i64,
    pub amount: Decimal,
}

/// The plan's price plus the seconds past the included hours at the unit price, rounded
/// once to cents. Adjustments are listed, not charged here: they belong to a period
/// already billed.
pub fn charge(agent_seconds: i64, terms: &Terms) -> Charge {
    let included_seconds = (terms.included_hours * Decimal::from(3600)).floor();
    let overage = (Decimal::from(agent_seconds) - included_seconds).max(Decimal::ZERO);
    let amount = terms.price + overage * terms.unit_price / Decimal::from(3600);
    Charge {
        overage_seconds: i64::try_from(overage).unwrap_or(i64::MAX),
        amount: money(amount),
    }
}

/// An amount to the cent, half away from zero.
pub fn money(d: Decimal) -> Decimal {
    d.round_dp_with_strategy(2, RoundingStrategy::MidpointAwayFromZero)
}

/// Hours given as a decimal (a plan's included hours), to 4 places.
pub fn decimal_hours(d: Decimal) -> String {
    format!(
        "{:.4}",
        d.round_dp_with_strategy(4, RoundingStrategy::MidpointAwayFromZero)
    )
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn terms(price: &str, included: &str, unit: &str) -> Terms {
        Terms {
            plan_id: "pro".into(),
            included_hours: included.parse().unwrap(),
            unit_price: unit.parse().unwrap(),
            price: price.parse().unwrap(),
            currency: "usd".into(),
        }
    }

    fn d(s: &str) -> Decimal {
        s.parse().unwrap()
    }

    #[test]
    fn charge_rounds_once_from_whole_seconds() {
        let t = terms("20.00", "40", "0.50");
        assert_eq!(charge(40 * 3600, &t).amount, d("20.00"));
        assert_eq!(charge(40 * 3600, &t).overage_seconds, 0);
        // 1 s over at 0.50/h is 0.000138.. cents: rounds to nothing.
        assert_eq!(charge(40 * 3600 + 1, &t).amount, d("20.00"));
        // 36 s over is exactly half a cent: half away from zero.
        assert_eq!(charge(40 * 3600 + 36, &t).amount, d("20.01"));
        assert_eq!(charge(40 * 3600 + 35, &t).amount, d("20.00"));
        assert_eq!(charge(41 * 3600, &t).amount, d("20.50"));
        assert_eq!(charge(0, &t).amount, d("20.00"));
    }
}
