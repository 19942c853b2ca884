//! `dtf-ps`: a parameter-server task (`dtf-ps@N.service`).

fn main() -> std::process::ExitCode {
    let role = dtf::config::Role::Ps;
    dtf::daemon::main(role, dtf::daemon::Args::parse_for(role))
}
