//! The daemons' logging: one `tracing` event per line on stderr, its level
//! changed on reload through a [`LogHandle`].

use tracing_subscriber::{EnvFilter, reload};

/// The handle that changes the log level on reload.
pub type LogHandle = reload::Handle<EnvFilter, tracing_subscriber::Registry>;

/// Installs the global subscriber: one event per line, fields included, no
/// colour unless stderr is a terminal (journald gets plain text).
pub fn init_logging(level: &str) -> LogHandle {
    use std::io::IsTerminal;
    use tracing_subscriber::prelude::*;
    let filter = EnvFilter::try_new(level).unwrap_or_else(|_| EnvFilter::new("info"));
    let (filter, handle) = reload::Layer::new(filter);
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false);
    // Under systemd the journal stamps each line itself.
    let fmt = if std::env::var_os("JOURNAL_STREAM").is_some() {
        fmt.without_time().boxed()
    } else {
        fmt.boxed()
    };
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(fmt)
        .try_init();
    handle
}
