//! `dtf-evaluator`: the cluster's evaluator (`dtf-evaluator.service`).

fn main() -> std::process::ExitCode {
    let role = dtf::config::Role::Evaluator;
    dtf::daemon::main(role, dtf::daemon::Args::parse_for(role))
}
