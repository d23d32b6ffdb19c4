//! `rush-meter serve` (the default) and `rush-meter migrate`.

use super::CliResult;
use crate::app::{self, App};
use crate::clock::Clock;
use crate::config::Config;

pub async fn serve(config: &Config) -> CliResult {
    let app = App::start(config, Clock::System).await?;
    let listener = app::bind(config).await?;
    // The bound address, not the configured one: `--listen 127.0.0.1:0` takes a free port,
    // and this line is how the caller (a test, a supervisor) learns which.
    let listen = listener.local_addr().unwrap_or(config.listen);
    tracing::info!(
        listen = %listen,
        database = app.services.db.backend().as_str(),
        console = %format_args!("http://{listen}/console"),
        "rush-meter serving"
    );
    crate::http::serve(app, config, listener, app::shutdown_signal())
        .await
        .map_err(|e| format!("server error: {e}").into())
}

pub async fn migrate(config: &Config) -> CliResult {
    let db = app::open_db(config).await?;
    println!("schema up to date ({})", db.backend().as_str());
    db.close().await;
    Ok(())
}
