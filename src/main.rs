//! The `rush-meter` command: parse, set up logging and the runtime, dispatch (`cli`).

use std::process::ExitCode;

use rush_meter::cli::{self, Cli};
use rush_meter::config::LogFormat;
use tracing_subscriber::EnvFilter;

// glibc's malloc serialises the many small allocations of HTTP and SQL work on its arena
// locks; mimalloc keeps them per thread.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = Cli::try_parse_args(std::env::args_os()).unwrap_or_else(|e| e.exit());
    init_logs(cli.log.log_format);
    let config = match cli.settings().validate() {
        Ok(c) => c,
        Err(e) => return fail(&e.to_string()),
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail(&format!("cannot start the async runtime: {e}")),
    };
    match runtime.block_on(cli::run(cli.command, &config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(&e.to_string()),
    }
}

/// Log lines to stderr, filtered by `RUST_LOG` (default: `info`, with one line a request
/// only for requests that failed, `rush_meter::access`: docs/operations.md).
fn init_logs(format: LogFormat) {
    let filter = EnvFilter::try_from_env("RUST_LOG")
        .unwrap_or_else(|_| EnvFilter::new("info,rush_meter::access=warn"));
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => logs.init(),
        // One object a line; the request span's fields (request id, route, org) are on
        // every line logged inside it.
        LogFormat::Json => logs
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .init(),
    }
}

fn fail(message: &str) -> ExitCode {
    eprintln!("rush-meter: {message}");
    ExitCode::from(2)
}
