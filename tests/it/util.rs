//! Shared helpers: temp dirs, tiny data sets, configs, running the binaries.
