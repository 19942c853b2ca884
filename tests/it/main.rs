//! dtf's integration tests: real processes on 127.0.0.1, one test binary.

mod cluster;
mod observability;
mod util;
