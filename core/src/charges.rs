//! Money: what a period costs on a plan's terms.
//!
//! Rounding (docs/exports.md): seconds are whole; hours are seconds / 3600 to 4 places and
//! money to 2, both rounded once from exact whole seconds, half away from zero.

use rust_decimal::{Decimal, RoundingStrategy};

use crate::plans::Plan;

/// Charge units in one unit of the currency, per hour of the price: pay-as-you-go of `s`
/// seconds at price `p` an hour is `s × p × 10⁴` units (whole, since prices have at most 4
/// places, so sums never round), and `units / UNITS_PER_HOUR` is its money.
pub const UNITS_PER_HOUR: i64 = 3600 * 10_000;

/// A price per hour in charge units per second (price × 10⁴); `None` when it has more
/// than 4 decimal places or is out of range.
pub fn price_units(price: Decimal) -> Option<i64> {
    let scaled = price.checked_mul(Decimal::from(10_000))?;
    (scaled.fract().is_zero() && scaled >= Decimal::ZERO)
        .then(|| i64::try_from(scaled).ok())
        .flatten()
}

/// A decimal as the API writes one: digits, then optionally a point and more digits, after
/// an optional `-`. `rust_decimal`'s own parser also takes `1e2`, `+5` and `1_000`, which
/// the contract does not; spaces are not trimmed.
pub fn parse_decimal(text: &str) -> Option<Decimal> {
    let digits = text.strip_prefix('-').unwrap_or(text);
    let (whole, fraction) = digits.split_once('.').unwrap_or((digits, "0"));
    let plain = |s: &str| !s.is_empty() && s.len() <= 28 && s.bytes().all(|b| b.is_ascii_digit());
    if !(plain(whole) && plain(fraction)) {
        return None;
    }
    text.parse().ok()
}

/// Charge units as money, rounded once to the cent, half away from zero.
pub fn amount(units: i64) -> Decimal {
    money(Decimal::from(units) / Decimal::from(UNITS_PER_HOUR))
}

/// A money amount in charge units (what a cap of that amount allows).
pub fn money_units(m: Decimal) -> i64 {
    m.checked_mul(Decimal::from(UNITS_PER_HOUR))
        .and_then(|scaled| i64::try_from(scaled.floor()).ok())
        .unwrap_or(i64::MAX)
}

/// A plan's terms as a period is billed on them (frozen when the period closes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Terms {
    pub plan_id: String,
    pub plan_version: i64,
    pub included_hours: Decimal,
    pub unit_price: Decimal,
    pub price: Decimal,
    pub currency: String,
}

impl Terms {
    pub fn of(plan: &Plan) -> Terms {
        Terms {
            plan_id: plan.id.clone(),
            plan_version: plan.version,
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

/// The plan's price plus what pay-as-you-go paid for (its charge units, exact), rounded
/// once to cents. Time past the plan that grants or grace paid for costs nothing here;
/// adjustments are listed, not charged: they belong to a period already billed.
pub fn charge(terms: &Terms, overage_seconds: i64, charge_units: i64) -> Charge {
    let overage = Decimal::from(charge_units) / Decimal::from(UNITS_PER_HOUR);
    Charge {
        overage_seconds,
        amount: money(terms.price + overage),
    }
}

/// An amount to the cent, half away from zero.
pub fn money(d: Decimal) -> Decimal {
    d.round_dp_with_strategy(2, RoundingStrategy::MidpointAwayFromZero)
}

/// A price an hour as shown (the API, exports): exact, with 2 places, or as many as it has
/// (a plan's `overage_unit_price` has at most 4): 0.60 and 0.6250, never 0.63 for 0.625.
pub fn unit_price(d: Decimal) -> String {
    let d = d.normalize();
    if d.scale() <= 2 {
        format!("{d:.2}")
    } else {
        d.to_string()
    }
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

    #[test]
    fn decimals_are_read_as_the_contract_writes_them_only() {
        for plain in ["0", "12.5", "-3.25", "0.0001", "40"] {
            assert_eq!(
                parse_decimal(plain),
                Some(plain.parse().unwrap()),
                "{plain}"
            );
        }
        for odd in [
            "1e2", " 5 ", "+5", "1_000", "", ".5", "5.", "-", "1.2.3", "0x10", "١٢",
        ] {
            assert_eq!(parse_decimal(odd), None, "{odd:?}");
        }
    }

    #[test]
    fn unit_prices_show_every_place_they_have() {
        let d = |t: &str| t.parse::<Decimal>().unwrap();
        assert_eq!(unit_price(d("0.6")), "0.60");
        assert_eq!(unit_price(d("3.6000")), "3.60");
        assert_eq!(unit_price(d("0.625")), "0.625");
        assert_eq!(unit_price(d("0.6250")), "0.625");
        assert_eq!(unit_price(d("0.0001")), "0.0001");
        assert_eq!(unit_price(d("12")), "12.00");
    }

    pub(crate) fn terms(price: &str, included: &str, unit: &str) -> Terms {
        Terms {
            plan_id: "pro".into(),
            plan_version: 1,
            included_hours: included.parse().unwrap(),
            unit_price: unit.parse().unwrap(),
            price: price.parse().unwrap(),
            currency: "usd".into(),
        }
    }

    fn d(s: &str) -> Decimal {
        s.parse().unwrap()
    }

    /// `overage` seconds paid as they went at `price_units` a second.
    fn paid(overage: i64, price_units: i64) -> (i64, i64) {
        (overage, overage * price_units)
    }

    fn charge(t: &Terms, (seconds, units): (i64, i64)) -> Charge {
        super::charge(t, seconds, units)
    }

    #[test]
    fn charge_rounds_once_from_whole_seconds() {
        let t = terms("20.00", "40", "0.50");
        assert_eq!(charge(&t, paid(0, 5000)).amount, d("20.00"));
        assert_eq!(charge(&t, paid(0, 5000)).overage_seconds, 0);
        // 1 s at 0.50/h is 0.000138.. cents: rounds to nothing.
        assert_eq!(charge(&t, paid(1, 5000)).amount, d("20.00"));
        // 36 s is exactly half a cent: half away from zero.
        assert_eq!(charge(&t, paid(36, 5000)).amount, d("20.01"));
        assert_eq!(charge(&t, paid(35, 5000)).amount, d("20.00"));
        assert_eq!(charge(&t, paid(3600, 5000)).amount, d("20.50"));
        // Time past the plan that grants or grace paid for has no charge units.
        assert_eq!(charge(&t, (0, 0)).amount, d("20.00"));
    }
}
