//! The bodies of `dtf`'s subcommands: `src/bin/dtf.rs` parses the command
//! line (clap) and calls one function here per subcommand, which prints
//! its result and returns the exit code.
//!
//! - `model` — what reads a checkpoint: [`eval`], [`predict`], [`export`],
//!   [`inspect`].
//! - `cluster` — what asks a cluster or checks its file: [`status`],
//!   [`check_config`].
//! - `local` — [`local`]: a whole cluster of local processes.
//! - `synth` — [`synth`]: synthetic click-through data with a known best AUC.
//! - here — [`bench`], and what they share: the error type and how it
//!   prints ([`chain`]), and [`end_on_closed_pipe`].

mod cluster;
mod local;
mod model;
mod synth;

pub use cluster::{check_config, status};
pub use local::local;
pub use model::{eval, export, inspect, predict};
pub use synth::{SynthOptions, synth};

use std::path::PathBuf;
use std::process::ExitCode;

/// What a subcommand fails with: any error of the library, printed with its
/// causes by [`chain`].
pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// A subcommand's result: its exit code, or an [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// How a bad command line exits (dtf(1)), as clap's own errors do.
pub const EX_USAGE: u8 = 2;

/// An error with what was being done when it happened, as its message; the
/// error itself is its `source`, so [`chain`] prints both.
#[derive(Debug)]
struct Context {
    /// What was being done.
    context: String,
    /// What went wrong.
    source: Error,
}

impl Context {
    /// `source` under `context`, as an [`Error`].
    fn wrap(context: impl Into<String>, source: impl Into<Error>) -> Error {
        Box::new(Context {
            context: context.into(),
            source: source.into(),
        })
    }
}

impl std::fmt::Display for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.context)
    }
}

impl std::error::Error for Context {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.source)
    }
}

/// From here on a closed output pipe (`dtf inspect … | head`) ends the
/// process as it ends `cat`: by SIGPIPE, quietly (the shell shows 141),
/// not with a panic in `println!`. Rust ignores SIGPIPE so that a socket
/// whose peer left is an error to handle; so only a subcommand that talks
/// to no socket calls this, or one whose sockets are all closed.
pub fn end_on_closed_pipe() {
    // SAFETY: sets the signal's disposition to the default; no handler runs.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// The error and its causes, as `{:#}` prints them, but without a cause
/// whose text the message already ends with: a library error that keeps its
/// cause as `source` often names it in its own message too.
pub fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut next = e.source();
    while let Some(cause) = next {
        let text = cause.to_string();
        if !out.ends_with(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        next = cause.source();
    }
    out
}

/// Prints `e` as a bad command line's error and returns [`EX_USAGE`].
pub fn usage(e: &dyn std::fmt::Display) -> ExitCode {
    eprintln!("error: {e}");
    ExitCode::from(EX_USAGE)
}

/// `dtf bench`: the compute limit and width scaling on this machine.
pub fn bench(data: PathBuf, widths: Vec<usize>, rounds: usize, json: bool) -> Result<ExitCode> {
    let opts = crate::bench::Options {
        data,
        widths,
        batch: 100,
        rounds,
        round_secs: 0.5,
    };
    let report = crate::bench::run(&opts)?;
    if json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{}", crate::bench::table(&report));
    }
    Ok(ExitCode::SUCCESS)
}
