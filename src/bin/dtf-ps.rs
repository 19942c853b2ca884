//! `dtf-ps`: a parameter-server task (`dtf-ps@N.service`).
use clap::Parser;

fn main() -> std::process::ExitCode {
    dtf::daemon::main(dtf::config::Role::Ps, dtf::daemon::Args::parse())
}
