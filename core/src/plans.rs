//! Plans: the text of `plans/*.toml` parsed and validated (the service reads the files
//! once at start-up and hands their text here).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use rust_decimal::Decimal;
use serde::{Deserialize, Deserializer, Serialize};

use crate::ids::Id;

/// One plan as sold, with its ceilings in whole seconds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Plan {
    pub id: String,
    /// The version of the plan's terms (a file with no `version` is version 1): once an
    /// org has been on a version it never changes; new terms are a new version.
    pub version: i64,
    pub name: String,
    pub price: Decimal,
    pub currency: String,
    pub monthly_agent_hours: Decimal,
    pub weekly_agent_hours: Decimal,
    pub monthly_limit_seconds: i64,
    pub weekly_limit_seconds: i64,
    pub concurrency_default: i64,
    pub concurrency_max: i64,
    pub ceiling_grace_seconds: i64,
    pub past_due_grace_days: i64,
    pub stripe_prices: Vec<String>,
    pub upgrade_to: Option<String>,
    /// Percentages of a window's ceiling at which the upgrade prompt shows (ascending).
    pub prompt_thresholds: Vec<u8>,
    /// Concurrency denials in 24 hours that show the upgrade prompt (0: never).
    pub prompt_concurrency_denials: i64,
    /// Price of a pay-as-you-go agent-hour past the plan and its grants, in the plan's
    /// currency (at most 4 places); 0: the plan offers no pay-as-you-go.
    pub overage_unit_price: Decimal,
    /// The highest monthly spend cap an org on this plan may set (0: no pay-as-you-go).
    pub overage_cap_max: Decimal,
    /// Top-up packs the plan sells, in hours (empty: none).
    pub topup_hours: Vec<i64>,
    /// Price of a bought hour.
    pub topup_hour_price: Decimal,
    /// Days a bought top-up lasts.
    pub topup_expiry_days: i64,
}

impl Plan {
    /// Whether an org on this plan may turn pay-as-you-go on.
    pub fn offers_overage(&self) -> bool {
        self.overage_unit_price > Decimal::ZERO && self.overage_cap_max > Decimal::ZERO
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PlanFile {
    id: String,
    #[serde(default = "default_version")]
    version: i64,
    name: String,
    #[serde(deserialize_with = "decimal")]
    price: Decimal,
    currency: String,
    #[serde(deserialize_with = "decimal")]
    monthly_agent_hours: Decimal,
    #[serde(deserialize_with = "decimal")]
    weekly_agent_hours: Decimal,
    concurrency_default: i64,
    concurrency_max: i64,
    #[serde(default)]
    ceiling_grace_seconds: i64,
    #[serde(default = "default_past_due_grace_days")]
    past_due_grace_days: i64,
    #[serde(default)]
    stripe_prices: Vec<String>,
    upgrade_to: Option<String>,
    #[serde(default = "default_prompt_thresholds")]
    prompt_thresholds: Vec<u8>,
    #[serde(default = "default_prompt_concurrency_denials")]
    prompt_concurrency_denials: i64,
    #[serde(default, deserialize_with = "decimal")]
    overage_unit_price: Decimal,
    #[serde(default, deserialize_with = "decimal")]
    overage_cap_max: Decimal,
    #[serde(default)]
    topup_hours: Vec<i64>,
    #[serde(default, deserialize_with = "decimal")]
    topup_hour_price: Decimal,
    #[serde(default = "default_topup_expiry_days")]
    topup_expiry_days: i64,
}

fn default_version() -> i64 {
    1
}

fn default_topup_expiry_days() -> i64 {
    365
}

fn default_prompt_thresholds() -> Vec<u8> {
    vec![80, 100]
}

fn default_prompt_concurrency_denials() -> i64 {
    1
}

fn default_past_due_grace_days() -> i64 {
    7
}

/// A TOML integer, float or string read as an exact decimal (`0.005` stays `0.005`).
fn decimal<'de, D: Deserializer<'de>>(d: D) -> Result<Decimal, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Num {
        Int(i64),
        Float(f64),
        Str(String),
    }
    let text = match Num::deserialize(d)? {
        Num::Int(i) => return Ok(Decimal::from(i)),
        // Display of f64 is the shortest text that reads back to the same value.
        Num::Float(f) => f.to_string(),
        Num::Str(s) => s,
    };
    Decimal::from_str(&text)
        .or_else(|_| Decimal::from_scientific(&text))
        .map_err(|_| serde::de::Error::custom(format!("`{text}` is not a decimal number")))
}

/// A plan file that cannot be used, naming the file and the field to fix.
#[derive(Debug, thiserror::Error)]
#[error("{file}: {message}")]
pub struct PlanError {
    pub file: PathBuf,
    pub message: String,
}

/// Every version of every plan, and the file each came from.
#[derive(Clone, Debug)]
pub struct Plans {
    /// By id, then version: looked up by `&str` on every decision, without an allocation.
    by_id: BTreeMap<String, BTreeMap<i64, Plan>>,
    files: BTreeMap<(String, i64), PathBuf>,
}

impl Plans {
    /// Parse the text of every plan file (`(path, text)`, in path order) and check that the
    /// plans fit together: unique ids and versions, each Stripe price named once, no
    /// dangling `upgrade_to`, a `free` plan. `dir` names the directory in the error for a
    /// missing `free` plan.
    pub fn from_texts(dir: &Path, files: Vec<(PathBuf, String)>) -> Result<Plans, PlanError> {
        let mut parsed = Vec::with_capacity(files.len());
        for (file, text) in files {
            let plan = parse_plan(&text).map_err(|message| PlanError {
                file: file.clone(),
                message,
            })?;
            parsed.push((file, plan));
        }
        Plans::from_files(dir, parsed)
    }

    pub(crate) fn from_files(dir: &Path, parsed: Vec<(PathBuf, Plan)>) -> Result<Plans, PlanError> {
        let mut plans = Plans {
            by_id: BTreeMap::new(),
            files: BTreeMap::new(),
        };
        let mut prices: BTreeMap<&str, &Plan> = BTreeMap::new();
        for (file, plan) in &parsed {
            let at = |message: String| PlanError {
                file: file.clone(),
                message,
            };
            let versions = plans.by_id.entry(plan.id.clone()).or_default();
            if versions.insert(plan.version, plan.clone()).is_some() {
                return Err(at(format!(
                    "version: `{}` version {} is defined by another file too",
                    plan.id, plan.version
                )));
            }
            plans
                .files
                .insert((plan.id.clone(), plan.version), file.clone());
            for price in &plan.stripe_prices {
                // A subscription's price says which version it pays for: one price, one.
                if let Some(other) = prices.insert(price, plan) {
                    return Err(at(format!(
                        "stripe_prices: `{price}` is named by `{}` version {} too; each \
                         version sells at prices of its own",
                        other.id, other.version
                    )));
                }
            }
        }
        for (file, plan) in &parsed {
            if let Some(up) = &plan.upgrade_to {
                if plans.get(up).is_none() {
                    return Err(PlanError {
                        file: file.clone(),
                        message: format!("upgrade_to: no plan has id `{up}`"),
                    });
                }
            }
        }
        if plans.get(FREE).is_none() {
            return Err(PlanError {
                file: dir.to_path_buf(),
                message: format!(
                    "no plan with id `{FREE}`: it is the plan of new orgs and of inactive subscriptions"
                ),
            });
        }
        Ok(plans)
    }

    /// The newest version of plan `id`: what a new org, a new subscription, an upgrade and
    /// the upgrade prompt get.
    pub fn get(&self, id: &str) -> Option<&Plan> {
        self.by_id.get(id)?.values().next_back()
    }

    /// Version `version` of plan `id`.
    pub fn version(&self, id: &str, version: i64) -> Option<&Plan> {
        self.by_id.get(id)?.get(&version)
    }

    /// The file that defines version `version` of plan `id`.
    pub fn file_of(&self, id: &str, version: i64) -> Option<&Path> {
        self.files
            .get(&(id.to_owned(), version))
            .map(PathBuf::as_path)
    }

    /// The plan every org falls back to (its newest version).
    pub fn free(&self) -> &Plan {
        self.get(FREE).expect("a free plan is checked at load")
    }

    /// The newest version of each plan, by id.
    pub fn iter(&self) -> impl Iterator<Item = &Plan> {
        self.by_id.values().filter_map(|v| v.values().next_back())
    }

    /// Every version of every plan, by id then version.
    pub fn all_versions(&self) -> impl Iterator<Item = &Plan> {
        self.by_id.values().flat_map(BTreeMap::values)
    }

    /// The plan version whose `stripe_prices` names this price id, lookup key or legacy
    /// plan id (each names one at most: checked at load).
    pub fn by_stripe_price(&self, price: &str) -> Option<&Plan> {
        self.all_versions()
            .find(|p| p.stripe_prices.iter().any(|s| s == price))
    }
}

/// The terms of a plan version as recorded when the service first starts with it, to
/// find later edits of it: every field, in a fixed order, decimals normalized (`20.00` and
/// `20` are one price), so that comments and layout may change and nothing else.
pub fn terms(plan: &Plan) -> BTreeMap<&'static str, String> {
    let dec = |d: Decimal| d.normalize().to_string();
    let list = |v: &[String]| v.join(",");
    let nums = |v: &[i64]| v.iter().map(i64::to_string).collect::<Vec<_>>().join(",");
    BTreeMap::from([
        ("name", plan.name.clone()),
        ("price", dec(plan.price)),
        ("currency", plan.currency.clone()),
        ("monthly_agent_hours", dec(plan.monthly_agent_hours)),
        ("weekly_agent_hours", dec(plan.weekly_agent_hours)),
        ("concurrency_default", plan.concurrency_default.to_string()),
        ("concurrency_max", plan.concurrency_max.to_string()),
        (
            "ceiling_grace_seconds",
            plan.ceiling_grace_seconds.to_string(),
        ),
        ("past_due_grace_days", plan.past_due_grace_days.to_string()),
        ("stripe_prices", list(&plan.stripe_prices)),
        ("upgrade_to", plan.upgrade_to.clone().unwrap_or_default()),
        (
            "prompt_thresholds",
            nums(
                &plan
                    .prompt_thresholds
                    .iter()
                    .map(|&t| i64::from(t))
                    .collect::<Vec<_>>(),
            ),
        ),
        (
            "prompt_concurrency_denials",
            plan.prompt_concurrency_denials.to_string(),
        ),
        ("overage_unit_price", dec(plan.overage_unit_price)),
        ("overage_cap_max", dec(plan.overage_cap_max)),
        ("topup_hours", nums(&plan.topup_hours)),
        ("topup_hour_price", dec(plan.topup_hour_price)),
        ("topup_expiry_days", plan.topup_expiry_days.to_string()),
    ])
}

/// The terms recorded for a version, as text (`terms`, one `field=value` a line).
pub fn terms_text(plan: &Plan) -> String {
    terms(plan)
        .into_iter()
        .map(|(k, v)| format!("{k}={v}\n"))
        .collect()
}

/// The fields whose values differ between two recorded terms (`terms_text`), named with
/// both values: what a start-up refused for an edited version says.
pub fn changed_terms(recorded: &str, now: &str) -> Vec<String> {
    let read = |t: &str| -> BTreeMap<String, String> {
        t.lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect()
    };
    let (a, b) = (read(recorded), read(now));
    let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    keys.into_iter()
        .filter(|k| a.get(*k) != b.get(*k))
        .map(|k| {
            let show = |m: &BTreeMap<String, String>| {
                m.get(k)
                    .map_or_else(|| "(none)".to_owned(), |v| format!("`{v}`"))
            };
            format!("{k}: {} recorded, {} now", show(&a), show(&b))
        })
        .collect()
}

/// The highest version number a plan file may carry.
pub const MAX_VERSION: i64 = 1_000_000;

/// The id of the plan that new orgs get and inactive subscriptions fall back to.
pub const FREE: &str = "free";

/// Parse and validate one plan file's text; the error names the field.
pub fn parse_plan(text: &str) -> Result<Plan, String> {
    let f: PlanFile = toml::from_str(text).map_err(toml_error)?;
    Id::parse(&f.id).map_err(|m| format!("id: {m}"))?;
    if !(1..=MAX_VERSION).contains(&f.version) {
        return Err(format!("version: a whole number 1 to {MAX_VERSION}"));
    }
    if f.name.trim().is_empty() {
        return Err("name: must not be empty".into());
    }
    non_negative("price", f.price)?;
    non_negative("overage_unit_price", f.overage_unit_price)?;
    if f.overage_unit_price.round_dp(4) != f.overage_unit_price {
        return Err("overage_unit_price: at most 4 decimal places, e.g. \"0.6000\"".into());
    }
    // Bounds that keep every sum of charge units (price-seconds × 10⁴) within 64 bits.
    if f.overage_unit_price > Decimal::from(10_000) {
        return Err("overage_unit_price: at most 10000 an hour".into());
    }
    non_negative("overage_cap_max", f.overage_cap_max)?;
    if f.overage_cap_max > Decimal::from(1_000_000_000) {
        return Err("overage_cap_max: at most 1000000000".into());
    }
    if f.overage_cap_max.round_dp(2) != f.overage_cap_max {
        return Err("overage_cap_max: an amount in cents at most, e.g. \"200.00\"".into());
    }
    if f.topup_hours.iter().any(|h| !(1..=10_000).contains(h))
        || f.topup_hours.windows(2).any(|w| w[0] >= w[1])
    {
        return Err("topup_hours: whole hours 1 to 10000, ascending, e.g. [5, 10, 25]".into());
    }
    non_negative("topup_hour_price", f.topup_hour_price)?;
    if f.topup_hour_price > Decimal::from(10_000) {
        return Err("topup_hour_price: at most 10000 an hour".into());
    }
    if !f.topup_hours.is_empty() && f.topup_hour_price <= Decimal::ZERO {
        return Err("topup_hour_price: a plan that sells top-ups must price them".into());
    }
    if f.topup_hour_price.round_dp(2) != f.topup_hour_price {
        return Err("topup_hour_price: an amount in cents at most, e.g. \"0.55\"".into());
    }
    if !(1..=3650).contains(&f.topup_expiry_days) {
        return Err("topup_expiry_days: 1 to 3650".into());
    }
    if f.currency.len() != 3 || !f.currency.chars().all(|c| c.is_ascii_lowercase()) {
        return Err("currency: must be a lowercase ISO 4217 code such as `usd`".into());
    }
    let monthly = hours_to_seconds("monthly_agent_hours", f.monthly_agent_hours)?;
    let weekly = hours_to_seconds("weekly_agent_hours", f.weekly_agent_hours)?;
    if !(1..=100).contains(&f.concurrency_max) {
        return Err("concurrency_max: must be between 1 and 100".into());
    }
    if !(1..=f.concurrency_max).contains(&f.concurrency_default) {
        return Err(format!(
            "concurrency_default: must be between 1 and concurrency_max ({})",
            f.concurrency_max
        ));
    }
    if f.ceiling_grace_seconds < 0 {
        return Err("ceiling_grace_seconds: must not be negative".into());
    }
    if f.past_due_grace_days < 0 {
        return Err("past_due_grace_days: must not be negative".into());
    }
    if f.prompt_thresholds.iter().any(|t| !(1..=100).contains(t))
        || f.prompt_thresholds.windows(2).any(|w| w[0] >= w[1])
    {
        return Err("prompt_thresholds: percentages 1 to 100, ascending, e.g. [80, 100]".into());
    }
    if f.prompt_concurrency_denials < 0 {
        return Err("prompt_concurrency_denials: must not be negative (0 turns it off)".into());
    }
    if let Some(up) = &f.upgrade_to {
        if *up == f.id {
            return Err("upgrade_to: a plan cannot upgrade to itself".into());
        }
    }
    Ok(Plan {
        id: f.id,
        version: f.version,
        name: f.name,
        price: f.price,
        currency: f.currency,
        monthly_agent_hours: f.monthly_agent_hours,
        weekly_agent_hours: f.weekly_agent_hours,
        monthly_limit_seconds: monthly,
        weekly_limit_seconds: weekly,
        concurrency_default: f.concurrency_default,
        concurrency_max: f.concurrency_max,
        ceiling_grace_seconds: f.ceiling_grace_seconds,
        past_due_grace_days: f.past_due_grace_days,
        stripe_prices: f.stripe_prices,
        prompt_thresholds: f.prompt_thresholds,
        prompt_concurrency_denials: f.prompt_concurrency_denials,
        overage_unit_price: f.overage_unit_price,
        overage_cap_max: f.overage_cap_max,
        topup_hours: f.topup_hours,
        topup_hour_price: f.topup_hour_price,
        topup_expiry_days: f.topup_expiry_days,
        upgrade_to: f.upgrade_to,
    })
}

/// TOML's own words, or where it stopped when it has none (a stray NUL byte, say).
fn toml_error(e: toml::de::Error) -> String {
    match (e.message().trim(), e.span()) {
        ("", Some(at)) => format!("not valid TOML at byte {}", at.start),
        ("", None) => "not valid TOML".to_owned(),
        (m, _) => m.to_owned(),
    }
}

fn non_negative(field: &str, v: Decimal) -> Result<(), String> {
    if v.is_sign_negative() && !v.is_zero() {
        return Err(format!("{field}: must not be negative (got {v})"));
    }
    Ok(())
}

/// Whole seconds of a ceiling in hours, rounded down: a ceiling never grants a part second.
fn hours_to_seconds(field: &str, hours: Decimal) -> Result<i64, String> {
    non_negative(field, hours)?;
    let too_large = || format!("{field}: {hours} hours is too large");
    let secs = hours
        .checked_mul(Decimal::from(3600))
        .ok_or_else(too_large)?;
    i64::try_from(secs.floor()).map_err(|_| too_large())
}

#[cfg(test)]
mod tests {
    use super::*;

    const PRO: &str = r#"
id = "pro"
name = "Pro"
price = "20.00"
currency = "usd"
monthly_agent_hours = 40
weekly_agent_hours = 0.005
concurrency_default = 4
concurrency_max = 10
stripe_prices = ["pro_monthly"]
upgrade_to = "team"
"#;

    #[test]
    fn parses_fractional_hours_exactly() {
        let p = parse_plan(PRO).unwrap();
        assert_eq!(p.monthly_limit_seconds, 144_000);
        assert_eq!(p.weekly_limit_seconds, 18);
        assert_eq!(p.weekly_agent_hours.to_string(), "0.005");
    }

    #[test]
    fn rejects_unknown_field_naming_it() {
        let e = parse_plan(&format!("{PRO}\nmonthly_hours = 3\n")).unwrap_err();
        assert!(e.contains("monthly_hours"), "{e}");
    }

    /// Found by the `plan_file` fuzz target: TOML's message is empty for a NUL byte, and
    /// a ceiling of 2^96 hours overflowed the seconds' multiplication.
    #[test]
    fn odd_files_are_refused_with_a_reason() {
        let e = parse_plan(&PRO.replace("upgrade_to", "up\0grade_to")).unwrap_err();
        assert!(!e.trim().is_empty());
        let e = parse_plan(&PRO.replace(
            "monthly_agent_hours = 40",
            "monthly_agent_hours = \"79228162514264337593543950335\"",
        ))
        .unwrap_err();
        assert!(
            e.starts_with("monthly_agent_hours") && e.contains("too large"),
            "{e}"
        );
    }

    #[test]
    fn rejects_negative_and_missing_ceilings() {
        let e = parse_plan(&PRO.replace("weekly_agent_hours = 0.005", "weekly_agent_hours = -1"))
            .unwrap_err();
        assert!(e.starts_with("weekly_agent_hours"), "{e}");
        let e = parse_plan(&PRO.replace("monthly_agent_hours = 40", "")).unwrap_err();
        assert!(e.contains("monthly_agent_hours"), "{e}");
    }

    #[test]
    fn prompt_settings_default_and_are_checked() {
        let p = parse_plan(PRO).unwrap();
        assert_eq!(
            (p.prompt_thresholds.as_slice(), p.prompt_concurrency_denials),
            (&[80, 100][..], 1)
        );
        for bad in [
            "prompt_thresholds = [100, 80]",
            "prompt_thresholds = [0]",
            "prompt_thresholds = [101]",
            "prompt_concurrency_denials = -1",
        ] {
            let e = parse_plan(&format!("{PRO}\n{bad}\n")).unwrap_err();
            assert!(e.starts_with(bad.split(' ').next().unwrap()), "{bad}: {e}");
        }
        let p = parse_plan(&format!(
            "{PRO}\nprompt_thresholds = [50, 90]\nprompt_concurrency_denials = 0\n"
        ))
        .unwrap();
        assert_eq!(
            (p.prompt_thresholds.as_slice(), p.prompt_concurrency_denials),
            (&[50, 90][..], 0)
        );
    }

    #[test]
    fn rejects_duplicates_and_dangling_upgrade() {
        let dir = Path::new("plans");
        let pro = parse_plan(PRO).unwrap();
        let free = parse_plan(
            &PRO.replace("\"pro\"", "\"free\"")
                .replace("upgrade_to = \"team\"", "")
                .replace("[\"pro_monthly\"]", "[]"),
        )
        .unwrap();
        let e = Plans::from_files(
            dir,
            vec![
                ("a.toml".into(), free.clone()),
                ("b.toml".into(), pro.clone()),
            ],
        )
        .unwrap_err();
        assert_eq!(e.file, PathBuf::from("b.toml"));
        assert!(e.message.starts_with("upgrade_to"), "{}", e.message);
        let e = Plans::from_files(
            dir,
            vec![
                ("a.toml".into(), free.clone()),
                ("c.toml".into(), free.clone()),
            ],
        )
        .unwrap_err();
        assert!(e.message.starts_with("version"), "{}", e.message);
        // Versions of one id are one plan; each names prices of its own.
        let mut two = pro.clone();
        two.version = 2;
        let files = |b: Plan| {
            vec![
                ("a.toml".into(), free.clone()),
                ("b.toml".into(), pro.clone()),
                ("b2.toml".into(), b),
            ]
        };
        let e = Plans::from_files(dir, files(two.clone())).unwrap_err();
        assert_eq!(e.file, PathBuf::from("b2.toml"));
        assert!(
            e.message
                .starts_with("stripe_prices: `pro_monthly` is named by `pro` version 1"),
            "{}",
            e.message
        );
        two.stripe_prices = vec!["pro_monthly_2".into()];
        let mut one = pro.clone();
        // No `team` here to upgrade to.
        one.upgrade_to = None;
        two.upgrade_to = None;
        let versions = vec![
            ("a.toml".into(), free.clone()),
            ("b.toml".into(), one),
            ("b2.toml".into(), two),
        ];
        let plans = Plans::from_files(dir, versions).unwrap();
        assert_eq!(plans.get("pro").map(|p| p.version), Some(2));
        assert_eq!(
            plans.version("pro", 2).unwrap().stripe_prices,
            ["pro_monthly_2"]
        );
        assert_eq!(
            plans.by_stripe_price("pro_monthly_2").map(|p| p.version),
            Some(2)
        );
        assert_eq!(plans.iter().count(), 2, "one plan a id, its newest version");
    }

    #[test]
    fn a_version_is_read_and_its_terms_compare_field_by_field() {
        let p = parse_plan(&format!("version = 3\n{PRO}")).unwrap();
        assert_eq!(p.version, 3);
        assert_eq!(
            parse_plan(PRO).unwrap().version,
            1,
            "no version is version 1"
        );
        let e = parse_plan(&format!("version = 0\n{PRO}")).unwrap_err();
        assert!(e.starts_with("version"), "{e}");
        let a = terms_text(&p);
        let mut q = p.clone();
        q.price = Decimal::from_str("20").unwrap();
        assert_eq!(terms_text(&q), a, "20 and 20.00 are one price");
        q.monthly_agent_hours = Decimal::from(30);
        assert_eq!(
            changed_terms(&a, &terms_text(&q)),
            ["monthly_agent_hours: `40` recorded, `30` now"]
        );
    }

    #[test]
    fn funding_settings_default_off_and_are_checked() {
        let p = parse_plan(PRO).unwrap();
        assert!(!p.offers_overage());
        assert!(p.topup_hours.is_empty());
        assert_eq!(p.topup_expiry_days, 365);
        for bad in [
            "overage_unit_price = \"0.12345\"",
            "overage_cap_max = \"-1\"",
            "overage_cap_max = \"10.001\"",
            "topup_hours = [10, 5]",
            "topup_hours = [0]",
            "topup_hour_price = \"0.555\"",
            "topup_expiry_days = 0",
        ] {
            let e = parse_plan(&format!("{PRO}\n{bad}\n")).unwrap_err();
            assert!(e.starts_with(bad.split(' ').next().unwrap()), "{bad}: {e}");
        }
        let e = parse_plan(&format!("{PRO}\ntopup_hours = [5]\n")).unwrap_err();
        assert!(e.starts_with("topup_hour_price"), "{e}");
        let p = parse_plan(&format!(
            "{PRO}\noverage_unit_price = \"0.60\"\noverage_cap_max = \"200\"\ntopup_hours = [5, 10]\ntopup_hour_price = \"0.55\"\n"
        ))
        .unwrap();
        assert!(p.offers_overage());
        assert_eq!(p.topup_hours, [5, 10]);
    }

    #[test]
    fn the_shipped_plans_load() {
        let plans = crate::shipped_plans();
        assert_eq!(plans.free().monthly_limit_seconds, 5 * 3600);
        assert_eq!(plans.get("pro").unwrap().monthly_limit_seconds, 40 * 3600);
        assert_eq!(plans.get("team").unwrap().concurrency_max, 100);
    }
}
