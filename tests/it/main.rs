//! dtf's integration tests: real processes on 127.0.0.1, one test binary.

mod cluster;
mod faults;
mod local;
mod requests;
mod util;
