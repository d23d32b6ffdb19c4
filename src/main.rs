//! The `rush-meter` command: `serve` (the default), `migrate`, `token create`.

use std::process::ExitCode;

use clap::Parser;
use rush_meter::clock::Clock;
use rush_meter::config::{Cli, Command, Config, PeriodCommand, StripeCommand, TokenCommand};
use rush_meter::ids::Id;
use rush_meter::server::{self, App};
use rush_meter::tokens::{new_token, parse_scopes, Scope};
use tracing_subscriber::EnvFilter;

// glibc's malloc serialises the many small allocations of HTTP and SQL work on its arena
// locks; mimalloc keeps them per thread.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_env("RUST_LOG").unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let config = match cli.settings.validate() {
        Ok(c) => c,
        Err(e) => return fail(&e),
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail(&format!("cannot start the async runtime: {e}")),
    };
    let result = runtime.block_on(async {
        match cli.command.unwrap_or(Command::Serve) {
            Command::Serve => serve(&config).await,
            Command::Migrate => migrate(&config).await,
            Command::Token(TokenCommand::Create { scope, org, label }) => {
                create_token(&config, &scope, org.as_deref(), &label).await
            }
            Command::Stripe(StripeCommand::Reconcile) => stripe_reconcile(&config).await,
            Command::Stripe(StripeCommand::InvoiceReport { period }) => {
                invoice_report(&config, &period).await
            }
            Command::Export {
                period,
                by,
                format,
                out,
            } => export(&config, &period, &by, &format, out.as_deref()).await,
            Command::Period(PeriodCommand::Close { period }) => {
                close_period(&config, &period).await
            }
            Command::Period(PeriodCommand::List) => list_periods(&config).await,
            Command::Simulate(args) => simulate(&config, args).await,
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(&e),
    }
}

async fn simulate(config: &Config, a: rush_meter::config::SimulateArgs) -> Result<(), String> {
    use std::io::IsTerminal;
    if !(0.0..=1.0).contains(&a.crash) || !(0.0..=1.0).contains(&(a.crash + a.end)) {
        return Err("--crash and --end are chances: each 0 to 1, and together at most 1".into());
    }
    let run = a
        .run
        .unwrap_or_else(|| format!("sim{}", rush_meter::clock::Clock::System.now()));
    Id::parse(&format!("{run}-org000")).map_err(|m| format!("--run: {m}"))?;
    let outcome = rush_meter::simulate::run(rush_meter::simulate::Options {
        url: a.url.trim_end_matches('/').to_owned(),
        token: a.token,
        orgs: a.orgs,
        sessions: a.sessions,
        hosts: a.hosts,
        duration: std::time::Duration::from_secs(a.duration_secs),
        rules: config.rules,
        flush: std::time::Duration::from_millis(a.flush_ms.max(1)),
        crash: a.crash,
        end: a.end,
        plans: a.plans,
        seed: a.seed,
        run,
        progress: std::io::stderr().is_terminal(),
    })
    .await?;
    println!("{}\n\n{}", outcome.table(), outcome.summary);
    match outcome.mismatched() {
        0 => Ok(()),
        n => Err(format!(
            "the meter's bill departs from the ledger's rules for {n} sessions (the `mismatched` \
             column); check that --heartbeat-interval-secs and --lease-secs match the server's"
        )),
    }
}

fn fail(message: &str) -> ExitCode {
    eprintln!("rush-meter: {message}");
    ExitCode::from(2)
}

async fn serve(config: &Config) -> Result<(), String> {
    let app = App::start(config, Clock::System)
        .await
        .map_err(|e| e.to_string())?;
    let listener = server::bind(config).await.map_err(|e| e.to_string())?;
    tracing::info!(
        listen = %config.listen,
        database = app.state.db.backend(),
        "rush-meter serving"
    );
    app.serve(listener, server::shutdown_signal())
        .await
        .map_err(|e| format!("server error: {e}"))
}

/// The Stripe side of the service for a one-off command.
async fn billing(config: &Config) -> Result<rush_meter::billing::Billing, String> {
    if config.stripe.secret_key.is_none() {
        return Err("Stripe is off: set --stripe-secret-key / RUSH_METER_STRIPE_SECRET_KEY".into());
    }
    let db = server::open_db(config).await.map_err(|e| e.to_string())?;
    let plans = std::sync::Arc::new(
        rush_meter::plans::Plans::load_dir(&config.plans_dir).map_err(|e| e.to_string())?,
    );
    Ok(rush_meter::billing::Billing::new(
        db,
        plans,
        Clock::System,
        config.stripe.clone(),
        std::sync::Arc::default(),
    ))
}

fn spinner(what: &str) -> indicatif::ProgressBar {
    indicatif::ProgressBar::new_spinner().with_style(
        indicatif::ProgressStyle::with_template(&format!(
            "{{spinner}} {{pos}} {what}, {{elapsed}} {{msg}}"
        ))
        .expect("a valid template"),
    )
}

async fn invoice_report(config: &Config, period: &str) -> Result<(), String> {
    use rush_meter::billing::invoice_report::{invoice_report, parse_period};
    let month = parse_period(period, chrono::Utc::now().timestamp())?;
    let billing = billing(config).await?;
    let bar = spinner("orgs");
    let lines = invoice_report(&billing, month, |org| {
        bar.inc(1);
        bar.set_message(org.to_owned());
    })
    .await;
    bar.finish_and_clear();
    billing.db.close().await;
    println!("period,org_id,plan,stripe_customer_id,agent_seconds,agent_hours,ledger_owes,stripe_invoiced,invoices,difference");
    let mut off = 0;
    for l in lines? {
        off += usize::from(!l.difference.is_zero());
        println!(
            "{period},{},{},{},{},{},{},{},{},{}",
            l.org_id,
            l.plan,
            l.stripe_customer_id.unwrap_or_default(),
            l.agent_seconds,
            l.agent_hours,
            l.ledger_owes,
            l.stripe_invoiced,
            l.invoices,
            l.difference
        );
    }
    eprintln!("{off} orgs where Stripe's invoices differ from what the ledger says they owe");
    Ok(())
}

async fn stripe_reconcile(config: &Config) -> Result<(), String> {
    let billing = billing(config).await?;
    let db = billing.db.clone();
    let bar = indicatif::ProgressBar::new_spinner().with_style(
        indicatif::ProgressStyle::with_template(
            "{spinner} {pos} subscriptions read, {elapsed} {msg}",
        )
        .expect("a valid template"),
    );
    let report = rush_meter::billing::reconcile::reconcile(&billing, |id| {
        bar.inc(1);
        bar.set_message(id.to_owned());
    })
    .await;
    bar.finish_and_clear();
    db.close().await;
    let report = report?;
    for (org, change) in &report.changed {
        println!("changed {org}: {change}");
    }
    for (sub, why) in &report.failed {
        println!("failed {sub}: {why}");
    }
    println!(
        "{} subscriptions read, {} orgs repaired, {} failed",
        report.subscriptions,
        report.changed.len(),
        report.failed.len()
    );
    if report.failed.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{} subscriptions could not be applied (listed above)",
            report.failed.len()
        ))
    }
}

async fn open_with_plans(
    config: &Config,
) -> Result<(rush_meter::store::Db, rush_meter::plans::Plans), String> {
    let plans = rush_meter::plans::Plans::load_dir(&config.plans_dir).map_err(|e| e.to_string())?;
    let db = server::open_db(config).await.map_err(|e| e.to_string())?;
    Ok((db, plans))
}

/// Streams the export to `out` (a temporary file renamed into place when complete, so a
/// failed export never leaves a file that looks whole) or to standard output.
async fn export(
    config: &Config,
    period: &str,
    by: &str,
    format: &str,
    out: Option<&std::path::Path>,
) -> Result<(), String> {
    use rush_meter::export::{self, lines::Format, By};
    use std::io::Write;
    let month = export::parse_month(period).map_err(|m| format!("--{m}"))?;
    let by = By::parse(by).ok_or_else(|| format!("--by: `{by}` is neither org nor session"))?;
    let format = Format::parse(format)
        .ok_or_else(|| format!("--format: `{format}` is neither csv nor jsonl"))?;
    let (db, plans) = open_with_plans(config).await?;
    let now = chrono::Utc::now().timestamp();
    let q = export::line_query(&db, month, now)
        .await
        .map_err(|e| format!("--{e}"))?;
    let total = match by {
        By::Session => db.count_session_lines(&q).await,
        By::Org => db.orgs_before(month.end).await.map(|o| o.len() as i64),
    }
    .map_err(|e| e.to_string())?;
    let bar = indicatif::ProgressBar::new(u64::try_from(total).unwrap_or(0)).with_style(
        indicatif::ProgressStyle::with_template(
            "{bar:40} {pos}/{len} rows, {per_sec}, {elapsed} (eta {eta})",
        )
        .expect("a valid template"),
    );
    let temp = out.map(|p| {
        let mut name = p.as_os_str().to_owned();
        name.push(".partial");
        std::path::PathBuf::from(name)
    });
    let mut sink: Box<dyn Write + Send> = match &temp {
        Some(t) => {
            Box::new(std::fs::File::create(t).map_err(|e| format!("--out: {}: {e}", t.display()))?)
        }
        None => Box::new(std::io::BufWriter::with_capacity(
            1 << 16,
            std::io::stdout(),
        )),
    };
    let (tx, mut rx) = tokio::sync::mpsc::channel(8);
    let run = export::produce(&db, &plans, q, by, format, now, tx);
    let write = async {
        let mut result = Ok(());
        while let Some(chunk) = rx.recv().await {
            if let Err(e) = sink.write_all(&chunk.bytes) {
                result = Err(format!("writing the export: {e}"));
                // Stops the export, which would otherwise wait for room forever.
                rx.close();
                break;
            }
            bar.inc(chunk.rows);
        }
        result.and_then(|()| sink.flush().map_err(|e| format!("writing the export: {e}")))
    };
    let (ran, wrote) = tokio::join!(run, write);
    bar.finish_and_clear();
    db.close().await;
    drop(sink);
    let done = ran.map_err(|e| e.to_string()).and(wrote);
    if let (Some(t), Some(o)) = (&temp, out) {
        match &done {
            Ok(()) => std::fs::rename(t, o).map_err(|e| format!("--out: {}: {e}", o.display()))?,
            Err(_) => {
                let _ = std::fs::remove_file(t);
            }
        }
    }
    done?;
    eprintln!(
        "{} rows of {} ({}), {}",
        bar.position(),
        export::month_name(month),
        if q.closed {
            "closed"
        } else {
            "open: it may still change"
        },
        by.as_str()
    );
    Ok(())
}

async fn close_period(config: &Config, period: &str) -> Result<(), String> {
    use rush_meter::export;
    let month = export::parse_month(period).map_err(|m| format!("--{m}"))?;
    let (db, plans) = open_with_plans(config).await?;
    let closed = export::close_through(&db, &plans, month, chrono::Utc::now().timestamp()).await;
    db.close().await;
    let closed = closed.map_err(|e| format!("--{e}"))?;
    if closed.is_empty() {
        println!("{} was already closed", export::month_name(month));
    }
    for p in closed {
        println!(
            "closed {}: {} orgs, {} sessions, {} agent-seconds, {} adjustment seconds",
            rush_meter::quota::format_rfc3339(p.period_start)
                .get(..7)
                .unwrap_or_default(),
            p.orgs,
            p.sessions,
            p.agent_seconds,
            p.adjustment_seconds
        );
    }
    Ok(())
}

async fn list_periods(config: &Config) -> Result<(), String> {
    let db = server::open_db(config).await.map_err(|e| e.to_string())?;
    let periods = db.list_periods().await;
    db.close().await;
    println!("period,closed_at,orgs,sessions,agent_seconds,adjustment_seconds");
    for p in periods.map_err(|e| e.to_string())? {
        println!(
            "{},{},{},{},{},{}",
            rush_meter::quota::format_rfc3339(p.period_start)
                .get(..7)
                .unwrap_or_default(),
            rush_meter::quota::format_rfc3339(p.closed_at),
            p.orgs,
            p.sessions,
            p.agent_seconds,
            p.adjustment_seconds
        );
    }
    Ok(())
}

async fn migrate(config: &Config) -> Result<(), String> {
    let db = server::open_db(config).await.map_err(|e| e.to_string())?;
    println!("schema up to date ({})", db.backend());
    db.close().await;
    Ok(())
}

async fn create_token(
    config: &Config,
    scope: &str,
    org: Option<&str>,
    label: &str,
) -> Result<(), String> {
    let scopes = parse_scopes(scope).map_err(|e| format!("--scope: {e}"))?;
    if let Some(o) = org {
        Id::parse(o).map_err(|e| format!("--org: {e}"))?;
    }
    if scopes.contains(&Scope::Console) && org.is_none() {
        return Err("--org: a console token reads one org; name it with --org ORG".into());
    }
    let db = server::open_db(config).await.map_err(|e| e.to_string())?;
    if let Some(o) = org {
        if db.get_org(o).await.map_err(|e| e.to_string())?.is_none() {
            return Err(format!(
                "--org: no org `{o}`; create it first (PUT /v1/orgs/{o})"
            ));
        }
    }
    let now = chrono::Utc::now().timestamp();
    let (row, secret) = new_token(&scopes, org, label, now);
    db.insert_token(&row).await.map_err(|e| e.to_string())?;
    db.close().await;
    eprintln!(
        "created token {} with scopes {}{}; the secret is shown once:",
        row.token_id,
        row.scopes,
        org.map(|o| format!(" for org {o}")).unwrap_or_default()
    );
    println!("{secret}");
    Ok(())
}
