//! The `rush-meter` command: the clap tree, and one file a command.

mod audit;
mod export;
mod period;
mod plans;
mod serve;
mod simulate;
mod stripe;
mod token;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::config::{
    Config, DatabaseArgs, LogArgs, PlansArgs, RulesArgs, ServeArgs, Settings, StripeArgs,
};

/// What a command failed with: a message for the person who ran it (exit code 2).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct CliError(pub String);

impl From<String> for CliError {
    fn from(m: String) -> Self {
        CliError(m)
    }
}

impl From<&str> for CliError {
    fn from(m: &str) -> Self {
        CliError(m.to_owned())
    }
}

/// Errors of the layers below, as their own words say them.
macro_rules! from_display {
    ($($t:ty),*) => {$(
        impl From<$t> for CliError {
            fn from(e: $t) -> Self {
                CliError(e.to_string())
            }
        }
    )*};
}

from_display!(
    crate::store::StoreError,
    crate::app::StartError,
    crate::billing::BillingError,
    crate::config::ConfigError,
    rush_meter_core::plans::PlanError
);

pub type CliResult = Result<(), CliError>;

/// Each command takes the flags it uses (`--help` after a command lists them); the
/// database and the log format are every command's, before or after its name. Without a
/// command, `serve` runs, and takes its flags.
#[derive(Parser)]
#[command(
    name = "rush-meter",
    version,
    about = "Metering, quota and billing for cloud coding agents"
)]
pub struct Cli {
    #[command(flatten)]
    pub database: DatabaseArgs,
    #[command(flatten)]
    pub log: LogArgs,
    /// `serve`'s, when no command is named.
    #[command(flatten)]
    pub serve: ServeArgs,
    #[command(subcommand)]
    pub command: Option<Command>,
}

impl Cli {
    /// The command line `args` (the program's name first), or clap's error. `serve` is the
    /// default command, so its flags may come before or after its name; before another
    /// command's name they are refused, since no other command reads them.
    pub fn try_parse_args<I, T>(args: I) -> Result<Cli, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        use clap::{Args, CommandFactory, FromArgMatches};
        let mut args: Vec<std::ffi::OsString> = args.into_iter().map(Into::into).collect();
        let mut cmd = Cli::command();
        let mut matches = cmd.try_get_matches_from_mut(args.clone())?;
        let serve = ServeArgs::augment_args(clap::Command::new("serve"));
        let given_before = serve.get_arguments().find(|a| {
            matches.value_source(a.get_id().as_str())
                == Some(clap::parser::ValueSource::CommandLine)
        });
        match (matches.subcommand_name(), given_before) {
            (Some("serve"), Some(_)) => {
                // `rush-meter --lease-secs 60 serve --listen …` is `rush-meter --lease-secs
                // 60 --listen …`: the command's name dropped, every flag is the top level's.
                if let Some(i) = command_position(&args) {
                    args.remove(i);
                    matches = cmd.try_get_matches_from_mut(args)?;
                }
            }
            (Some(name), Some(arg)) => {
                let flag = arg.get_long().unwrap_or_default();
                return Err(cmd.error(
                    clap::error::ErrorKind::ArgumentConflict,
                    format!("--{flag} is a flag of `serve`, not of `{name}`"),
                ));
            }
            _ => {}
        }
        Cli::from_arg_matches(&matches).map_err(|e| e.format(&mut cmd))
    }

    /// Every setting: the command's flags, and for the groups it does not take, their
    /// environment variables and defaults (read by `serve`'s, parsed beside any command).
    pub fn settings(&self) -> Settings {
        let mut s = Settings::of(&self.database, &self.serve);
        match &self.command {
            Some(Command::Serve(serve)) => s = Settings::of(&self.database, serve),
            Some(Command::Export { plans, .. })
            | Some(Command::Plans(
                PlansCommand::List { plans } | PlansCommand::Migrate { plans, .. },
            ))
            | Some(Command::Period(PeriodCommand::Close { plans, .. })) => {
                s.plans = plans.clone();
            }
            Some(Command::Stripe(
                StripeCommand::Reconcile { plans, stripe }
                | StripeCommand::InvoiceReport { plans, stripe, .. },
            )) => {
                s.plans = plans.clone();
                s.stripe = stripe.clone();
            }
            Some(Command::Simulate(args)) => s.rules = args.rules.clone(),
            _ => {}
        }
        s
    }
}

#[derive(Subcommand)]
pub enum Command {
    /// Run the HTTP service (the default).
    Serve(ServeArgs),
    /// Bring the database schema up to date and exit.
    Migrate,
    /// Manage API tokens.
    #[command(subcommand)]
    Token(TokenCommand),
    /// Work with Stripe.
    #[command(subcommand)]
    Stripe(StripeCommand),
    /// Finance's usage export of a month, streamed with a progress bar.
    Export {
        /// The month, as YYYY-MM (a closed one comes out the same every time).
        #[arg(long)]
        period: String,
        /// One line an org (`org`) or a session (`session`).
        #[arg(long, default_value = "org")]
        by: String,
        /// `csv` or `jsonl`.
        #[arg(long, default_value = "csv")]
        format: String,
        /// Write here instead of to standard output.
        #[arg(long)]
        out: Option<PathBuf>,
        #[command(flatten)]
        plans: PlansArgs,
    },
    /// Billing periods (calendar months in UTC).
    #[command(subcommand)]
    Period(PeriodCommand),
    /// Plan versions: which there are, and moving orgs between them.
    #[command(subcommand)]
    Plans(PlansCommand),
    /// Drive a synthetic fleet against a running server in real time, then print per org
    /// what truly ran against what the meter billed, with the difference explained.
    /// Fails if the meter's bill departs from the ledger's rules. Give it the server's
    /// `--heartbeat-interval-secs` and `--lease-secs` (or their variables).
    Simulate(SimulateArgs),
    /// Who changed what: an org's audit log (plan, suspension, keys, limits, grants,
    /// pay-as-you-go, tokens), or without --org the service's own (tokens for no org,
    /// closed periods), oldest first.
    Audit {
        #[arg(long)]
        org: Option<String>,
        /// RFC 3339; default from the first entry.
        #[arg(long)]
        from: Option<String>,
        /// RFC 3339, exclusive; default to the last.
        #[arg(long)]
        to: Option<String>,
        /// One JSON object a line instead of text.
        #[arg(long)]
        json: bool,
    },
}

#[derive(clap::Args)]
pub struct SimulateArgs {
    /// The server to drive.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// The server's heartbeat interval and lease.
    #[command(flatten)]
    pub rules: RulesArgs,
    /// A token with the admin, admission, ingest and console scopes (the bootstrap admin
    /// token has them).
    #[arg(long, env = "RUSH_METER_TOKEN", hide_env_values = true)]
    pub token: String,
    /// Orgs to create, on `--plans` in turn.
    #[arg(long, default_value_t = 20)]
    pub orgs: usize,
    /// Session slots: at most this many sessions live at once.
    #[arg(long, default_value_t = 100)]
    pub sessions: usize,
    /// Host supervisors batching the heartbeats.
    #[arg(long, default_value_t = 10)]
    pub hosts: usize,
    /// How long to drive the fleet.
    #[arg(long, default_value_t = 120)]
    pub duration_secs: u64,
    /// How often each host flushes its batch.
    #[arg(long, default_value_t = 1000)]
    pub flush_ms: u64,
    /// Chance that a turn ends in a silent crash.
    #[arg(long, default_value_t = 0.05)]
    pub crash: f64,
    /// Chance that a session ends after a turn rather than parking.
    #[arg(long, default_value_t = 0.2)]
    pub end: f64,
    /// Plans of the orgs, comma-separated.
    #[arg(long, default_value = "free,pro,team", value_delimiter = ',')]
    pub plans: Vec<String>,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Prefix of the run's org and session ids (default `sim<unix time>`).
    #[arg(long)]
    pub run: Option<String>,
}

#[derive(Subcommand)]
pub enum PeriodCommand {
    /// Close a month (and any open month before it): freeze its totals for good. Usage
    /// that arrives later becomes an adjustment in the next month.
    Close {
        /// The month, as YYYY-MM; it must have ended.
        #[arg(long)]
        period: String,
        #[command(flatten)]
        plans: PlansArgs,
    },
    /// The closed periods with their totals.
    List,
}

#[derive(Subcommand)]
pub enum PlansCommand {
    /// Every version of every plan, with the orgs on it or moving to it (CSV).
    List {
        #[command(flatten)]
        plans: PlansArgs,
    },
    /// Move orgs from one version of a plan to another, each move in the audit log; a
    /// move to the version an org is on calls off one it has waiting. Prints each org's
    /// move and its room on both versions.
    Migrate {
        /// The plan's id.
        #[arg(long)]
        plan: String,
        /// The version the orgs are on.
        #[arg(long)]
        from: i64,
        /// The version they go to.
        #[arg(long)]
        to: i64,
        /// Only this org (default: every org on --from).
        #[arg(long)]
        org: Option<String>,
        /// `renewal` (with each org's next billing period), `now` (at its next decision,
        /// the window's use carried over) or an RFC 3339 time.
        #[arg(long)]
        at: String,
        /// List what would move, and move nothing.
        #[arg(long)]
        dry_run: bool,
        /// One JSON object a line instead of text.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        plans: PlansArgs,
    },
}

#[derive(Subcommand)]
pub enum StripeCommand {
    /// Read every subscription from Stripe, repair each org that is out of step, and
    /// print what changed (recorded in the change log too).
    Reconcile {
        #[command(flatten)]
        plans: PlansArgs,
        #[command(flatten)]
        stripe: StripeArgs,
    },
    /// For a closed month: what the ledger says each org used and owes, against what
    /// Stripe invoiced, with the differences (CSV on stdout).
    InvoiceReport {
        /// The month, as YYYY-MM.
        #[arg(long)]
        period: String,
        #[command(flatten)]
        plans: PlansArgs,
        #[command(flatten)]
        stripe: StripeArgs,
    },
}

#[derive(Subcommand)]
pub enum TokenCommand {
    /// Create a token and print its secret (shown this once; only its hash is stored).
    Create {
        /// Comma-separated scopes: ingest, admission, console, finance, admin; or member
        /// alone (a Team member's own page).
        #[arg(long)]
        scope: String,
        /// The one org the token acts on, whatever its scopes (required for `console` and
        /// `member`).
        #[arg(long)]
        org: Option<String>,
        /// The user a `member` token reads the own use of (an admission's `started_by`).
        #[arg(long)]
        user: Option<String>,
        /// A note to recognise the token by.
        #[arg(long, default_value = "")]
        label: String,
        /// How long it works: `90d`, `12h`, `30m`…; default until revoked.
        #[arg(long)]
        expires_in: Option<String>,
    },
    /// List tokens as CSV (id, label, scopes, org, state, created, last used, expiry,
    /// revocation); never a secret.
    List {
        /// Only the tokens bound to this org.
        #[arg(long)]
        org: Option<String>,
    },
    /// Revoke a token: every instance refuses it within 5 seconds.
    Revoke {
        /// The token's id (`tok_…`, as `token list` shows it).
        token_id: String,
    },
}

/// Where the command's name is in `args`: the first word that is neither a flag nor a
/// flag's value (every flag before a command's name takes one value).
fn command_position(args: &[std::ffi::OsString]) -> Option<usize> {
    let mut i = 1;
    while let Some(word) = args.get(i).and_then(|a| a.to_str()) {
        if !word.starts_with('-') {
            return Some(i);
        }
        let bare = ["-h", "--help", "-V", "--version"].contains(&word) || word.contains('=');
        i += if bare { 1 } else { 2 };
    }
    None
}

/// Run the command `cli` names on a validated `config`.
pub async fn run(command: Option<Command>, config: &Config) -> CliResult {
    let Some(command) = command else {
        return serve::serve(config).await;
    };
    match command {
        Command::Serve(_) => serve::serve(config).await,
        Command::Migrate => serve::migrate(config).await,
        Command::Token(TokenCommand::Create {
            scope,
            org,
            user,
            label,
            expires_in,
        }) => {
            token::create(
                config,
                &scope,
                (org.as_deref(), user.as_deref()),
                &label,
                expires_in.as_deref(),
            )
            .await
        }
        Command::Token(TokenCommand::List { org }) => token::list(config, org.as_deref()).await,
        Command::Token(TokenCommand::Revoke { token_id }) => token::revoke(config, &token_id).await,
        Command::Stripe(StripeCommand::Reconcile { .. }) => stripe::reconcile(config).await,
        Command::Stripe(StripeCommand::InvoiceReport { period, .. }) => {
            stripe::invoice_report(config, &period).await
        }
        Command::Export {
            period,
            by,
            format,
            out,
            ..
        } => export::export(config, &period, &by, &format, out.as_deref()).await,
        Command::Period(PeriodCommand::Close { period, .. }) => {
            period::close(config, &period).await
        }
        Command::Period(PeriodCommand::List) => period::list(config).await,
        Command::Plans(PlansCommand::List { .. }) => plans::list(config).await,
        Command::Plans(PlansCommand::Migrate {
            plan,
            from,
            to,
            org,
            at,
            dry_run,
            json,
            ..
        }) => {
            let args = plans::MigrateArgs {
                plan: &plan,
                from,
                to,
                org: org.as_deref(),
                at: &at,
                dry_run,
                json,
            };
            plans::migrate(config, args).await
        }
        Command::Simulate(args) => simulate::simulate(config, args).await,
        Command::Audit {
            org,
            from,
            to,
            json,
        } => audit::audit(config, org.as_deref(), from.as_deref(), to.as_deref(), json).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Cli {
        Cli::try_parse_args(std::iter::once("rush-meter").chain(args.iter().copied())).unwrap()
    }

    #[test]
    fn flags_work_before_and_after_the_command() {
        let c = parse(&["serve", "--lease-secs", "60"]);
        assert_eq!(c.settings().rules.lease_secs, 60);
        let c = parse(&["--lease-secs", "61"]);
        assert_eq!(c.settings().rules.lease_secs, 61);
        assert!(c.command.is_none());
        let c = parse(&["--lease-secs", "62", "serve", "--listen", "127.0.0.1:9"]);
        let s = c.settings();
        assert_eq!(
            (s.rules.lease_secs, s.listener.listen.as_str()),
            (62, "127.0.0.1:9")
        );
        let c = parse(&[
            "--listen=127.0.0.1:8",
            "--database-url",
            "sqlite://c.db",
            "serve",
        ]);
        let s = c.settings();
        assert_eq!(s.listener.listen, "127.0.0.1:8");
        assert_eq!(s.database.database_url, "sqlite://c.db");
        let c = parse(&["--database-url", "sqlite://a.db", "migrate"]);
        assert_eq!(c.settings().database.database_url, "sqlite://a.db");
        let c = parse(&["token", "list", "--database-url", "sqlite://b.db"]);
        assert_eq!(c.settings().database.database_url, "sqlite://b.db");
    }

    #[test]
    fn each_command_takes_only_its_own_flags() {
        let refused = |args: &[&str]| {
            Cli::try_parse_args(std::iter::once("rush-meter").chain(args.iter().copied())).is_err()
        };
        assert!(refused(&["token", "list", "--listen", "127.0.0.1:1"]));
        assert!(refused(&[
            "token",
            "create",
            "--scope",
            "admin",
            "--stripe-secret-key",
            "k"
        ]));
        assert!(refused(&["migrate", "--lease-secs", "60"]));
        assert!(refused(&["--lease-secs", "60", "migrate"]));
        assert!(!refused(&[
            "export",
            "--period",
            "2026-10",
            "--plans-dir",
            "p"
        ]));
        assert!(!refused(&[
            "simulate",
            "--token",
            "t",
            "--lease-secs",
            "60"
        ]));
        let help = |args: &[&str]| {
            let line = std::iter::once("rush-meter").chain(args.iter().copied());
            match Cli::try_parse_args(line.chain(["--help"])) {
                Err(e) if e.kind() == clap::error::ErrorKind::DisplayHelp => e.to_string(),
                _ => panic!("no help for {args:?}"),
            }
        };
        let token = help(&["token", "create"]);
        assert!(
            token.contains("--database-url") && token.contains("--scope"),
            "{token}"
        );
        for other in [
            "--listen",
            "--stripe-secret-key",
            "--max-connections",
            "--lease-secs",
        ] {
            assert!(!token.contains(other), "{other} in {token}");
        }
        let serve = help(&["serve"]);
        assert!(
            serve.contains("--listen") && serve.contains("--stripe-secret-key"),
            "{serve}"
        );
    }
}
