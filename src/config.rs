//! Settings: flags win over environment variables, which win over defaults (API.md).
//! Everything is validated here, before anything starts; the error names the setting to
//! fix. Secrets are `SecretString`s, which never print. Plan files are read here too.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use clap::Args;
use rush_meter_core::ledger::Rules;
use rush_meter_core::plans::{PlanError, Plans};
use rush_meter_core::time::Secs;
use secrecy::SecretString;

/// A setting that cannot be used: which one, and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{setting}: {message}")]
pub struct ConfigError {
    /// The flag and its variable, e.g. `--lease-secs / RUSH_METER_LEASE_SECS`.
    pub setting: &'static str,
    pub message: String,
}

fn bad(setting: &'static str, message: impl Into<String>) -> ConfigError {
    ConfigError {
        setting,
        message: message.into(),
    }
}

/// Every `*.toml` in `dir`, parsed and checked together (`Plans::from_texts`).
pub fn load_plans(dir: &Path) -> Result<Plans, PlanError> {
    let err = |file: &Path, message: String| PlanError {
        file: file.to_path_buf(),
        message,
    };
    let entries = std::fs::read_dir(dir).map_err(|e| {
        err(
            dir,
            format!(
                "cannot read the plans directory ({e}); set --plans-dir or RUSH_METER_PLANS_DIR"
            ),
        )
    })?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    files.sort();
    let mut texts = Vec::with_capacity(files.len());
    for file in files {
        let text =
            std::fs::read_to_string(&file).map_err(|e| err(&file, format!("cannot read ({e})")))?;
        texts.push((file, text));
    }
    Plans::from_texts(dir, texts)
}

/// The plans of `plans/`, for unit tests.
#[cfg(test)]
pub fn shipped_plans() -> Plans {
    load_plans(Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/plans"))).expect("plans/ loads")
}

/// A per-token request rate and the burst allowed above it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RateLimit {
    pub per_sec: f64,
    pub burst: f64,
}

/// The database every command but `simulate` opens (a flag of every command, before or after
/// its name).
#[derive(Clone, Args)]
pub struct DatabaseArgs {
    /// `sqlite://FILE` (created if missing) or `postgres://…`.
    #[arg(
        long,
        global = true,
        env = "RUSH_METER_DATABASE_URL",
        default_value = "sqlite://rush-meter.db"
    )]
    pub database_url: String,
}

/// The plan files, for the commands that price or decide.
#[derive(Clone, Args)]
pub struct PlansArgs {
    /// Directory of plan files (`*.toml`).
    #[arg(long, env = "RUSH_METER_PLANS_DIR", default_value = "plans")]
    pub plans_dir: PathBuf,
}

/// The ledger's timing, which `serve` keeps and `simulate` drives with.
#[derive(Clone, Args)]
pub struct RulesArgs {
    /// How often supervisors send a heartbeat for each running microVM.
    #[arg(long, env = "RUSH_METER_HEARTBEAT_INTERVAL_SECS", default_value_t = 15)]
    pub heartbeat_interval_secs: i64,
    /// A running session silent longer than this is presumed gone.
    #[arg(long, env = "RUSH_METER_LEASE_SECS", default_value_t = 45)]
    pub lease_secs: i64,
}

/// The HTTP listener of `serve`: its address, limits and first token.
#[derive(Clone, Args)]
pub struct ListenerArgs {
    /// Address the HTTP service listens on.
    #[arg(long, env = "RUSH_METER_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: String,
    /// When set, a token with every scope and this secret exists after start-up.
    #[arg(long, env = "RUSH_METER_BOOTSTRAP_ADMIN_TOKEN", hide_env_values = true)]
    pub bootstrap_admin_token: Option<String>,
    /// Largest request body accepted, in bytes (a full batch of 1,000 heartbeats is ~200 KB).
    #[arg(long, env = "RUSH_METER_MAX_BODY_BYTES", default_value_t = 1 << 20)]
    pub max_body_bytes: usize,
    /// Client connections open at once; past it the instance accepts no more until one
    /// closes (keep it well under the open-file limit, which database connections share).
    #[arg(long, env = "RUSH_METER_MAX_CONNECTIONS", default_value_t = 4096)]
    pub max_connections: usize,
    /// Seconds a client connection may go without a byte either way (idle between
    /// requests, or silent mid-request) before it is closed. Longer than the usual client
    /// pools keep an idle connection (90 s), so that clients close first.
    #[arg(long, env = "RUSH_METER_IDLE_CONNECTION_SECS", default_value_t = 120)]
    pub idle_connection_secs: u64,
    /// Requests a second each API token may make on this instance (0: no limit); over it,
    /// 429 with Retry-After.
    #[arg(long, env = "RUSH_METER_RATE_LIMIT_PER_SEC", default_value_t = 1000)]
    pub rate_limit_per_sec: u32,
    /// Requests a token may make at once above its rate.
    #[arg(long, env = "RUSH_METER_RATE_LIMIT_BURST", default_value_t = 2000)]
    pub rate_limit_burst: u32,
    /// Seconds an export may wait on a client that reads nothing before it is cut short
    /// (its database connection freed); the client sees an incomplete body.
    #[arg(long, env = "RUSH_METER_EXPORT_STALL_SECS", default_value_t = 120)]
    pub export_stall_secs: u64,
}

/// Stripe, for `serve` and the `stripe` commands.
#[derive(Clone, Args)]
pub struct StripeArgs {
    /// Stripe secret key; Stripe is off when unset.
    #[arg(long, env = "RUSH_METER_STRIPE_SECRET_KEY", hide_env_values = true)]
    pub stripe_secret_key: Option<String>,
    /// Stripe webhook signing secret(s), comma-separated during a rollover.
    #[arg(long, env = "RUSH_METER_STRIPE_WEBHOOK_SECRET", hide_env_values = true)]
    pub stripe_webhook_secret: Option<String>,
    /// Stripe API base URL (a local Stripe fake in tests).
    #[arg(
        long,
        env = "RUSH_METER_STRIPE_API_BASE",
        default_value = "https://api.stripe.com"
    )]
    pub stripe_api_base: String,
    /// How old a webhook's signed timestamp may be, in seconds.
    #[arg(
        long,
        env = "RUSH_METER_STRIPE_WEBHOOK_TOLERANCE_SECS",
        default_value_t = 300
    )]
    pub stripe_webhook_tolerance_secs: i64,
    /// Where Stripe Checkout and the customer portal send the user back to (the console's
    /// billing page); `?checkout=success` or `?checkout=cancel` is appended after Checkout.
    #[arg(
        long,
        env = "RUSH_METER_STRIPE_RETURN_URL",
        default_value = "http://localhost:3000/billing"
    )]
    pub stripe_return_url: String,
    /// Seconds between two reconciliations with Stripe in `serve` (0: never).
    #[arg(long, env = "RUSH_METER_STRIPE_RECONCILE_SECS", default_value_t = 3600)]
    pub stripe_reconcile_secs: u64,
}

/// The background jobs of `serve`: closing periods, usage notifications.
#[derive(Clone, Args)]
pub struct JobArgs {
    /// Seconds after a month ends before `serve` closes it as a billing period (0: only
    /// `rush-meter period close` closes periods). At least the lease, so that every
    /// heartbeat of the month has landed.
    #[arg(long, env = "RUSH_METER_PERIOD_SETTLE_SECS", default_value_t = 21_600)]
    pub period_settle_secs: i64,
    /// Where usage-threshold notifications are POSTed (off when unset).
    #[arg(long, env = "RUSH_METER_NOTIFY_URL")]
    pub notify_url: Option<String>,
    /// The secret notifications are signed with (HMAC-SHA256); required with the URL.
    #[arg(long, env = "RUSH_METER_NOTIFY_SECRET", hide_env_values = true)]
    pub notify_secret: Option<String>,
    /// Longest wait, in seconds, between two looks of a job that looks at every org (the
    /// expiry of silent sessions, pay-as-you-go charges) while it finds nothing to do and
    /// this instance serves no heartbeat or admission: the wait doubles from the job's own
    /// period up to this. Lower: a dead peer's silent sessions end sooner (their totals
    /// are the same either way); higher: fewer statements on an idle sharded store.
    #[arg(long, env = "RUSH_METER_JOBS_IDLE_SECS", default_value_t = 120)]
    pub jobs_idle_secs: u64,
}

/// How every command logs (a flag of every command).
#[derive(Clone, Args)]
pub struct LogArgs {
    /// How log lines are written to stderr: `text` for people, `json` (one object a line,
    /// with the fields of the request's span: request id, route, org) for a log shipper.
    #[arg(
        long,
        global = true,
        env = "RUSH_METER_LOG_FORMAT",
        value_enum,
        default_value_t = LogFormat::Text
    )]
    pub log_format: LogFormat,
}

/// What `serve` takes (and `rush-meter` without a command): every group but the
/// database's, which every command takes.
#[derive(Clone, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub plans: PlansArgs,
    #[command(flatten)]
    pub rules: RulesArgs,
    #[command(flatten)]
    pub listener: ListenerArgs,
    #[command(flatten)]
    pub stripe: StripeArgs,
    #[command(flatten)]
    pub jobs: JobArgs,
}

/// Every setting. A command takes the groups it uses as flags (`cli::Command`); the
/// others come from their environment variables and defaults, so that one validation
/// serves every command.
#[derive(Clone)]
pub struct Settings {
    pub database: DatabaseArgs,
    pub plans: PlansArgs,
    pub rules: RulesArgs,
    pub listener: ListenerArgs,
    pub stripe: StripeArgs,
    pub jobs: JobArgs,
}

impl Settings {
    /// `serve`'s settings on `database`.
    pub fn of(database: &DatabaseArgs, serve: &ServeArgs) -> Settings {
        Settings {
            database: database.clone(),
            plans: serve.plans.clone(),
            rules: serve.rules.clone(),
            listener: serve.listener.clone(),
            stripe: serve.stripe.clone(),
            jobs: serve.jobs.clone(),
        }
    }
}

/// The shape of log lines (`--log-format` / `RUSH_METER_LOG_FORMAT`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// `None` or `[redacted]`: a secret's presence, never its value.
fn redact(s: &Option<String>) -> Option<&'static str> {
    s.as_ref().map(|_| "[redacted]")
}

impl fmt::Debug for Settings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (l, s, r) = (&self.listener, &self.stripe, &self.rules);
        f.debug_struct("Settings")
            .field("database_url", &redact_url(&self.database.database_url))
            .field("listen", &l.listen)
            .field("plans_dir", &self.plans.plans_dir)
            .field("heartbeat_interval_secs", &r.heartbeat_interval_secs)
            .field("lease_secs", &r.lease_secs)
            .field("bootstrap_admin_token", &redact(&l.bootstrap_admin_token))
            .field("max_body_bytes", &l.max_body_bytes)
            .field("max_connections", &l.max_connections)
            .field("idle_connection_secs", &l.idle_connection_secs)
            .field("stripe_secret_key", &redact(&s.stripe_secret_key))
            .field("stripe_webhook_secret", &redact(&s.stripe_webhook_secret))
            .field("stripe_api_base", &s.stripe_api_base)
            .field("notify_secret", &redact(&self.jobs.notify_secret))
            .finish()
    }
}

/// A database URL with any password replaced, for logs.
pub fn redact_url(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) if u.password().is_some() => {
            let _ = u.set_password(Some("***"));
            u.to_string()
        }
        _ => url.to_owned(),
    }
}

/// Settings that passed validation.
#[derive(Clone, Debug)]
pub struct Config {
    pub database_url: String,
    pub listen: SocketAddr,
    pub plans_dir: PathBuf,
    pub rules: Rules,
    pub bootstrap_admin_token: Option<SecretString>,
    pub max_body_bytes: usize,
    /// Client connections open at once (`http::connections`).
    pub max_connections: usize,
    /// How long a client connection may move no byte before it is closed.
    pub idle_connection: std::time::Duration,
    pub stripe: StripeConfig,
    /// Per-token request rate; `None`: unlimited.
    pub rate_limit: Option<RateLimit>,
    /// Seconds after a month's end before `serve` closes it; `None`: never by itself.
    pub period_settle: Option<Secs>,
    /// Usage-threshold notifications; `None`: off.
    pub notify: Option<NotifyConfig>,
    /// How long an export waits on a client that reads nothing.
    pub export_stall: std::time::Duration,
    /// The longest wait of an idle job that looks at every org (`app::pace`).
    pub jobs_idle_wait: std::time::Duration,
}

/// Where usage-threshold notifications go and the secret they are signed with.
#[derive(Clone, Debug)]
pub struct NotifyConfig {
    pub url: String,
    pub secret: SecretString,
}

/// Stripe settings. Without a secret key nothing is sent to Stripe (checkout and reconcile
/// answer that Stripe is off); without a webhook secret the webhook refuses every event.
#[derive(Clone, Debug)]
pub struct StripeConfig {
    pub secret_key: Option<SecretString>,
    pub webhook_secrets: Vec<SecretString>,
    pub webhook_tolerance_secs: i64,
    pub api_base: String,
    pub return_url: String,
    pub reconcile_every: Option<std::time::Duration>,
}

impl Default for StripeConfig {
    /// Stripe off.
    fn default() -> Self {
        StripeConfig {
            secret_key: None,
            webhook_secrets: Vec::new(),
            webhook_tolerance_secs: 300,
            api_base: "https://api.stripe.com".into(),
            return_url: "http://localhost:3000/billing".into(),
            reconcile_every: None,
        }
    }
}

impl Settings {
    /// Check every setting; the error says which one and how to fix it.
    pub fn validate(&self) -> Result<Config, ConfigError> {
        let listener = self.listener.validate()?;
        let database_url = self.database.validate()?;
        let rules = self.rules.validate()?;
        let stripe = self.stripe.validate()?;
        let (period_settle, notify) = self.jobs.validate(rules.lease)?;
        let jobs_idle_wait = self.jobs.idle_wait()?;
        Ok(Config {
            database_url,
            listen: listener.listen,
            plans_dir: self.plans.plans_dir.clone(),
            rules,
            bootstrap_admin_token: listener.bootstrap_admin_token,
            max_body_bytes: listener.max_body_bytes,
            max_connections: listener.max_connections,
            idle_connection: listener.idle_connection,
            stripe,
            rate_limit: listener.rate_limit,
            period_settle,
            notify,
            export_stall: listener.export_stall,
            jobs_idle_wait,
        })
    }
}

impl DatabaseArgs {
    fn validate(&self) -> Result<String, ConfigError> {
        let url = &self.database_url;
        if url.starts_with("sqlite:")
            || url.starts_with("postgres://")
            || url.starts_with("postgresql://")
        {
            return Ok(url.clone());
        }
        Err(bad(
            "--database-url / RUSH_METER_DATABASE_URL",
            format!(
                "`{}` is neither sqlite://FILE nor postgres://…",
                redact_url(url)
            ),
        ))
    }
}

impl RulesArgs {
    fn validate(&self) -> Result<Rules, ConfigError> {
        let (interval, lease) = (self.heartbeat_interval_secs, self.lease_secs);
        if !(1..=3600).contains(&interval) {
            return Err(bad(
                "--heartbeat-interval-secs / RUSH_METER_HEARTBEAT_INTERVAL_SECS",
                format!("must be 1 to 3600 (got {interval})"),
            ));
        }
        if lease < interval || lease > 86_400 {
            return Err(bad(
                "--lease-secs / RUSH_METER_LEASE_SECS",
                format!(
                    "must be at least the heartbeat interval ({interval}) and at most 86400 \
                     (got {lease})"
                ),
            ));
        }
        Ok(Rules { interval, lease })
    }
}

/// The listener's settings, validated.
struct Listener {
    listen: SocketAddr,
    bootstrap_admin_token: Option<SecretString>,
    max_body_bytes: usize,
    max_connections: usize,
    idle_connection: std::time::Duration,
    rate_limit: Option<RateLimit>,
    export_stall: std::time::Duration,
}

/// `Err` naming `setting` unless `value` is at least 1.
fn at_least_one(setting: &'static str, value: u64) -> Result<(), ConfigError> {
    if value < 1 {
        return Err(bad(setting, "must be at least 1"));
    }
    Ok(())
}

impl ListenerArgs {
    fn validate(&self) -> Result<Listener, ConfigError> {
        let listen: SocketAddr = self.listen.parse().map_err(|_| {
            bad(
                "--listen / RUSH_METER_LISTEN",
                format!("`{}` is not an address such as 127.0.0.1:8080", self.listen),
            )
        })?;
        if let Some(t) = &self.bootstrap_admin_token {
            if t.len() < 16 || t.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return Err(bad(
                    "--bootstrap-admin-token / RUSH_METER_BOOTSTRAP_ADMIN_TOKEN",
                    "use at least 16 characters without spaces",
                ));
            }
        }
        if self.max_body_bytes < 1024 {
            return Err(bad(
                "--max-body-bytes / RUSH_METER_MAX_BODY_BYTES",
                "must be at least 1024",
            ));
        }
        if self.rate_limit_per_sec > 0 && self.rate_limit_burst < 1 {
            return Err(bad(
                "--rate-limit-burst / RUSH_METER_RATE_LIMIT_BURST",
                "must be at least 1",
            ));
        }
        at_least_one(
            "--max-connections / RUSH_METER_MAX_CONNECTIONS",
            self.max_connections as u64,
        )?;
        at_least_one(
            "--idle-connection-secs / RUSH_METER_IDLE_CONNECTION_SECS",
            self.idle_connection_secs,
        )?;
        at_least_one(
            "--export-stall-secs / RUSH_METER_EXPORT_STALL_SECS",
            self.export_stall_secs,
        )?;
        Ok(Listener {
            listen,
            bootstrap_admin_token: self
                .bootstrap_admin_token
                .as_deref()
                .map(SecretString::from),
            max_body_bytes: self.max_body_bytes,
            max_connections: self.max_connections,
            idle_connection: std::time::Duration::from_secs(self.idle_connection_secs),
            rate_limit: (self.rate_limit_per_sec > 0).then(|| RateLimit {
                per_sec: f64::from(self.rate_limit_per_sec),
                burst: f64::from(self.rate_limit_burst),
            }),
            export_stall: std::time::Duration::from_secs(self.export_stall_secs),
        })
    }
}

impl StripeArgs {
    fn validate(&self) -> Result<StripeConfig, ConfigError> {
        if !(1..=86_400).contains(&self.stripe_webhook_tolerance_secs) {
            return Err(bad(
                "--stripe-webhook-tolerance-secs / RUSH_METER_STRIPE_WEBHOOK_TOLERANCE_SECS",
                format!(
                    "must be 1 to 86400 (got {})",
                    self.stripe_webhook_tolerance_secs
                ),
            ));
        }
        http_url(
            "--stripe-api-base / RUSH_METER_STRIPE_API_BASE",
            &self.stripe_api_base,
        )?;
        http_url(
            "--stripe-return-url / RUSH_METER_STRIPE_RETURN_URL",
            &self.stripe_return_url,
        )?;
        Ok(StripeConfig {
            secret_key: self
                .stripe_secret_key
                .as_deref()
                .filter(|k| !k.is_empty())
                .map(SecretString::from),
            webhook_secrets: self
                .stripe_webhook_secret
                .iter()
                .flat_map(|s| s.split(','))
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(SecretString::from)
                .collect(),
            webhook_tolerance_secs: self.stripe_webhook_tolerance_secs,
            api_base: self.stripe_api_base.trim_end_matches('/').to_owned(),
            return_url: self.stripe_return_url.clone(),
            reconcile_every: (self.stripe_reconcile_secs > 0)
                .then(|| std::time::Duration::from_secs(self.stripe_reconcile_secs)),
        })
    }
}

impl JobArgs {
    /// The period settle time and the notifications, checked against the `lease`.
    fn validate(&self, lease: Secs) -> Result<(Option<Secs>, Option<NotifyConfig>), ConfigError> {
        let settle = self.period_settle_secs;
        if settle < 0 || (settle > 0 && settle < lease) {
            return Err(bad(
                "--period-settle-secs / RUSH_METER_PERIOD_SETTLE_SECS",
                format!("0 (off) or at least the lease ({lease}) (got {settle})"),
            ));
        }
        let notify = match (&self.notify_url, &self.notify_secret) {
            (None, None) => None,
            (Some(url), Some(secret)) if !secret.is_empty() => {
                http_url("--notify-url / RUSH_METER_NOTIFY_URL", url)?;
                Some(NotifyConfig {
                    url: url.clone(),
                    secret: SecretString::from(secret.as_str()),
                })
            }
            _ => {
                return Err(bad(
                    "--notify-url and --notify-secret (RUSH_METER_NOTIFY_URL, RUSH_METER_NOTIFY_SECRET)",
                    "they go together: set both or neither",
                ))
            }
        };
        Ok(((settle > 0).then_some(settle), notify))
    }

    /// The idle jobs' longest wait: a second to an hour.
    fn idle_wait(&self) -> Result<std::time::Duration, ConfigError> {
        match self.jobs_idle_secs {
            secs @ 1..=3600 => Ok(std::time::Duration::from_secs(secs)),
            secs => Err(bad(
                "--jobs-idle-secs / RUSH_METER_JOBS_IDLE_SECS",
                format!("from 1 to 3600 seconds (got {secs})"),
            )),
        }
    }
}

/// An http(s) URL, or the error for `setting`.
fn http_url(setting: &'static str, url: &str) -> Result<(), ConfigError> {
    match url::Url::parse(url) {
        Ok(u) if matches!(u.scheme(), "http" | "https") => Ok(()),
        _ => Err(bad(setting, format!("`{url}` is not an http(s) URL"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The settings of a `serve` command line.
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        database: DatabaseArgs,
        #[command(flatten)]
        serve: ServeArgs,
    }

    struct Parsed {
        settings: Settings,
    }

    fn parse(args: &[&str]) -> Parsed {
        use clap::Parser;
        let cli =
            Cli::try_parse_from(std::iter::once("rush-meter").chain(args.iter().copied())).unwrap();
        Parsed {
            settings: Settings::of(&cli.database, &cli.serve),
        }
    }

    #[test]
    fn defaults_match_the_contract() {
        let c = parse(&[]).settings.validate().unwrap();
        assert_eq!(c.database_url, "sqlite://rush-meter.db");
        assert_eq!(c.listen.to_string(), "127.0.0.1:8080");
        assert_eq!((c.rules.interval, c.rules.lease), (15, 45));
    }

    #[test]
    fn bad_settings_name_the_setting() {
        let e = parse(&["--lease-secs", "5"])
            .settings
            .validate()
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("--lease-secs"), "{e}");
        let e = parse(&["--listen", "nope"])
            .settings
            .validate()
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("--listen"), "{e}");
        let e = parse(&["--database-url", "mysql://x"])
            .settings
            .validate()
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("--database-url"), "{e}");
        let e = parse(&["--bootstrap-admin-token", "short"])
            .settings
            .validate()
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("--bootstrap-admin-token"), "{e}");
    }

    #[test]
    fn secrets_never_print() {
        let c = parse(&["--bootstrap-admin-token", "0123456789abcdefXYZ"]);
        assert!(!format!("{:?}", c.settings).contains("XYZ"));
        let cfg = c.settings.validate().unwrap();
        assert!(!format!("{cfg:?}").contains("XYZ"));
        use secrecy::ExposeSecret;
        assert_eq!(
            cfg.bootstrap_admin_token.unwrap().expose_secret(),
            "0123456789abcdefXYZ"
        );
        assert_eq!(redact_url("postgres://u:pw@h/db"), "postgres://u:***@h/db");
    }
}
