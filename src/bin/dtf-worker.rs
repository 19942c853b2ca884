//! `dtf-worker`: a worker task (`dtf-worker@N.service`); worker 0 is the chief.

fn main() -> std::process::ExitCode {
    let role = dtf::config::Role::Worker;
    dtf::daemon::main(role, dtf::daemon::Args::parse_for(role))
}
