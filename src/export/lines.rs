//! The finance export's rows and how they are written, CSV or JSON Lines: pure functions
//! of what the store read, so the same rows always make the same bytes.
//!
//! Rounding (docs/api.md): seconds are whole; hours are seconds / 3600 to 4 places and
//! money to 2, both rounded once from exact whole seconds, half away from zero.

use rust_decimal::{Decimal, RoundingStrategy};
use serde::Serialize;

use crate::ledger::{Interval, Secs};
use crate::quota::{format_rfc3339, hours};

pub const ORG_COLUMNS: [&str; 14] = [
    "period_start",
    "period_end",
    "org_id",
    "plan",
    "stripe_customer_id",
    "stripe_subscription_id",
    "agent_seconds",
    "agent_hours",
    "included_hours",
    "overage_hours",
    "unit_price",
    "amount",
    "currency",
    "adjustment_seconds",
];

pub const SESSION_COLUMNS: [&str; 12] = [
    "session_id",
    "org_id",
    "project_id",
    "started_by",
    "agent",
    "running_seconds",
    "parked_seconds",
    "spans",
    "first_start",
    "last_end",
    "end_status",
    "adjustment_seconds",
];

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
    pub fn of(plan: &crate::plans::Plan) -> Terms {
        Terms {
            plan_id: plan.id.clone(),
            included_hours: plan.monthly_agent_hours,
            unit_price: plan.overage_unit_price,
            price: plan.price,
            currency: plan.currency.clone(),
        }
    }
}

/// One org's period: its seconds and the terms they are billed on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OrgTotals {
    pub org_id: String,
    pub stripe_customer_id: Option<String>,
    pub stripe_subscription_id: Option<String>,
    pub agent_seconds: i64,
    pub adjustment_seconds: i64,
    pub terms: Terms,
}

/// One session's period, as the store reads it.
#[derive(Clone, Debug, PartialEq, Eq, sqlx::FromRow)]
pub struct SessionLine {
    pub org_id: String,
    pub session_id: String,
    pub project_id: Option<String>,
    pub started_by: Option<String>,
    pub agent: Option<String>,
    pub running_seconds: i64,
    pub parked_seconds: i64,
    pub spans: i64,
    pub first_start: Option<Secs>,
    pub last_end: Option<Secs>,
    pub end_status: Option<String>,
    pub adjustment_seconds: i64,
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

fn money(d: Decimal) -> Decimal {
    d.round_dp_with_strategy(2, RoundingStrategy::MidpointAwayFromZero)
}

fn decimal_hours(d: Decimal) -> String {
    format!(
        "{:.4}",
        d.round_dp_with_strategy(4, RoundingStrategy::MidpointAwayFromZero)
    )
}

#[derive(Serialize)]
struct OrgJson<'a> {
    period_start: String,
    period_end: String,
    org_id: &'a str,
    plan: &'a str,
    stripe_customer_id: Option<&'a str>,
    stripe_subscription_id: Option<&'a str>,
    agent_seconds: i64,
    agent_hours: String,
    included_hours: String,
    overage_hours: String,
    unit_price: String,
    amount: String,
    currency: &'a str,
    adjustment_seconds: i64,
}

fn org_json<'a>(period: Interval, o: &'a OrgTotals) -> OrgJson<'a> {
    let c = charge(o.agent_seconds, &o.terms);
    OrgJson {
        period_start: format_rfc3339(period.start),
        period_end: format_rfc3339(period.end),
        org_id: &o.org_id,
        plan: &o.terms.plan_id,
        stripe_customer_id: o.stripe_customer_id.as_deref(),
        stripe_subscription_id: o.stripe_subscription_id.as_deref(),
        agent_seconds: o.agent_seconds,
        agent_hours: hours(o.agent_seconds),
        included_hours: decimal_hours(o.terms.included_hours),
        overage_hours: hours(c.overage_seconds),
        unit_price: format!("{:.2}", money(o.terms.unit_price)),
        amount: format!("{:.2}", c.amount),
        currency: &o.terms.currency,
        adjustment_seconds: o.adjustment_seconds,
    }
}

#[derive(Serialize)]
struct SessionJson<'a> {
    session_id: &'a str,
    org_id: &'a str,
    project_id: Option<&'a str>,
    started_by: Option<&'a str>,
    agent: Option<&'a str>,
    running_seconds: i64,
    parked_seconds: i64,
    spans: i64,
    first_start: Option<Rfc3339>,
    last_end: Option<Rfc3339>,
    end_status: Option<&'a str>,
    adjustment_seconds: i64,
}

/// How an export is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Csv,
    Jsonl,
}

impl Format {
    /// Every value `parse` takes, for the OpenAPI document.
    pub const NAMES: [&'static str; 2] = ["csv", "jsonl"];

    pub fn parse(s: &str) -> Option<Format> {
        match s {
            "csv" => Some(Format::Csv),
            "jsonl" => Some(Format::Jsonl),
            _ => None,
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Format::Csv => "text/csv; charset=utf-8",
            Format::Jsonl => "application/x-ndjson",
        }
    }

    pub fn extension(self) -> &'static str {
        match self {
            Format::Csv => "csv",
            Format::Jsonl => "jsonl",
        }
    }

    /// What comes before the first row: CSV's header line.
    pub fn header(self, columns: &[&str], out: &mut Vec<u8>) {
        if self == Format::Csv {
            out.extend_from_slice(columns.join(",").as_bytes());
            out.extend_from_slice(b"\r\n");
        }
    }
}

pub fn write_org(format: Format, period: Interval, o: &OrgTotals, out: &mut Vec<u8>) {
    let j = org_json(period, o);
    match format {
        Format::Jsonl => json_line(&j, out),
        Format::Csv => csv_line(
            &[
                &j.period_start,
                &j.period_end,
                j.org_id,
                j.plan,
                j.stripe_customer_id.unwrap_or(""),
                j.stripe_subscription_id.unwrap_or(""),
                &j.agent_seconds.to_string(),
                &j.agent_hours,
                &j.included_hours,
                &j.overage_hours,
                &j.unit_price,
                &j.amount,
                j.currency,
                &j.adjustment_seconds.to_string(),
            ],
            out,
        ),
    }
}

/// One session's line. The hot loop of a million-line export: fields are written
/// straight into `out`, times by `write_rfc3339`, nothing allocated per line.
pub fn write_session(format: Format, s: &SessionLine, out: &mut Vec<u8>) {
    match format {
        Format::Jsonl => json_line(
            &SessionJson {
                session_id: &s.session_id,
                org_id: &s.org_id,
                project_id: s.project_id.as_deref(),
                started_by: s.started_by.as_deref(),
                agent: s.agent.as_deref(),
                running_seconds: s.running_seconds,
                parked_seconds: s.parked_seconds,
                spans: s.spans,
                first_start: s.first_start.map(Rfc3339),
                last_end: s.last_end.map(Rfc3339),
                end_status: s.end_status.as_deref(),
                adjustment_seconds: s.adjustment_seconds,
            },
            out,
        ),
        Format::Csv => {
            csv_field(&s.session_id, out);
            out.push(b',');
            csv_field(&s.org_id, out);
            out.push(b',');
            csv_field(s.project_id.as_deref().unwrap_or(""), out);
            out.push(b',');
            csv_field(s.started_by.as_deref().unwrap_or(""), out);
            out.push(b',');
            csv_field(s.agent.as_deref().unwrap_or(""), out);
            for n in [s.running_seconds, s.parked_seconds, s.spans] {
                out.push(b',');
                write_int(n, out);
            }
            for t in [s.first_start, s.last_end] {
                out.push(b',');
                if let Some(t) = t {
                    write_rfc3339(t, out);
                }
            }
            out.push(b',');
            csv_field(s.end_status.as_deref().unwrap_or(""), out);
            out.push(b',');
            write_int(s.adjustment_seconds, out);
            out.extend_from_slice(b"\r\n");
        }
    }
}

fn write_int(n: i64, out: &mut Vec<u8>) {
    use std::io::Write;
    write!(out, "{n}").expect("writing to memory");
}

/// `secs` as `YYYY-MM-DDTHH:MM:SSZ` (what `quota::format_rfc3339` writes, without chrono's
/// formatter): the civil date from days since 1970 (Howard Hinnant's algorithm).
pub fn write_rfc3339(secs: Secs, out: &mut Vec<u8>) {
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    if !(0..=9999).contains(&year) {
        out.extend_from_slice(format_rfc3339(secs).as_bytes());
        return;
    }
    let two = |v: i64, out: &mut Vec<u8>| {
        out.push(b'0' + (v / 10) as u8);
        out.push(b'0' + (v % 10) as u8);
    };
    two(year / 100, out);
    two(year % 100, out);
    out.push(b'-');
    two(month, out);
    out.push(b'-');
    two(day, out);
    out.push(b'T');
    two(rem / 3600, out);
    out.push(b':');
    two(rem / 60 % 60, out);
    out.push(b':');
    two(rem % 60, out);
    out.push(b'Z');
}

/// A time that serialises as RFC 3339 through `write_rfc3339`.
struct Rfc3339(Secs);

impl Serialize for Rfc3339 {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut buf = Vec::with_capacity(20);
        write_rfc3339(self.0, &mut buf);
        s.serialize_str(std::str::from_utf8(&buf).expect("ASCII"))
    }
}

fn json_line<T: Serialize>(v: &T, out: &mut Vec<u8>) {
    serde_json::to_writer(&mut *out, v).expect("export rows serialise");
    out.push(b'\n');
}

/// One RFC 4180 record; lines end in CRLF.
fn csv_line(fields: &[&str], out: &mut Vec<u8>) {
    for (i, f) in fields.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        csv_field(f, out);
    }
    out.extend_from_slice(b"\r\n");
}

/// A field holding a comma, quote or line break is quoted, its quotes doubled.
fn csv_field(f: &str, out: &mut Vec<u8>) {
    if f.bytes().any(|b| matches!(b, b',' | b'"' | b'\n' | b'\r')) {
        out.push(b'"');
        out.extend_from_slice(f.replace('"', "\"\"").as_bytes());
        out.push(b'"');
    } else {
        out.extend_from_slice(f.as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn terms(price: &str, included: &str, unit: &str) -> Terms {
        Terms {
            plan_id: "pro".into(),
            included_hours: price_of(included),
            unit_price: price_of(unit),
            price: price_of(price),
            currency: "usd".into(),
        }
    }

    fn price_of(s: &str) -> Decimal {
        s.parse().unwrap()
    }

    #[test]
    fn charge_rounds_once_from_whole_seconds() {
        let t = terms("20.00", "40", "0.50");
        assert_eq!(charge(40 * 3600, &t).amount, price_of("20.00"));
        assert_eq!(charge(40 * 3600, &t).overage_seconds, 0);
        // 1 s over at 0.50/h is 0.000138.. cents: rounds to nothing.
        assert_eq!(charge(40 * 3600 + 1, &t).amount, price_of("20.00"));
        // 36 s over is exactly half a cent: half away from zero.
        assert_eq!(charge(40 * 3600 + 36, &t).amount, price_of("20.01"));
        assert_eq!(charge(40 * 3600 + 35, &t).amount, price_of("20.00"));
        assert_eq!(charge(41 * 3600, &t).amount, price_of("20.50"));
        assert_eq!(charge(0, &t).amount, price_of("20.00"));
    }

    #[test]
    fn org_line_in_both_formats() {
        let period = Interval::new(1_793_491_200, 1_796_083_200).unwrap(); // 2026-11
        let o = OrgTotals {
            org_id: "acme".into(),
            stripe_customer_id: Some("cus_1".into()),
            stripe_subscription_id: None,
            agent_seconds: 40 * 3600 + 18,
            adjustment_seconds: 7,
            terms: terms("20.00", "40", "0.50"),
        };
        let mut csv = Vec::new();
        Format::Csv.header(&ORG_COLUMNS, &mut csv);
        write_org(Format::Csv, period, &o, &mut csv);
        assert_eq!(
            String::from_utf8(csv).unwrap(),
            "period_start,period_end,org_id,plan,stripe_customer_id,stripe_subscription_id,agent_seconds,agent_hours,included_hours,overage_hours,unit_price,amount,currency,adjustment_seconds\r\n\
             2026-11-01T00:00:00Z,2026-12-01T00:00:00Z,acme,pro,cus_1,,144018,40.0050,40.0000,0.0050,0.50,20.00,usd,7\r\n"
        );
        let mut jsonl = Vec::new();
        write_org(Format::Jsonl, period, &o, &mut jsonl);
        let v: serde_json::Value = serde_json::from_slice(&jsonl).unwrap();
        assert_eq!(v["agent_hours"], "40.0050");
        assert_eq!(v["stripe_subscription_id"], serde_json::Value::Null);
        assert_eq!(v["adjustment_seconds"], 7);
        let keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        let mut want = ORG_COLUMNS.to_vec();
        want.sort_unstable();
        let mut got = keys.clone();
        got.sort_unstable();
        assert_eq!(got, want, "JSONL uses the CSV's names");
    }

    #[test]
    fn rfc3339_matches_chrono_for_any_second() {
        let mut t: i64 = -62_135_596_800; // 0001-01-01
        while t < 253_402_300_800 {
            let mut out = Vec::new();
            write_rfc3339(t, &mut out);
            assert_eq!(String::from_utf8(out).unwrap(), format_rfc3339(t), "{t}");
            t += 7_919_993; // about three months, a prime: every day of year and time of day comes up
        }
        for t in [
            0,
            951_782_400,
            951_868_799,
            1_709_164_800,
            1_796_083_199,
            1_796_083_200,
        ] {
            let mut out = Vec::new();
            write_rfc3339(t, &mut out);
            assert_eq!(String::from_utf8(out).unwrap(), format_rfc3339(t), "{t}");
        }
    }

    #[test]
    fn csv_quotes_what_needs_it() {
        let s = SessionLine {
            org_id: "o".into(),
            session_id: "s".into(),
            project_id: Some("a,b".into()),
            started_by: Some("say \"hi\"".into()),
            agent: Some("line\nbreak".into()),
            running_seconds: 1,
            parked_seconds: 2,
            spans: 3,
            first_start: Some(0),
            last_end: None,
            end_status: None,
            adjustment_seconds: 0,
        };
        let mut out = Vec::new();
        write_session(Format::Csv, &s, &mut out);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "s,o,\"a,b\",\"say \"\"hi\"\"\",\"line\nbreak\",1,2,3,1970-01-01T00:00:00Z,,,0\r\n"
        );
    }
}
