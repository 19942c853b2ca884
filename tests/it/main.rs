//! dtf's integration tests: real processes on 127.0.0.1, one test binary.

mod auth;
mod checkpoint_hardening;
mod cluster;
mod config_errors;
mod config_hardening;
mod configmap;
mod daemon;
mod docs;
mod evaluator;
mod faults;
mod formats;
mod hardening;
mod local;
mod observability;
mod optimizers;
mod package;
mod ps_limits;
mod reload;
mod requests;
mod shm;
mod snapshot;
mod sync;
mod tls;
mod util;
