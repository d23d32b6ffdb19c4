//! `rush-meter stripe reconcile` and `rush-meter stripe invoice-report`.

use std::sync::Arc;

use super::CliResult;
use crate::app;
use crate::billing::invoice_report::{invoice_report as report, parse_period};
use crate::billing::Billing;
use crate::clock::Clock;
use crate::config::{load_plans, Config};

/// The Stripe side of the service for a one-off command.
async fn billing(config: &Config) -> Result<Billing, super::CliError> {
    if config.stripe.secret_key.is_none() {
        return Err("Stripe is off: set --stripe-secret-key / RUSH_METER_STRIPE_SECRET_KEY".into());
    }
    let db = app::open_db(config).await?;
    let plans = Arc::new(load_plans(&config.plans_dir)?);
    Ok(Billing::new(
        db,
        plans,
        Clock::System,
        config.stripe.clone(),
        Arc::default(),
    ))
}

pub(super) fn spinner(what: &str) -> indicatif::ProgressBar {
    indicatif::ProgressBar::new_spinner().with_style(
        indicatif::ProgressStyle::with_template(&format!(
            "{{spinner}} {{pos}} {what}, {{elapsed}} {{msg}}"
        ))
        .expect("a valid template"),
    )
}

/// The report as CSV on standard output, one line an org.
pub async fn invoice_report(config: &Config, period: &str) -> CliResult {
    let month = parse_period(period, chrono::Utc::now().timestamp())?;
    let billing = billing(config).await?;
    let bar = spinner("orgs");
    let lines = report(&billing, month, |org| {
        bar.inc(1);
        bar.set_message(org.to_owned());
    })
    .await;
    bar.finish_and_clear();
    billing.db.close().await;
    let mut out = csv::Writer::from_writer(std::io::stdout().lock());
    let fail = |e: csv::Error| format!("writing the report: {e}");
    out.write_record([
        "period",
        "org_id",
        "plan",
        "stripe_customer_id",
        "agent_seconds",
        "agent_hours",
        "ledger_owes",
        "stripe_invoiced",
        "invoices",
        "difference",
        "overage_owed",
        "overage_invoiced",
        "unreadable_invoices",
    ])
    .map_err(fail)?;
    let (mut off, mut unreadable) = (0, 0);
    for l in lines? {
        off += usize::from(!l.difference.is_zero());
        unreadable += l.unreadable.len();
        out.write_record([
            period,
            &l.org_id,
            &l.plan,
            l.stripe_customer_id.as_deref().unwrap_or(""),
            &l.agent_seconds.to_string(),
            &l.agent_hours,
            &l.ledger_owes.to_string(),
            &l.stripe_invoiced.to_string(),
            &l.invoices.to_string(),
            &l.difference.to_string(),
            &l.overage_owed.to_string(),
            &l.overage_invoiced.to_string(),
            &l.unreadable.join("; "),
        ])
        .map_err(fail)?;
    }
    out.flush()
        .map_err(|e| format!("writing the report: {e}"))?;
    eprintln!("{off} orgs where Stripe's invoices differ from what the ledger says they owe");
    if unreadable > 0 {
        eprintln!(
            "{unreadable} invoices could not be read and are left out (named in unreadable_invoices)"
        );
    }
    Ok(())
}

pub async fn reconcile(config: &Config) -> CliResult {
    let billing = billing(config).await?;
    let db = billing.db.clone();
    let bar = spinner("subscriptions read");
    let report = crate::billing::reconcile::reconcile(&billing, |id| {
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
    for (sub, why) in &report.unreadable {
        println!("unreadable {sub}: {why}");
    }
    println!(
        "{} subscriptions read, {} orgs repaired, {} failed, {} unreadable (skipped)",
        report.subscriptions,
        report.changed.len(),
        report.failed.len(),
        report.unreadable.len()
    );
    let unapplied = report.failed.len() + report.unreadable.len();
    if unapplied == 0 {
        Ok(())
    } else {
        Err(format!("{unapplied} subscriptions could not be read or applied (listed above)").into())
    }
}
