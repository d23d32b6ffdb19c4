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
pub use requests::{check_overage, GrantAsk, GrantStatus, Invalid, MAX_GRANT_SECONDS};

mod requests;
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

#[cfg(test)]
mod tests;
