//! The subcommands that ask a cluster or check its configuration: `dtf
//! status` and `dtf check-config`.

use super::{Error, Result, chain};
use crate::config::{Config, ConfigError, Role};
use std::path::Path;
use std::process::ExitCode;

/// `dtf status`: every task's state; exit 1 if a ps does not answer and
/// the run is not complete.
pub fn status(config: &Path, json: bool) -> Result<ExitCode> {
    let cfg = Config::load(config).map_err(|e| match e {
        ConfigError::Read { .. } => Error::from(format!(
            "{e}; give the cluster's file with --config (dtf local prints the command for its run)"
        )),
        e => e.into(),
    })?;
    let credentials = crate::auth::Credentials::load(&cfg)?;
    let status = tokio::runtime::Runtime::new()?.block_on(crate::status::query(&cfg, &credentials));
    // The runtime is gone, and its connections with it.
    super::end_on_closed_pipe();
    if json {
        println!("{}", serde_json::to_string(&status)?);
    } else {
        print!("{}", status.table());
    }
    Ok(if status.ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// `dtf check-config`: exit 78 naming what is wrong.
pub fn check_config(config: &Path) -> Result<ExitCode> {
    // The daemons' own checks (a worker's, the most a task checks), so
    // `valid` here means they start.
    let checked = Config::load(config)
        .map_err(Error::from)
        .and_then(|mut cfg| {
            crate::daemon::preflight(&mut cfg, Role::Worker)?;
            Ok(crate::daemon::resumes_from(&cfg, Role::Worker)?)
        });
    match checked {
        Ok(resumes) => {
            println!("{}: valid{resumes}", config.display());
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("error: {}", chain(&*e));
            Ok(ExitCode::from(crate::daemon::EX_CONFIG))
        }
    }
}
