//! `dtf-worker`: a worker task (`dtf-worker@N.service`); worker 0 is the chief.
use clap::Parser;

fn main() -> std::process::ExitCode {
    dtf::daemon::main(dtf::config::Role::Worker, dtf::daemon::Args::parse())
}
