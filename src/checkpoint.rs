//! Checkpoints: safetensors files of the variables and their EMA shadows,
//! an index, atomic writes, retention, and restore of the newest valid one.
