//! A group of admissions decided in one transaction, one request after another, exactly
//! as if each were alone: each allowed one takes its slot before the next is looked at.

use std::collections::{BTreeSet, HashMap};

use super::{
    decide, funded_by, upgrade_for, AdmissionRequest, AdmitReject, Decision, Facts, LimitFigures,
    Reason, Rule, Verdict,
};
use crate::funding;
use crate::ledger::Phase;
use crate::members::{spent_limit, Limit, LimitKind, MemberUsage};
use crate::org::{effective_concurrency_limit, Key, Org};
use crate::plans::{Plan, Plans};
use crate::session::{key as session_key, Session, SessionKey};
use crate::standing::{funding_state_on, WindowTotals, WindowUsage};
use crate::time::{Secs, Windows};

/// Does this session hold one of its key's slots at `now`? A running session does while it
/// is heard from within the lease; an admitted (or resumed) one from its admission until it
/// is next heard from, or the lease passes. Parked, silent and ended sessions hold none.
///
/// Heard from means a heartbeat applied by the meter's clock (`heard_at`), never the
/// reporter's: a host whose clock runs late cannot make its sessions look gone. A heartbeat
/// in the very second of the admission keeps the slot (the safe side).
pub fn holds_slot(s: &Session, now: Secs, lease: Secs) -> bool {
    let phase = s.ledger.phase;
    let heard = s.heard_at.unwrap_or(s.ledger.last_at);
    let running = phase == Phase::Running && heard >= now - lease;
    let admitted_unheard = phase != Phase::Ended
        && s.slot_at.is_some_and(|a| {
            a >= now - lease && (phase == Phase::Admitted || s.heard_at.is_none_or(|h| h <= a))
        });
    running || admitted_unheard
}

/// Everything a group of admissions is decided from, read in the transaction that holds
/// the locks of every key (and session) the group names.
#[derive(Debug, Default)]
pub struct GroupFacts {
    pub orgs: HashMap<String, Org>,
    pub keys: HashMap<(String, String), Key>,
    /// The named sessions that exist, locked, by org and id.
    pub sessions: HashMap<SessionKey, Session>,
    /// Slots held per key, by every session of the key (the SQL twin of `holds_slot`).
    pub slots: HashMap<(String, String), i64>,
    /// Window usage per org, in the windows `Windows::at(now, billing period)` gives.
    pub usage: HashMap<String, WindowTotals>,
    /// What is recorded of each org's funding.
    pub funding: HashMap<String, funding::Recorded>,
    /// Each org's limits on its users, projects and keys (orgs without any are absent).
    pub limits: HashMap<String, Vec<Limit>>,
    /// What the members of those orgs used in their windows, running sessions counted.
    pub member_usage: HashMap<String, MemberUsage>,
}

/// The members a run runs as: its key, and its project and user as asked or, for a resume
/// that leaves them out, as its session has them (`take_slot` keeps them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunMembers<'a> {
    pub key: &'a str,
    pub project: Option<&'a str>,
    pub user: Option<&'a str>,
}

impl<'a> RunMembers<'a> {
    pub fn of(req: &'a AdmissionRequest, session: Option<&'a Session>) -> RunMembers<'a> {
        let kept = |asked: &'a Option<String>, stored: fn(&Session) -> &Option<String>| {
            asked
                .as_deref()
                .or_else(|| session.and_then(|s| stored(s).as_deref()))
        };
        RunMembers {
            key: &req.key_id,
            project: kept(&req.project_id, |s| &s.project_id),
            user: kept(&req.started_by, |s| &s.started_by),
        }
    }

    /// Every member named: the key, then the project and the user where there are any.
    pub fn all(self) -> impl Iterator<Item = &'a str> {
        [Some(self.key), self.project, self.user]
            .into_iter()
            .flatten()
    }
}

/// The org's limits that apply to a run: on its user, its project and its key.
fn limits_of(limits: &[Limit], run: RunMembers) -> Vec<Limit> {
    limits
        .iter()
        .filter(|l| {
            let member = match l.kind {
                LimitKind::User => run.user,
                LimitKind::Project => run.project,
                LimitKind::Key => Some(run.key),
            };
            member == Some(l.member_id.as_str())
        })
        .cloned()
        .collect()
}

/// What a group decides: an answer per request, and the session rows to write.
#[derive(Debug, Default)]
pub struct GroupOutcome {
    pub answers: Vec<Result<Decision, AdmitReject>>,
    /// Sessions the group creates, in id order.
    pub created: Vec<Session>,
    /// Sessions that existed and are given a slot (resumed), as they stand after the group.
    pub resumed: Vec<Session>,
}

/// Decide `requests` one after another, as if each were alone in its own transaction:
/// each allowed one takes its slot before the next is looked at, so a group is exact.
pub fn decide_group(
    plans: &Plans,
    requests: &[AdmissionRequest],
    mut facts: GroupFacts,
    now: Secs,
    lease: Secs,
    mut decision_id: impl FnMut() -> String,
) -> GroupOutcome {
    let mut made = Made::default();
    let answers = requests
        .iter()
        .map(|req| {
            let (decision, slot) = decide_one(plans, req, &facts, now, lease, &mut decision_id)?;
            if decision.rule == Rule::WithinLimits {
                made.take_slot(&mut facts, req, slot, now);
            }
            Ok(decision)
        })
        .collect();
    let row = |k: &SessionKey| facts.sessions[k].clone();
    GroupOutcome {
        answers,
        created: made.created.iter().map(row).collect(),
        resumed: made.resumed.iter().map(row).collect(),
    }
}

/// The sessions a group creates and resumes, by org and id.
#[derive(Default)]
struct Made {
    created: BTreeSet<SessionKey>,
    resumed: BTreeSet<SessionKey>,
}

impl Made {
    /// An allowed request takes its slot in `facts`, so that the next request sees it: the
    /// key's count goes up (and down on the key the session moves from), and the session is
    /// created or resumed.
    fn take_slot(&mut self, facts: &mut GroupFacts, req: &AdmissionRequest, slot: Slot, now: Secs) {
        *facts.slots.entry(slot.key).or_default() += 1;
        if let Some(n) = slot.moved_from.and_then(|k| facts.slots.get_mut(&k)) {
            *n -= 1;
        }
        let k = session_key(&req.org_id, &req.session_id);
        if !facts.sessions.contains_key(&k) {
            self.created.insert(k.clone());
        } else if !self.created.contains(&k) {
            self.resumed.insert(k.clone());
        }
        let row = facts
            .sessions
            .entry(k)
            .or_insert_with(|| admitted_row(req, now));
        take_slot(row, req, now);
    }
}

/// The slot a request asks for: its key's, and the key its session holds a slot of now,
/// if another.
struct Slot {
    key: (String, String),
    moved_from: Option<(String, String)>,
}

/// What a request names that exists: its org, key and session (if any), or why it is
/// refused before any rule.
fn named<'f>(
    req: &AdmissionRequest,
    facts: &'f GroupFacts,
) -> Result<(&'f Org, &'f Key, Option<&'f Session>), AdmitReject> {
    let org = facts.orgs.get(&req.org_id).ok_or(AdmitReject::UnknownOrg)?;
    let key_id = (req.org_id.clone(), req.key_id.clone());
    let key = facts.keys.get(&key_id).ok_or(AdmitReject::UnknownKey)?;
    let session = facts
        .sessions
        .get(&session_key(&req.org_id, &req.session_id));
    if session.is_some_and(|s| s.ledger.phase == Phase::Ended) {
        return Err(AdmitReject::SessionEnded);
    }
    Ok((org, key, session))
}

/// One request decided against the group's facts as they stand: the decision, and the
/// slot it takes if allowed.
fn decide_one(
    plans: &Plans,
    req: &AdmissionRequest,
    facts: &GroupFacts,
    now: Secs,
    lease: Secs,
    decision_id: &mut impl FnMut() -> String,
) -> Result<(Decision, Slot), AdmitReject> {
    let (org, key, session) = named(req, facts)?;
    let holds = session.is_some_and(|s| holds_slot(s, now, lease));
    // Rule 1 is a slot of this key. A session holding another key's slot (or running
    // unadmitted, on none) asked for under this one moves to it: decided against this
    // key, and, if allowed, its slot leaves the other key.
    let own = holds && session.is_some_and(|s| s.key_id.as_deref() == Some(&req.key_id));
    let slot = Slot {
        key: (req.org_id.clone(), req.key_id.clone()),
        moved_from: session
            .filter(|_| holds && !own)
            .and_then(|s| s.key_id.clone())
            .map(|k| (req.org_id.clone(), k)),
    };
    let slots = facts.slots.get(&slot.key).copied().unwrap_or(0);
    let on = OrgOn {
        org,
        key,
        used: facts.usage.get(&req.org_id).copied().unwrap_or_default(),
        recorded: facts.funding.get(&req.org_id).cloned().unwrap_or_default(),
        windows: Windows::at(now, org.billing_period()),
        now,
    };
    let (paid, access) = org.plan_access(plans, now);
    let plan = if access.grants_plan() {
        paid
    } else {
        plans.free()
    };
    let (month, week, limit, state) = on.plan(plan);
    let applicable = facts
        .limits
        .get(&req.org_id)
        .map(|l| limits_of(l, RunMembers::of(req, session)))
        .unwrap_or_default();
    let no_usage = MemberUsage::new();
    let usage = facts.member_usage.get(&req.org_id).unwrap_or(&no_usage);
    let spent_member = spent_limit(&applicable, usage);
    let f = Facts {
        suspended: org.suspended,
        plan,
        month: &month,
        week: &week,
        running: slots - i64::from(own),
        limit,
        holds_slot: own,
        funding: &state,
        now,
        spent_limit: spent_member.map(|l| l.kind),
    };
    let mut rule = decide(&f);
    // Refused on Free's terms, where the plan it pays for would allow it: the fix is to
    // pay, not to upgrade.
    if !access.grants_plan()
        && matches!(rule, Rule::Denied(r) if r != Reason::OrgSuspended)
        && on.would_allow(paid, &f)
    {
        rule = Rule::Denied(Reason::SubscriptionInactive);
    }
    let figures = spent_member
        .filter(|_| !rule.allows())
        .map(|l| limit_figures(l, usage));
    let decision = record(plans, req, &f, rule, figures, decision_id());
    Ok((decision, slot))
}

/// An org's figures at a decision, and how they stand on a plan.
struct OrgOn<'f> {
    org: &'f Org,
    key: &'f Key,
    used: WindowTotals,
    recorded: funding::Recorded,
    windows: Windows,
    now: Secs,
}

impl OrgOn<'_> {
    /// The windows, the key's concurrency and the funding on `plan`.
    fn plan(&self, plan: &Plan) -> (WindowUsage, WindowUsage, i64, funding::State) {
        let (used, windows) = (&self.used, &self.windows);
        let month = WindowUsage::new(windows.month, used.month, plan.monthly_limit_seconds);
        let week = WindowUsage::new(windows.week, used.week, plan.weekly_limit_seconds);
        let state = funding_state_on(self.org, plan, self.now, self.recorded.clone(), used);
        (
            month,
            week,
            effective_concurrency_limit(self.key.concurrency_limit, plan),
            state,
        )
    }

    /// Whether the `paid` plan would allow what `f` (on Free's terms) refused.
    fn would_allow(&self, paid: &Plan, f: &Facts) -> bool {
        let (m, w, limit, paid_state) = self.plan(paid);
        let on_paid = Facts {
            plan: paid,
            month: &m,
            week: &w,
            limit,
            funding: &paid_state,
            ..f.clone()
        };
        decide(&on_paid).allows()
    }
}

/// A spent limit's figures, as a denial records them.
fn limit_figures(l: &Limit, usage: &MemberUsage) -> LimitFigures {
    let used = usage
        .get(&(l.kind.dimension(), l.member_id.clone()))
        .copied()
        .unwrap_or_default();
    LimitFigures {
        kind: l.kind,
        member_id: l.member_id.clone(),
        month_used: used.0,
        month_limit: l.monthly_seconds(),
        week_used: used.1,
        week_limit: l.weekly_seconds(),
    }
}

/// The decision `rule` makes of `req` on facts `f`, as it is recorded and answered.
fn record(
    plans: &Plans,
    req: &AdmissionRequest,
    f: &Facts,
    rule: Rule,
    limit: Option<LimitFigures>,
    decision_id: String,
) -> Decision {
    let (source, rooms) = funded_by(f.funding, f.now);
    let (reason, upgrade) = match rule {
        Rule::Denied(r) => (Some(r), upgrade_for(plans, r, f).map(|p| p.id.clone())),
        _ => (None, None),
    };
    let (month, week) = (f.month, f.week);
    Decision {
        org_id: req.org_id.clone(),
        decision_id,
        decided_at: f.now,
        session_id: req.session_id.clone(),
        key_id: req.key_id.clone(),
        decision: if rule.allows() {
            Verdict::Allow
        } else {
            Verdict::Deny
        },
        reason,
        rule,
        plan_id: f.plan.id.clone(),
        plan_version: f.plan.version,
        suspended: f.suspended,
        month_start: month.start,
        month_end: month.end,
        month_used: month.used_seconds,
        month_limit: month.limit_seconds,
        week_start: week.start,
        week_end: week.end,
        week_used: week.used_seconds,
        week_limit: week.limit_seconds,
        running: f.running + i64::from(rule.allows()),
        concurrency_limit: f.limit,
        upgrade_plan: upgrade,
        funded_by: source.filter(|_| rule.allows()),
        plan_room: rooms.plan,
        grant_room: rooms.grant,
        overage_room: rooms.overage,
        limit,
    }
}

/// A session the gate admits before any heartbeat: it holds its slot from `now`.
fn admitted_row(req: &AdmissionRequest, now: Secs) -> Session {
    Session::admitted(&req.org_id, &req.session_id, now)
}

/// Give a session its slot; the request's project and starter replace what was known.
fn take_slot(row: &mut Session, req: &AdmissionRequest, now: Secs) {
    row.slot_at = Some(now);
    row.key_id = Some(req.key_id.clone());
    row.agent = Some(req.agent.as_str().to_owned());
    if req.project_id.is_some() {
        row.project_id.clone_from(&req.project_id);
    }
    if req.started_by.is_some() {
        row.started_by.clone_from(&req.started_by);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gate::Agent;

    fn plans() -> Plans {
        crate::shipped_plans()
    }

    fn group_facts(limit: i64, held: i64) -> GroupFacts {
        let org = Org::new("o", "team", 0);
        let key = Key {
            org_id: "o".into(),
            key_id: "k".into(),
            concurrency_limit: Some(limit),
            created_at: 0,
            updated_at: 0,
        };
        GroupFacts {
            orgs: HashMap::from([("o".into(), org)]),
            keys: HashMap::from([(("o".into(), "k".into()), key)]),
            slots: HashMap::from([(("o".into(), "k".into()), held)]),
            ..GroupFacts::default()
        }
    }

    fn request(session: &str) -> AdmissionRequest {
        AdmissionRequest {
            org_id: "o".into(),
            key_id: "k".into(),
            session_id: session.into(),
            agent: Agent::Codex,
            project_id: None,
            started_by: None,
        }
    }

    fn ids() -> impl FnMut() -> String {
        let mut n = 0;
        move || {
            n += 1;
            format!("dec_{n}")
        }
    }

    #[test]
    fn a_group_takes_no_more_slots_than_the_key_has_left() {
        let reqs: Vec<_> = (0..10).map(|i| request(&format!("s{i}"))).collect();
        let out = decide_group(&plans(), &reqs, group_facts(3, 1), 1000, 60, ids());
        let rules: Vec<_> = out
            .answers
            .iter()
            .map(|a| a.as_ref().unwrap().rule.as_str())
            .collect();
        assert_eq!(rules[..2], ["within_limits", "within_limits"]);
        assert!(rules[2..].iter().all(|r| *r == "concurrency_limit_reached"));
        let running: Vec<_> = out
            .answers
            .iter()
            .map(|a| a.as_ref().unwrap().running)
            .collect();
        assert_eq!(running[..3], [2, 3, 3]);
        assert_eq!(out.created.len(), 2);
        assert!(out.resumed.is_empty());
        assert!(out
            .created
            .iter()
            .all(|s| s.slot_at == Some(1000) && s.ledger.phase == Phase::Admitted));
    }

    /// Two keys of one org: `k` with `k_limit` and `k_held` slots held, `a` with one slot
    /// (limit 1) held by the session `s`, admitted on `a` and running.
    fn two_keys(k_limit: i64, k_held: i64) -> GroupFacts {
        let mut facts = group_facts(k_limit, k_held);
        let a = Key {
            key_id: "a".into(),
            concurrency_limit: Some(1),
            ..facts.keys[&("o".to_owned(), "k".to_owned())].clone()
        };
        facts.keys.insert(("o".into(), "a".into()), a);
        facts.slots.insert(("o".into(), "a".into()), 1);
        let mut s = Session::admitted("o", "s", 990);
        s.key_id = Some("a".into());
        s.slot_at = Some(990);
        facts.sessions.insert(session_key("o", "s"), s);
        facts
    }

    /// A session holding key `a`'s slot, asked for under `k`, moves to `k`: decided against
    /// `k`'s limit, counted once there (not on both keys, not on none), and, allowed,
    /// leaves `a` a slot for another session of the same group.
    #[test]
    fn a_session_asked_for_under_another_key_moves_its_slot() {
        // k full: refused on k's limit; its slot stays on a.
        let out = decide_group(&plans(), &[request("s")], two_keys(2, 2), 1000, 60, ids());
        let d = out.answers[0].as_ref().unwrap();
        assert_eq!(
            (d.rule.as_str(), d.running),
            ("concurrency_limit_reached", 2)
        );
        assert!(out.resumed.is_empty());
        // k with room: allowed, k counts it, and a is free for t in the same group.
        let mut on_a = request("t");
        on_a.key_id = "a".into();
        let out = decide_group(
            &plans(),
            &[request("s"), on_a],
            two_keys(3, 1),
            1000,
            60,
            ids(),
        );
        let d: Vec<_> = out.answers.iter().map(|a| a.as_ref().unwrap()).collect();
        assert_eq!((d[0].rule.as_str(), d[0].running), ("within_limits", 2));
        assert_eq!((d[1].rule.as_str(), d[1].running), ("within_limits", 1));
        assert_eq!(out.resumed[0].key_id.as_deref(), Some("k"));
    }

    /// A session running without the gate's admission holds a slot on no key: asked for
    /// under a key, it takes one of that key's, within its limit.
    #[test]
    fn an_unadmitted_running_session_asked_for_takes_a_slot_of_the_key() {
        let mut facts = group_facts(1, 1);
        let mut u = Session::unadmitted("o", "u", "vm", 990);
        u.ledger.phase = Phase::Running;
        u.heard_at = Some(995);
        facts.sessions.insert(session_key("o", "u"), u);
        let out = decide_group(&plans(), &[request("u")], facts, 1000, 60, ids());
        let d = out.answers[0].as_ref().unwrap();
        assert_eq!(
            (d.rule.as_str(), d.running),
            ("concurrency_limit_reached", 1)
        );
    }

    #[test]
    fn a_session_named_twice_in_a_group_takes_one_slot() {
        let reqs = [request("s"), request("s"), request("t")];
        let out = decide_group(&plans(), &reqs, group_facts(2, 0), 1000, 60, ids());
        let rules: Vec<_> = out
            .answers
            .iter()
            .map(|a| a.as_ref().unwrap().rule.as_str())
            .collect();
        assert_eq!(
            rules,
            ["within_limits", "already_admitted", "within_limits"]
        );
        assert_eq!(out.created.len(), 2);
        let ids: Vec<_> = out
            .answers
            .iter()
            .map(|a| a.as_ref().unwrap().decision_id.as_str())
            .collect();
        assert_eq!(ids, ["dec_1", "dec_2", "dec_3"]);
    }

    #[test]
    fn unknown_orgs_keys_and_ended_sessions_are_rejected_without_a_decision() {
        let mut facts = group_facts(2, 0);
        let mut ended = Session::admitted("o", "e", 0);
        ended.ledger.phase = Phase::Ended;
        facts.sessions.insert(session_key("o", "e"), ended);
        let mut unknown_key = request("s");
        unknown_key.key_id = "nope".into();
        let mut unknown_org = request("s");
        unknown_org.org_id = "nope".into();
        let reqs = [unknown_org, unknown_key, request("e")];
        let out = decide_group(&plans(), &reqs, facts, 1000, 60, ids());
        let got: Vec<_> = out.answers.into_iter().map(|a| a.unwrap_err()).collect();
        assert_eq!(
            got,
            [
                AdmitReject::UnknownOrg,
                AdmitReject::UnknownKey,
                AdmitReject::SessionEnded,
            ]
        );
        assert!(out.created.is_empty() && out.resumed.is_empty());
    }

    /// A session id is its org's own: another org's ended session of the same id changes
    /// nothing for this org's, which is created and takes a slot of its own key.
    #[test]
    fn another_orgs_session_of_the_same_id_is_another_session() {
        let mut facts = group_facts(2, 0);
        let mut theirs = Session::admitted("p", "s", 0);
        theirs.ledger.phase = Phase::Ended;
        facts.sessions.insert(session_key("p", "s"), theirs);
        let out = decide_group(&plans(), &[request("s")], facts, 1000, 60, ids());
        let d = out.answers[0].as_ref().unwrap();
        assert_eq!(d.rule.as_str(), "within_limits");
        assert_eq!(out.created.len(), 1);
        assert_eq!(out.created[0].key(), session_key("o", "s"));
    }

    #[test]
    fn an_unpaid_subscription_is_refused_on_free_terms_as_inactive() {
        let mut facts = group_facts(100, 4);
        let org = facts.orgs.get_mut("o").unwrap();
        org.subscription_status = Some("unpaid".into());
        // Over Free's month (5 h) but well within Team's: the fix is to pay.
        facts.usage.insert(
            "o".into(),
            WindowTotals {
                month: 6 * 3600,
                ..WindowTotals::default()
            },
        );
        let out = decide_group(&plans(), &[request("s")], facts, 1000, 60, ids());
        let d = out.answers[0].as_ref().unwrap();
        assert_eq!(d.reason.map(Reason::as_str), Some("subscription_inactive"));
        assert_eq!(d.plan_id, "free");
        assert_eq!(d.upgrade_plan, None);
        // Within Free's terms, it runs on Free.
        let mut facts = group_facts(100, 0);
        facts.orgs.get_mut("o").unwrap().subscription_status = Some("incomplete".into());
        let out = decide_group(&plans(), &[request("s")], facts, 1000, 60, ids());
        let d = out.answers[0].as_ref().unwrap();
        assert_eq!(
            (d.rule.as_str(), d.plan_id.as_str(), d.concurrency_limit),
            ("within_limits", "free", 4)
        );
    }
}
