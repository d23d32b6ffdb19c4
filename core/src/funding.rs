//! Funding (DESIGN.md rule 9): which source pays for each billed second, fixed in the
//! transaction that books it. Pure: the store reads an org's funding state under the org's
//! row lock, `State::fund` attributes what the transaction books, and the store writes
//! the pieces and the new counters back before the lock is released.
//!
//! The order, second by second:
//! 1. the **plan**, while both the month and the week window containing the second have
//!    room (the ceilings count plan seconds only);
//! 2. **grants** in force at that second, by priority (0 first), then soonest expiry (none
//!    last), then oldest, then id;
//! 3. **pay-as-you-go**, if the org turned it on and its plan prices overage, up to the
//!    monthly cap in money;
//! 4. past every source, **grace**: what runs between the moment everything is spent and
//!    the moment a session parks (the plan's ceiling grace, heartbeats in flight). Grace is
//!    never charged, so the spend cap holds in money exactly; how much time it can hold is
//!    bounded (docs/funding.md).
//!
//! Time is funded in its own windows, so that each window's funds are its hours' (late
//! heartbeats included), except time booked after its month was closed or its
//! pay-as-you-go charged: that is funded from the first month still open (the floor), as
//! an adjustment (DESIGN.md rule 8).
//!
//! Money: an overage second costs the plan's `overage_unit_price` / 3600. Sums are kept
//! in charge units, price-seconds in ten-thousandths of the currency (seconds × price ×
//! 10⁴, whole since prices have at most 4 places), so no sum ever rounds; an amount is
//! rounded once, to the cent, half away from zero (`amount`).

use std::cmp::Ordering;
use std::collections::BTreeMap;

use rust_decimal::Decimal;

pub use crate::charges::{amount, money_units, price_units, UNITS_PER_HOUR};
use crate::ledger::split_hours;
use crate::plans::Plan;
use crate::time::{Interval, Secs, Windows};

named! {
    /// What pays for a billed second.
    pub enum Source {
        Plan = "plan",
        Grant = "grant",
        Overage = "overage",
        /// Past every source, before the session parked: not charged.
        Grace = "grace",
    }
}

named! {
    /// Why an org holds a grant of hours.
    pub enum GrantKind {
        Promo = "promo",
        MakeGood = "make_good",
        Trial = "trial",
        /// Bought as a top-up.
        Purchased = "purchased",
    }
}

named! {
    /// The two windows a ceiling counts in.
    pub enum WindowKind {
        Month = "month",
        Week = "week",
    }
}

/// Hours granted to an org.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    pub org_id: String,
    pub grant_id: String,
    pub kind: GrantKind,
    pub seconds: i64,
    pub used_seconds: i64,
    /// 0 is used first, 100 last.
    pub priority: i64,
    pub starts_at: Secs,
    pub expires_at: Option<Secs>,
    pub note: Option<String>,
    pub idempotency_key: Option<String>,
    pub created_at: Secs,
    pub voided_at: Option<Secs>,
    /// When (in ledger time) its last second was used.
    pub used_up_at: Option<Secs>,
}

/// The lowest and highest priority, and the one a grant gets when none is given.
pub const PRIORITIES: (i64, i64) = (0, 100);
pub const DEFAULT_PRIORITY: i64 = 50;

impl Grant {
    pub fn remaining(&self) -> i64 {
        if self.voided_at.is_some() {
            0
        } else {
            (self.seconds - self.used_seconds).max(0)
        }
    }

    /// May it fund the second at `t`: not voided, started, not expired.
    pub fn in_force(&self, t: Secs) -> bool {
        self.voided_at.is_none() && self.starts_at <= t && self.expires_at.is_none_or(|e| t < e)
    }

    /// Times inside `(from, to)` at which the grant starts or stops being in force.
    fn edges_within(&self, from: Secs, to: Secs) -> impl Iterator<Item = Secs> {
        [Some(self.starts_at), self.expires_at]
            .into_iter()
            .flatten()
            .filter(move |t| from < *t && *t < to)
    }
}

/// The order grants are used in: priority, soonest expiry (none last), oldest, id.
pub fn funding_order(a: &Grant, b: &Grant) -> Ordering {
    let expiry = |g: &Grant| g.expires_at.map_or((1, 0), |e| (0, e));
    a.priority
        .cmp(&b.priority)
        .then_with(|| expiry(a).cmp(&expiry(b)))
        .then_with(|| a.created_at.cmp(&b.created_at))
        .then_with(|| a.grant_id.cmp(&b.grant_id))
}

/// Pay-as-you-go as an org set it: a monthly cap in the plan's currency.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Overage {
    pub enabled: bool,
    pub monthly_cap: Decimal,
}

/// What a window has funded, by source.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Funds {
    pub plan: i64,
    pub grant: i64,
    pub overage: i64,
    pub grace: i64,
    /// Charge units of the overage seconds.
    pub charge_units: i64,
}

impl Funds {
    pub fn of(&self, source: Source) -> i64 {
        match source {
            Source::Plan => self.plan,
            Source::Grant => self.grant,
            Source::Overage => self.overage,
            Source::Grace => self.grace,
        }
    }

    fn add(&mut self, source: Source, seconds: i64, units: i64) {
        match source {
            Source::Plan => self.plan += seconds,
            Source::Grant => self.grant += seconds,
            Source::Overage => self.overage += seconds,
            Source::Grace => self.grace += seconds,
        }
        self.charge_units += units;
    }

    pub fn total(&self) -> i64 {
        self.plan + self.grant + self.overage + self.grace
    }

    /// The overage money of these funds.
    pub fn overage_amount(&self) -> Decimal {
        amount(self.charge_units)
    }
}

/// The terms funding follows: the effective plan's ceilings and price, the org's cap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Terms {
    pub month_limit: i64,
    pub week_limit: i64,
    /// Charge units of an overage second; 0 when pay-as-you-go is off.
    pub price_units: i64,
    /// The monthly cap in charge units (0 when pay-as-you-go is off).
    pub cap_units: i64,
}

impl Terms {
    /// Pay-as-you-go is on when the org turned it on and its plan prices overage.
    pub fn of(plan: &Plan, overage: &Overage) -> Terms {
        let price = price_units(plan.overage_unit_price).unwrap_or(0);
        let on = overage.enabled && price > 0;
        Terms {
            month_limit: plan.monthly_limit_seconds,
            week_limit: plan.weekly_limit_seconds,
            price_units: if on { price } else { 0 },
            cap_units: if on {
                money_units(overage.monthly_cap)
            } else {
                0
            },
        }
    }

    pub fn pay_as_you_go(&self) -> bool {
        self.price_units > 0
    }
}

/// One window's funds, with the window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowFunds {
    pub kind: WindowKind,
    pub window: Interval,
    pub funds: Funds,
}

/// A stretch of one session's billed time, paid by one source.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Piece {
    pub session_id: String,
    pub interval: Interval,
    pub source: Source,
    pub grant_id: Option<String>,
    pub charge_units: i64,
}

/// What the store reads of an org's funding: the windows it funded in, its open grants
/// (not voided, not used up, not expired), and whether it holds a grant in force at all
/// (used up or not: a denial then says `grants_exhausted`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recorded {
    pub windows: Vec<WindowFunds>,
    pub grants: Vec<Grant>,
    pub holds_grants: bool,
    /// Where funding is still open (`State::floor`).
    pub floor: Secs,
}

/// An org's funding state, read under its lock (or, for readers, as committed).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct State {
    pub terms: Terms,
    pub billing_period: Option<Interval>,
    /// Where funding is still open: a month whose period is closed, or whose pay-as-you-go
    /// was charged, never changes; time before this, booked late, is funded from here.
    pub floor: Secs,
    /// The windows read (and those funding opens), by kind and start.
    pub windows: BTreeMap<(WindowKind, Secs), WindowFunds>,
    /// The grants that may fund something, in funding order.
    pub grants: Vec<Grant>,
    /// A grant is in force (used up or not).
    pub holds_grants: bool,
}

impl State {
    /// The state of an org whose windows hold `windows` and who holds `grants`; time
    /// before `floor` is funded in the windows that start there.
    pub fn new(
        terms: Terms,
        billing_period: Option<Interval>,
        floor: Secs,
        windows: impl IntoIterator<Item = WindowFunds>,
        mut grants: Vec<Grant>,
    ) -> State {
        grants.sort_by(funding_order);
        let holds_grants = !grants.is_empty();
        State {
            terms,
            billing_period,
            floor,
            windows: windows
                .into_iter()
                .map(|w| ((w.kind, w.window.start), w))
                .collect(),
            grants,
            holds_grants,
        }
    }

    /// The same state on other terms (a plan the org pays for but may not use now).
    pub fn on_terms(&self, terms: Terms) -> State {
        State {
            terms,
            ..self.clone()
        }
    }

    /// A window nothing has funded yet in which `booked` seconds were booked before
    /// funding was recorded (a database from an earlier release): the plan's up to its
    /// ceiling, grace past it. A window with funds is left as it is.
    pub fn seed(&mut self, kind: WindowKind, window: Interval, booked: i64) {
        if booked <= 0 || self.windows.contains_key(&(kind, window.start)) {
            return;
        }
        let limit = match kind {
            WindowKind::Month => self.terms.month_limit,
            WindowKind::Week => self.terms.week_limit,
        };
        let plan = booked.min(limit.max(0));
        let funds = Funds {
            plan,
            grace: booked - plan,
            ..Funds::default()
        };
        self.windows.insert(
            (kind, window.start),
            WindowFunds {
                kind,
                window,
                funds,
            },
        );
    }

    /// Running sessions' time up to `t` that is not booked yet, attributed as it will be
    /// (all of it in the windows of `t`): what the gate and every reader count.
    /// Returns how many of them each source pays for.
    pub fn project(&mut self, t: Secs, seconds: i64) -> BTreeMap<Source, i64> {
        let w = self.windows_at(t);
        let mut left = seconds;
        let mut out = BTreeMap::new();
        while left > 0 {
            let piece = self.fund_one("", t, t + left, &w);
            left -= piece.interval.len();
            *out.entry(piece.source).or_default() += piece.interval.len();
        }
        out
    }

    /// The windows a second at `t` is funded in.
    pub fn windows_at(&self, t: Secs) -> Windows {
        Windows::at(t.max(self.floor), self.billing_period)
    }

    /// Every window `intervals` are funded in: what the store reads before `fund`.
    pub fn windows_needed<'a>(
        floor: Secs,
        billing_period: Option<Interval>,
        intervals: impl IntoIterator<Item = &'a Interval>,
    ) -> Vec<(WindowKind, Interval)> {
        let mut out: BTreeMap<(WindowKind, Secs), Interval> = BTreeMap::new();
        for i in intervals {
            let mut t = i.start.max(floor);
            loop {
                let w = Windows::at(t, billing_period);
                out.insert((WindowKind::Month, w.month.start), w.month);
                out.insert((WindowKind::Week, w.week.start), w.week);
                t = w.month.end.min(w.week.end);
                if t >= i.end {
                    break;
                }
            }
        }
        out.into_iter().map(|((k, _), w)| (k, w)).collect()
    }

    /// The funds of a window (zero if nothing was funded in it yet).
    pub fn funds(&self, kind: WindowKind, window: Interval) -> Funds {
        self.windows
            .get(&(kind, window.start))
            .map_or_else(Funds::default, |w| w.funds)
    }

    fn window_mut(&mut self, kind: WindowKind, window: Interval) -> &mut Funds {
        &mut self
            .windows
            .entry((kind, window.start))
            .or_insert(WindowFunds {
                kind,
                window,
                funds: Funds::default(),
            })
            .funds
    }

    /// Plan seconds left in both windows of `w`.
    pub fn plan_room(&self, w: &Windows) -> i64 {
        let month = self.terms.month_limit - self.funds(WindowKind::Month, w.month).plan;
        let week = self.terms.week_limit - self.funds(WindowKind::Week, w.week).plan;
        month.min(week).max(0)
    }

    /// Overage seconds the cap still allows in the month of `w`.
    pub fn overage_room(&self, w: &Windows) -> i64 {
        if !self.terms.pay_as_you_go() {
            return 0;
        }
        let spent = self.funds(WindowKind::Month, w.month).charge_units;
        ((self.terms.cap_units - spent) / self.terms.price_units).max(0)
    }

    /// Seconds left in grants in force at `t`.
    pub fn grant_room(&self, t: Secs) -> i64 {
        self.grants
            .iter()
            .filter(|g| g.in_force(t))
            .map(Grant::remaining)
            .sum()
    }

    /// The source that pays for the next second at `t`, and how many seconds it has left
    /// (`None`: everything is spent, what runs now is grace).
    pub fn next_source(&self, t: Secs) -> Option<(Source, i64)> {
        let w = self.windows_at(t);
        let plan = self.plan_room(&w);
        if plan > 0 {
            return Some((Source::Plan, plan));
        }
        if let Some(g) = self
            .grants
            .iter()
            .find(|g| g.in_force(t) && g.remaining() > 0)
        {
            return Some((Source::Grant, g.remaining()));
        }
        let overage = self.overage_room(&w);
        (overage > 0).then_some((Source::Overage, overage))
    }

    /// Agent time left at `t` from every source together.
    pub fn remaining_at(&self, t: Secs) -> i64 {
        let w = self.windows_at(t);
        self.plan_room(&w) + self.grant_room(t) + self.overage_room(&w)
    }

    /// Attribute a session's billed `interval`: split where a window, the floor or a
    /// grant's validity changes, then paid by each source in order for as long as it has
    /// room. Updates the windows' funds and the grants' use; returns the pieces.
    pub fn fund(&mut self, session_id: &str, interval: Interval) -> Vec<Piece> {
        let mut pieces = Vec::new();
        let mut t = interval.start;
        while t < interval.end {
            let w = self.windows_at(t);
            let mut stop = interval.end.min(w.month.end).min(w.week.end);
            if t < self.floor {
                stop = stop.min(self.floor);
            }
            for g in &self.grants {
                if let Some(e) = g.edges_within(t, stop).min() {
                    stop = stop.min(e);
                }
            }
            while t < stop {
                let piece = self.fund_one(session_id, t, stop, &w);
                t = piece.interval.end;
                pieces.push(piece);
            }
        }
        pieces
    }

    /// One piece of `[t, stop)` (which lies in windows `w` and in one validity of every
    /// grant): as much as the first source with room pays.
    fn fund_one(&mut self, session_id: &str, t: Secs, stop: Secs, w: &Windows) -> Piece {
        let want = stop - t;
        let plan = self.plan_room(w);
        let grant = self
            .grants
            .iter()
            .position(|g| g.in_force(t) && g.remaining() > 0);
        let overage = self.overage_room(w);
        let (source, take, grant_id) = if plan > 0 {
            (Source::Plan, want.min(plan), None)
        } else if let Some(i) = grant {
            let g = &mut self.grants[i];
            let take = want.min(g.remaining());
            g.used_seconds += take;
            if g.remaining() == 0 {
                g.used_up_at = Some(t + take);
            }
            (Source::Grant, take, Some(g.grant_id.clone()))
        } else if overage > 0 {
            (Source::Overage, want.min(overage), None)
        } else {
            (Source::Grace, want, None)
        };
        let units = if source == Source::Overage {
            take * self.terms.price_units
        } else {
            0
        };
        self.window_mut(WindowKind::Month, w.month)
            .add(source, take, units);
        self.window_mut(WindowKind::Week, w.week)
            .add(source, take, units);
        Piece {
            session_id: session_id.to_owned(),
            interval: Interval {
                start: t,
                end: t + take,
            },
            source,
            grant_id,
            charge_units: units,
        }
    }
}

/// Seconds and charge units of the pieces that are not the plan's, by `(hour, source,
/// grant id or "")`: the hourly funding rollup (plan seconds are the rest of the hour).
pub fn hourly(pieces: &[Piece]) -> BTreeMap<(Secs, Source, String), (i64, i64)> {
    let mut out: BTreeMap<(Secs, Source, String), (i64, i64)> = BTreeMap::new();
    for p in pieces.iter().filter(|p| p.source != Source::Plan) {
        let per_second = p.charge_units / p.interval.len();
        for (hour, secs) in split_hours(p.interval) {
            let e = out
                .entry((hour, p.source, p.grant_id.clone().unwrap_or_default()))
                .or_default();
            e.0 += secs;
            e.1 += secs * per_second;
        }
    }
    out
}

/// What every reader shows of one window: booked funds plus running sessions' time up to
/// now, attributed as it will be.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Split {
    pub plan: i64,
    pub grant: i64,
    pub overage: i64,
    pub grace: i64,
    pub overage_amount: Decimal,
}

impl Split {
    /// The split of a window whose total use (booked and provisional) is `used`, from its
    /// funds: plan is the rest, so the sources add up to `used` exactly.
    pub fn of(used: i64, funds: &Funds) -> Split {
        let (grant, overage, grace) = (funds.grant, funds.overage, funds.grace);
        Split {
            plan: used - grant - overage - grace,
            grant,
            overage,
            grace,
            overage_amount: funds.overage_amount(),
        }
    }
}

/// When running sessions are told to park: everything is spent and the grace of a window
/// whose plan is spent has run the plan's `ceiling_grace_seconds`.
pub fn must_park(state: &State, t: Secs, grace: i64) -> bool {
    if state.remaining_at(t) > 0 {
        return false;
    }
    let w = state.windows_at(t);
    let month = state.funds(WindowKind::Month, w.month);
    let week = state.funds(WindowKind::Week, w.week);
    (month.plan >= state.terms.month_limit && month.grace >= grace)
        || (week.plan >= state.terms.week_limit && week.grace >= grace)
}

/// A request refused: the field at fault and what to fix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Invalid {
    pub field: &'static str,
    pub message: String,
}

fn invalid<T>(field: &'static str, message: impl Into<String>) -> Result<T, Invalid> {
    Err(Invalid {
        field,
        message: message.into(),
    })
}

/// The most a grant may hold: 100,000 hours.
pub const MAX_GRANT_SECONDS: i64 = 100_000 * 3600;

/// A grant as asked for, before it is checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GrantAsk {
    pub seconds: i64,
    pub kind: GrantKind,
    pub priority: Option<i64>,
    pub starts_at: Option<Secs>,
    pub expires_at: Option<Secs>,
    pub note: Option<String>,
    pub idempotency_key: Option<String>,
}

impl GrantAsk {
    /// The grant to make at `now`, or what is wrong with the ask.
    pub fn check(self, org_id: &str, grant_id: &str, now: Secs) -> Result<Grant, Invalid> {
        if !(1..=MAX_GRANT_SECONDS).contains(&self.seconds) {
            return invalid(
                "seconds",
                format!(
                    "seconds must be 1 to {MAX_GRANT_SECONDS} (100,000 hours); got {}",
                    self.seconds
                ),
            );
        }
        let priority = self.priority.unwrap_or(DEFAULT_PRIORITY);
        if !(PRIORITIES.0..=PRIORITIES.1).contains(&priority) {
            return invalid(
                "priority",
                format!("priority must be 0 (used first) to 100 (used last); got {priority}"),
            );
        }
        let starts_at = self.starts_at.unwrap_or(now);
        if let Some(e) = self.expires_at {
            if e <= starts_at {
                return invalid(
                    "expires_at",
                    "expires_at must be after starts_at (default: now)",
                );
            }
        }
        if let Some(note) = &self.note {
            if note.chars().count() > 500 {
                return invalid("note", "note must be at most 500 characters");
            }
        }
        if let Some(key) = &self.idempotency_key {
            if key.is_empty() || key.len() > 200 || !key.chars().all(|c| c.is_ascii_graphic()) {
                return invalid(
                    "idempotency_key",
                    "idempotency_key must be 1 to 200 printable ASCII characters",
                );
            }
        }
        Ok(Grant {
            org_id: org_id.to_owned(),
            grant_id: grant_id.to_owned(),
            kind: self.kind,
            seconds: self.seconds,
            used_seconds: 0,
            priority,
            starts_at,
            expires_at: self.expires_at,
            note: self.note,
            idempotency_key: self.idempotency_key,
            created_at: now,
            voided_at: None,
            used_up_at: None,
        })
    }

    /// Whether `first`, made earlier under this ask's idempotency key, is what it asks for.
    pub fn matches(&self, first: &Grant) -> bool {
        self.seconds == first.seconds
            && self.kind == first.kind
            && self.priority.unwrap_or(DEFAULT_PRIORITY) == first.priority
            && self.starts_at.is_none_or(|s| s == first.starts_at)
            && self.expires_at == first.expires_at
            && self.note == first.note
    }
}

named! {
    /// Where a grant stands at a moment.
    pub enum GrantStatus {
        /// Funding now, or ready to.
        Active = "active",
        /// Starts later.
        Scheduled = "scheduled",
        UsedUp = "used_up",
        Expired = "expired",
        Voided = "voided",
    }
}

impl Grant {
    pub fn status(&self, t: Secs) -> GrantStatus {
        if self.voided_at.is_some() {
            GrantStatus::Voided
        } else if self.expires_at.is_some_and(|e| e <= t) {
            GrantStatus::Expired
        } else if self.used_seconds >= self.seconds {
            GrantStatus::UsedUp
        } else if self.starts_at > t {
            GrantStatus::Scheduled
        } else {
            GrantStatus::Active
        }
    }
}

/// Pay-as-you-go as asked for on `plan`: it must offer it, and a cap in cents at most
/// its `overage_cap_max` is required to turn it on.
pub fn check_overage(plan: &Plan, enabled: bool, cap: Option<Decimal>) -> Result<Overage, Invalid> {
    if enabled && !plan.offers_overage() {
        return invalid(
            "enabled",
            format!(
                "the {} plan offers no pay-as-you-go; upgrade to a plan that does",
                plan.name
            ),
        );
    }
    let cap = match (enabled, cap) {
        (true, None) => {
            return invalid(
                "monthly_cap",
                "monthly_cap is required to turn pay-as-you-go on, e.g. \"50.00\"",
            )
        }
        (_, Some(c)) => c,
        (false, None) => Decimal::ZERO,
    };
    if cap.is_sign_negative() || cap.round_dp(2) != cap {
        return invalid(
            "monthly_cap",
            format!("monthly_cap must be an amount of 0 or more, in cents at most (got {cap})"),
        );
    }
    if enabled && cap > plan.overage_cap_max {
        return invalid(
            "monthly_cap",
            format!(
                "monthly_cap may be at most {} {} on the {} plan (got {cap})",
                plan.overage_cap_max, plan.currency, plan.name
            ),
        );
    }
    Ok(Overage {
        enabled,
        monthly_cap: cap,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: Secs = 86_400;
    /// Monday 2026-11-30 00:00 UTC.
    const MON: Secs = 1_795_996_800;

    fn terms(month: i64, week: i64, price: i64, cap: i64) -> Terms {
        Terms {
            month_limit: month,
            week_limit: week,
            price_units: price,
            cap_units: cap,
        }
    }

    fn grant(id: &str, seconds: i64, priority: i64, expires_at: Option<Secs>) -> Grant {
        Grant {
            org_id: "o".into(),
            grant_id: id.into(),
            kind: GrantKind::Promo,
            seconds,
            used_seconds: 0,
            priority,
            starts_at: 0,
            expires_at,
            note: None,
            idempotency_key: None,
            created_at: 0,
            voided_at: None,
            used_up_at: None,
        }
    }

    /// A state whose floor is the month of `now`.
    fn state(t: Terms, now: Secs, grants: Vec<Grant>) -> State {
        let floor = crate::time::calendar_month(now).start;
        State::new(t, None, floor, [], grants)
    }

    fn sources(pieces: &[Piece]) -> Vec<(Source, i64, Option<&str>)> {
        pieces
            .iter()
            .map(|p| (p.source, p.interval.len(), p.grant_id.as_deref()))
            .collect()
    }

    #[test]
    fn monday_is_a_monday() {
        assert_eq!(crate::time::iso_week(MON).start, MON);
    }

    #[test]
    fn plan_then_grants_by_priority_then_overage_then_grace() {
        let now = MON + DAY;
        let mut s = state(
            terms(100, 100, 2, 40),
            now,
            vec![grant("late", 10, 60, None), grant("first", 10, 10, None)],
        );
        let pieces = s.fund("s", Interval::new(now, now + 150).unwrap());
        assert_eq!(
            sources(&pieces),
            [
                (Source::Plan, 100, None),
                (Source::Grant, 10, Some("first")),
                (Source::Grant, 10, Some("late")),
                (Source::Overage, 20, None),
                (Source::Grace, 10, None),
            ]
        );
        let w = s.windows_at(now);
        let m = s.funds(WindowKind::Month, w.month);
        assert_eq!(
            (m.plan, m.grant, m.overage, m.grace, m.charge_units),
            (100, 20, 20, 10, 40)
        );
        assert_eq!(m.total(), 150);
        assert_eq!(s.remaining_at(now), 0);
    }

    #[test]
    fn the_weekly_ceiling_limits_plan_hours_only() {
        let now = MON + DAY;
        let mut s = state(terms(1000, 50, 0, 0), now, vec![grant("g", 30, 50, None)]);
        let p = s.fund("s", Interval::new(now, now + 100).unwrap());
        assert_eq!(
            sources(&p),
            [
                (Source::Plan, 50, None),
                (Source::Grant, 30, Some("g")),
                (Source::Grace, 20, None)
            ]
        );
        // Next week the plan pays again: the month has room.
        let next = MON + 7 * DAY;
        let p = s.fund("s", Interval::new(next, next + 10).unwrap());
        assert_eq!(sources(&p), [(Source::Plan, 10, None)]);
    }

    #[test]
    fn a_grant_funds_only_while_in_force() {
        let now = MON + DAY;
        let mut g = grant("g", 1000, 50, Some(now + 30));
        g.starts_at = now + 10;
        let mut s = state(terms(0, 0, 0, 0), now, vec![g]);
        let p = s.fund("s", Interval::new(now, now + 50).unwrap());
        assert_eq!(
            sources(&p),
            [
                (Source::Grace, 10, None),
                (Source::Grant, 20, Some("g")),
                (Source::Grace, 20, None)
            ]
        );
        assert_eq!(s.grants[0].used_seconds, 20);
    }

    #[test]
    fn soonest_expiry_then_oldest_break_ties_of_priority() {
        let mut a = grant("a", 5, 50, None);
        let b = grant("b", 5, 50, Some(1_000_000));
        let mut c = grant("c", 5, 50, None);
        a.created_at = 2;
        c.created_at = 1;
        let mut v = [a, b, c];
        v.sort_by(funding_order);
        let ids: Vec<_> = v.iter().map(|g| g.grant_id.as_str()).collect();
        assert_eq!(ids, ["b", "c", "a"]);
    }

    #[test]
    fn a_span_across_a_week_boundary_is_funded_in_each_week() {
        let sunday = MON + 6 * DAY;
        let end = MON + 7 * DAY;
        let mut s = state(terms(1000, 40, 0, 0), sunday, vec![]);
        s.fund("s", Interval::new(end - 30, end).unwrap());
        let p = s.fund("s", Interval::new(end - 20, end + 20).unwrap());
        assert_eq!(
            sources(&p),
            [
                (Source::Plan, 10, None),
                (Source::Grace, 10, None),
                (Source::Plan, 20, None)
            ]
        );
    }

    #[test]
    fn late_time_is_funded_in_its_own_windows_until_its_month_is_closed() {
        let dec = 1_796_083_200;
        let mut open = State::new(terms(100, 100, 0, 0), None, 0, [], vec![]);
        open.fund("s", Interval::new(dec - 10, dec + 5).unwrap());
        let nov = crate::time::calendar_month(dec - 1);
        assert_eq!(open.funds(WindowKind::Month, nov).plan, 10);
        // November closed: its late time is funded in December.
        let mut s = state(terms(100, 100, 0, 0), dec + 60, vec![]);
        assert_eq!(s.floor, dec);
        let p = s.fund("s", Interval::new(dec - 10, dec + 5).unwrap());
        assert_eq!(
            sources(&p),
            [(Source::Plan, 10, None), (Source::Plan, 5, None)]
        );
        let nov = crate::time::calendar_month(dec - 1);
        assert_eq!(s.funds(WindowKind::Month, nov), Funds::default());
        let w = s.windows_at(dec);
        assert_eq!(s.funds(WindowKind::Month, w.month).plan, 15);
    }

    #[test]
    fn the_cap_is_never_passed_in_money() {
        let now = MON + DAY;
        // 0.35 an hour: 3500 units a second; a cap of 1.00 is 36,000,000 units.
        let cap = money_units(Decimal::new(100, 2));
        let mut s = state(terms(0, 0, 3500, cap), now, vec![]);
        let p = s.fund("s", Interval::new(now, now + 20_000).unwrap());
        let overage = p.iter().find(|p| p.source == Source::Overage).unwrap();
        assert_eq!(overage.interval.len(), 10_285);
        let w = s.windows_at(now);
        let m = s.funds(WindowKind::Month, w.month);
        assert!(m.overage_amount() <= Decimal::new(100, 2));
        assert_eq!(m.overage_amount(), Decimal::new(100, 2));
        assert_eq!(m.grace, 20_000 - 10_285);
    }

    #[test]
    fn prices_and_amounts_are_exact() {
        assert_eq!(price_units("0.35".parse().unwrap()), Some(3500));
        assert_eq!(price_units("0.12345".parse().unwrap()), None);
        // 36 s at 0.50 an hour is half a cent: rounds away from zero.
        assert_eq!(amount(36 * 5000), "0.01".parse::<Decimal>().unwrap());
        assert_eq!(amount(35 * 5000), Decimal::ZERO);
    }

    #[test]
    fn park_once_spent_and_the_grace_has_run() {
        let now = MON + DAY;
        let mut s = state(terms(100, 100, 0, 0), now, vec![]);
        s.fund("s", Interval::new(now, now + 100).unwrap());
        assert!(!must_park(&s, now + 100, 30));
        s.fund("s", Interval::new(now + 100, now + 129).unwrap());
        assert!(!must_park(&s, now + 129, 30));
        s.fund("s", Interval::new(now + 129, now + 130).unwrap());
        assert!(must_park(&s, now + 130, 30));
        // No grace: at once.
        let mut s = state(terms(100, 100, 0, 0), now, vec![]);
        s.fund("s", Interval::new(now, now + 100).unwrap());
        assert!(must_park(&s, now + 100, 0));
    }

    #[test]
    fn the_hourly_rollup_holds_what_is_not_the_plans() {
        let now = MON + DAY;
        let mut s = state(terms(10, 10, 5000, money_units(Decimal::ONE)), now, vec![]);
        let p = s.fund("s", Interval::new(now + 3590, now + 3620).unwrap());
        let h = hourly(&p);
        assert_eq!(h.len(), 1);
        let ((hour, source, _), (secs, units)) = h.into_iter().next().unwrap();
        assert_eq!(
            (hour, source, secs, units),
            (now + 3600, Source::Overage, 20, 100_000)
        );
    }
}
