//! `rush-meter export`: finance's export of a month, streamed with a progress bar.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};

use rush_meter_core::export::{month_name, parse_month, By, Format};

use super::CliResult;
use crate::app::{self, periods};
use crate::config::{load_plans, Config};

/// Streams the export to `out` (a temporary file renamed into place when complete, so a
/// failed export never leaves a file that looks whole) or to standard output.
pub async fn export(
    config: &Config,
    period: &str,
    by: &str,
    format: &str,
    out: Option<&Path>,
) -> CliResult {
    let month = parse_month(period).map_err(|m| format!("--{m}"))?;
    let by = By::parse_named(by).map_err(|e| format!("--by: {e}"))?;
    let format = Format::parse_named(format).map_err(|e| format!("--format: {e}"))?;
    let plans = load_plans(&config.plans_dir)?;
    let db = app::open_db(config).await?;
    let now = chrono::Utc::now().timestamp();
    let q = periods::line_query(&db, month, now)
        .await
        .map_err(|e| format!("--{e}"))?;
    // The bar's length costs a count of the lines: only for a bar someone sees (indicatif
    // draws nothing when standard error is not a terminal).
    let total = match (std::io::stderr().is_terminal(), by) {
        (false, _) => 0,
        (true, By::Session) => db.count_session_lines(&q).await?,
        (true, By::Org) => db.orgs_before(month.end).await?.len() as i64,
    };
    let bar = indicatif::ProgressBar::new(u64::try_from(total).unwrap_or(0)).with_style(
        indicatif::ProgressStyle::with_template(
            "{bar:40} {pos}/{len} rows, {per_sec}, {elapsed} (eta {eta})",
        )
        .expect("a valid template"),
    );
    let temp = out.map(|p| {
        let mut name = p.as_os_str().to_owned();
        name.push(".partial");
        PathBuf::from(name)
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
    // Lines are read and formatted on a task of their own while this one writes them, so
    // that both cores work (PostgreSQL writes its rows on one of them too).
    let run = {
        let db = db.clone();
        tokio::spawn(
            async move { periods::produce(&db, &plans, q, by, format, now, None, tx).await },
        )
    };
    // Rows counted here, not by the bar: a bar drawn nowhere (standard error not a
    // terminal) keeps no position.
    let mut rows: u64 = 0;
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
            rows += chunk.rows;
        }
        result.and_then(|()| sink.flush().map_err(|e| format!("writing the export: {e}")))
    };
    let (ran, wrote) = tokio::join!(run, write);
    bar.finish_and_clear();
    db.close().await;
    drop(sink);
    let ran = match ran {
        Ok(r) => r.map_err(|e| e.to_string()),
        Err(e) => Err(format!("the export's task failed: {e}")),
    };
    let done = ran.and(wrote);
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
        rows,
        month_name(month),
        if q.closed {
            "closed"
        } else {
            "open: it may still change"
        },
        by.as_str()
    );
    Ok(())
}
