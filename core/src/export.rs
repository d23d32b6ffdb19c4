//! Finance's export lines, CSV (RFC 4180, with the `csv` crate) or JSON Lines: pure
//! functions of what the store read, so the same rows always make the same bytes.
//!
//! Rounding (docs/exports.md): seconds are whole; hours are seconds / 3600 to 4 places and
//! money to 2, both rounded once from exact whole seconds, half away from zero.

use serde::Serialize;

use crate::charges::{charge, decimal_hours, unit_price, Terms};
use crate::funding::{amount, GrantKind, Source};
pub use crate::periods::{due_month, month_name, months_between, parse_month};
use crate::time::{format_rfc3339, hours, write_rfc3339, Interval, Secs};

pub const ORG_COLUMNS: [&str; 26] = [
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
    "plan_seconds",
    "grant_seconds",
    "grant_promo_seconds",
    "grant_make_good_seconds",
    "grant_trial_seconds",
    "grant_purchased_seconds",
    "overage_seconds",
    "overage_amount",
    "grace_seconds",
    "adjustment_overage_seconds",
    "adjustment_overage_amount",
    "plan_version",
];

/// An org's period by who paid, from the hourly funding rollup: what its grants (by kind),
/// pay-as-you-go and grace paid for; the plan paid for the rest of its agent seconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PeriodFunding {
    /// Grant seconds by kind, in `GrantKind::ALL` order.
    pub grant: [i64; 4],
    pub overage: i64,
    pub grace: i64,
    /// Charge units of the overage seconds (`funding::amount` makes them money).
    pub charge_units: i64,
}

impl PeriodFunding {
    /// Add a rollup row: `kind` is the grant's, for grant seconds.
    pub fn add(&mut self, source: Source, kind: Option<GrantKind>, seconds: i64, units: i64) {
        match source {
            Source::Plan => {}
            Source::Grant => {
                let i = kind
                    .and_then(|k| GrantKind::ALL.iter().position(|x| *x == k))
                    .unwrap_or(0);
                self.grant[i] += seconds;
            }
            Source::Overage => self.overage += seconds,
            Source::Grace => self.grace += seconds,
        }
        self.charge_units += units;
    }

    pub fn grant_seconds(&self) -> i64 {
        self.grant.iter().sum()
    }

    /// Seconds not paid by the plan.
    pub fn not_plan(&self) -> i64 {
        self.grant_seconds() + self.overage + self.grace
    }

    /// What changed from `before` to `self`.
    pub fn minus(&self, before: &PeriodFunding) -> PeriodFunding {
        let mut grant = self.grant;
        for (g, b) in grant.iter_mut().zip(before.grant) {
            *g -= b;
        }
        PeriodFunding {
            grant,
            overage: self.overage - before.overage,
            grace: self.grace - before.grace,
            charge_units: self.charge_units - before.charge_units,
        }
    }
}

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

/// One org's period: its seconds and the terms they are billed on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OrgTotals {
    pub org_id: String,
    pub stripe_customer_id: Option<String>,
    pub stripe_subscription_id: Option<String>,
    pub agent_seconds: i64,
    pub adjustment_seconds: i64,
    pub terms: Terms,
    /// Who paid for the period's agent seconds.
    pub funding: PeriodFunding,
    /// Who paid for its adjustment (time of the last closed period booked after it closed:
    /// funded in the open period).
    pub adjustment_funding: PeriodFunding,
}

/// One session's period, as the store reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
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
    plan_seconds: i64,
    grant_seconds: i64,
    grant_promo_seconds: i64,
    grant_make_good_seconds: i64,
    grant_trial_seconds: i64,
    grant_purchased_seconds: i64,
    overage_seconds: i64,
    overage_amount: String,
    grace_seconds: i64,
    adjustment_overage_seconds: i64,
    adjustment_overage_amount: String,
    plan_version: i64,
}

fn org_json<'a>(period: Interval, o: &'a OrgTotals) -> OrgJson<'a> {
    let c = charge(&o.terms, o.funding.overage, o.funding.charge_units);
    let f = &o.funding;
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
        unit_price: unit_price(o.terms.unit_price),
        amount: format!("{:.2}", c.amount),
        currency: &o.terms.currency,
        adjustment_seconds: o.adjustment_seconds,
        plan_seconds: o.agent_seconds - f.not_plan(),
        grant_seconds: f.grant_seconds(),
        grant_promo_seconds: f.grant[0],
        grant_make_good_seconds: f.grant[1],
        grant_trial_seconds: f.grant[2],
        grant_purchased_seconds: f.grant[3],
        overage_seconds: f.overage,
        overage_amount: format!("{:.2}", amount(f.charge_units)),
        grace_seconds: f.grace,
        adjustment_overage_seconds: o.adjustment_funding.overage,
        adjustment_overage_amount: format!("{:.2}", amount(o.adjustment_funding.charge_units)),
        plan_version: o.terms.plan_version,
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

named! {
    /// How an export is written.
    pub enum Format {
        Csv = "csv",
        Jsonl = "jsonl",
    }
}

impl Format {
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Csv => "text/csv; charset=utf-8",
            Format::Jsonl => "application/x-ndjson",
        }
    }

    pub fn extension(self) -> &'static str {
        self.as_str()
    }
}

named! {
    /// Which rows an export has.
    pub enum By {
        /// One line an org.
        Org = "org",
        /// One line a session.
        Session = "session",
    }
}

/// Export lines as they are written, in one format, taken a chunk at a time.
pub struct Lines {
    out: Out,
    /// A scratch buffer for the times of a CSV line.
    time: Vec<u8>,
}

enum Out {
    Csv(Box<csv::Writer<Vec<u8>>>),
    Jsonl(Vec<u8>),
}

/// Bytes a chunk is given room for before it is taken.
const ROOM: usize = 1 << 17;

/// RFC 4180: fields quoted only where they must be, lines ending in CRLF.
fn csv_writer() -> Box<csv::Writer<Vec<u8>>> {
    Box::new(
        csv::WriterBuilder::new()
            .terminator(csv::Terminator::CRLF)
            .from_writer(Vec::with_capacity(ROOM)),
    )
}

fn text(v: &Option<String>) -> &[u8] {
    v.as_deref().unwrap_or("").as_bytes()
}

impl Lines {
    pub fn new(format: Format) -> Lines {
        let out = match format {
            Format::Csv => Out::Csv(csv_writer()),
            Format::Jsonl => Out::Jsonl(Vec::with_capacity(ROOM)),
        };
        Lines {
            out,
            time: Vec::with_capacity(20),
        }
    }

    /// What comes before the first row: CSV's header line.
    pub fn header(&mut self, columns: &[&str]) {
        if let Out::Csv(w) = &mut self.out {
            w.write_record(columns).expect("writing to memory");
        }
    }

    /// Bytes written and not yet taken (a CSV writer's own buffer aside, at most 8 KiB).
    pub fn pending(&self) -> usize {
        match &self.out {
            Out::Csv(w) => w.get_ref().len(),
            Out::Jsonl(v) => v.len(),
        }
    }

    /// Everything written since the last take.
    pub fn take(&mut self) -> Vec<u8> {
        match &mut self.out {
            // The csv writer hands its bytes over only whole: a fresh one takes its place.
            Out::Csv(w) => std::mem::replace(w, csv_writer())
                .into_inner()
                .expect("writing to memory"),
            Out::Jsonl(v) => std::mem::take(v),
        }
    }

    pub fn org(&mut self, period: Interval, o: &OrgTotals) {
        let j = org_json(period, o);
        match &mut self.out {
            Out::Jsonl(v) => json_line(&j, v),
            Out::Csv(w) => w
                .write_record([
                    j.period_start.as_str(),
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
                    &j.plan_seconds.to_string(),
                    &j.grant_seconds.to_string(),
                    &j.grant_promo_seconds.to_string(),
                    &j.grant_make_good_seconds.to_string(),
                    &j.grant_trial_seconds.to_string(),
                    &j.grant_purchased_seconds.to_string(),
                    &j.overage_seconds.to_string(),
                    &j.overage_amount,
                    &j.grace_seconds.to_string(),
                    &j.adjustment_overage_seconds.to_string(),
                    &j.adjustment_overage_amount,
                    &j.plan_version.to_string(),
                ])
                .expect("writing to memory"),
        }
    }

    /// One session's line: the hot loop of a million-line export, so numbers and times are
    /// written without allocating.
    pub fn session(&mut self, s: &SessionLine) {
        match &mut self.out {
            Out::Jsonl(v) => json_line(
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
                v,
            ),
            Out::Csv(w) => {
                let mut int = itoa::Buffer::new();
                let field = "writing to memory";
                w.write_field(&s.session_id).expect(field);
                w.write_field(&s.org_id).expect(field);
                w.write_field(text(&s.project_id)).expect(field);
                w.write_field(text(&s.started_by)).expect(field);
                w.write_field(text(&s.agent)).expect(field);
                for n in [s.running_seconds, s.parked_seconds, s.spans] {
                    w.write_field(int.format(n)).expect(field);
                }
                for t in [s.first_start, s.last_end] {
                    self.time.clear();
                    if let Some(t) = t {
                        write_rfc3339(t, &mut self.time);
                    }
                    w.write_field(&self.time).expect(field);
                }
                w.write_field(text(&s.end_status)).expect(field);
                w.write_field(int.format(s.adjustment_seconds))
                    .expect(field);
                w.write_record(None::<&[u8]>).expect(field);
            }
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::charges::tests::terms;

    fn csv_of(f: impl FnOnce(&mut Lines)) -> String {
        let mut lines = Lines::new(Format::Csv);
        f(&mut lines);
        String::from_utf8(lines.take()).unwrap()
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
            // The 18 s past the plan paid as it went: 0.0025 at 0.50 an hour.
            funding: PeriodFunding {
                overage: 18,
                charge_units: 18 * 5000,
                ..PeriodFunding::default()
            },
            adjustment_funding: PeriodFunding::default(),
        };
        let csv = csv_of(|l| {
            l.header(&ORG_COLUMNS);
            l.org(period, &o);
        });
        assert_eq!(
            csv,
            "period_start,period_end,org_id,plan,stripe_customer_id,stripe_subscription_id,agent_seconds,agent_hours,included_hours,overage_hours,unit_price,amount,currency,adjustment_seconds,\
             plan_seconds,grant_seconds,grant_promo_seconds,grant_make_good_seconds,grant_trial_seconds,grant_purchased_seconds,\
             overage_seconds,overage_amount,grace_seconds,adjustment_overage_seconds,adjustment_overage_amount,plan_version\r\n\
             2026-11-01T00:00:00Z,2026-12-01T00:00:00Z,acme,pro,cus_1,,144018,40.0050,40.0000,0.0050,0.50,20.00,usd,7,\
             144000,0,0,0,0,0,18,0.00,0,0,0.00,1\r\n"
        );
        let mut lines = Lines::new(Format::Jsonl);
        lines.org(period, &o);
        let jsonl = lines.take();
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
        assert_eq!(
            csv_of(|l| l.session(&s)),
            "s,o,\"a,b\",\"say \"\"hi\"\"\",\"line\nbreak\",1,2,3,1970-01-01T00:00:00Z,,,0\r\n"
        );
    }
}
