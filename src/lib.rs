//! dtf: data-parallel training on parameter-server (`ps`) and worker daemons,
//! TensorFlow 1.x's distributed runtime rebuilt as Linux services.
//!
//! Where things live:
//!
//! - [`config`] — `/etc/dtf/dtf.toml`: loading, validation, reload rules, `TF_CONFIG`.
//! - [`model`] — the MLP's math: init, loss and gradients, LR schedule, EMA.
//! - [`data`] — IDX (MNIST-format) files and mini-batches.
//! - [`checkpoint`] — safetensors checkpoints with EMA shadows, atomic save, restore.
//! - [`pb`] — generated gRPC code for `proto/dtf/v1/`; [`rpc`] converts it to domain types.
pub mod checkpoint;
pub mod config;
pub mod data;
pub mod model;

/// Generated from `proto/dtf/v1/ps.proto`; only [`rpc`] should need it.
pub mod pb {
    tonic::include_proto!("dtf.v1");
}
