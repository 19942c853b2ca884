//! dtf: data-parallel training on parameter-server (`ps`) and worker daemons,
//! TensorFlow 1.x's distributed runtime rebuilt as Linux services.
//!
//! Where things live:
//!
//! - [`config`] — `/etc/dtf/dtf.toml`, a folder: schema, the task (`Role`, `TaskId`), loading
//!   and `TF_CONFIG` (which file a daemon reads, none when TensorFlow's flags give the cluster,
//!   and which task this is), each value's origin and figment's errors
//!   translated, validation per section, the model-size bound, errors (a leaf), live-reload
//!   keys, secret files, the file watcher (`config::watcher`).
//! - [`model`] — the MLP's math, a folder: the model and its init, `Targets` (class labels
//!   or a regression's values), `gradient` (loss — cross-entropy or mean squared error —
//!   and gradients, the training step, `clip_by_global_norm`), `hidden` (activations, dropout),
//!   `inference` (evaluation, probabilities), `schedule` (TF's LR schedules, warmup), `ema`.
//! - [`kernel`] — the step's GEMMs behind one entry: the precision policy (`float32`,
//!   `mixed_bfloat16`) and the tier chosen once per process (AMX, AVX512-BF16, portable bf16,
//!   f32), `DTF_KERNEL` to force a lower one; `bf16`: rounding and the packed layouts; `l2`:
//!   the L2 penalty's vectorized pass.
//! - [`optimizer`] — SGD, Momentum, Adam, Adagrad as TensorFlow 1.x computes them, and
//!   their slots' names (the slots themselves live in the ps's shard).
//! - [`data`] — data sets in five formats (`idx`, `npz`, `csv`, `recbole`, `criteo`), the
//!   synthetic CTR generator (`synthetic`), categorical ids (`ids`: `data::id`, stable
//!   forever), the batch a model consumes (`Batch`, `Categorical`), `build` (a data set's
//!   constructors and their checks), `load` (the splits by config; the labels as
//!   `model.task` reads them: classes or a regression's values), preprocessing,
//!   mini-batches (`batches`), the seeded split.
//! - [`checkpoint`] — safetensors checkpoints with EMA shadows: `save` (atomic writes,
//!   retention, the index), chains of a whole checkpoint and deltas (`Increment`,
//!   `checkpoint.full_every`: resolved by `restore`'s `load`), `format` (decode, verify; `encode`: the two files' bytes;
//!   `saveable`: what may be saved), `restore` (load, the
//!   newest valid one), `inspect`, `meta` (the model's description in the metadata),
//!   `best` (the best checkpoints' directory), `layout` (the directory's scan, bounded
//!   reads and pair removal that save, restore and best share), `container` (the CRC'd safetensors
//!   file that checkpoints and ps snapshots both are), `tensorflow` (TensorFlow's V2 checkpoints,
//!   both ways: `table`, the LevelDB-format index; `convert`, to and from dtf's).
//! - [`placement`] — how each variable splits into parts (`model.partitioner`, TensorFlow's
//!   partitioners) and which ps task holds which part; `Layout`: views of whole arrays as parts.
//!   Table rows: `table_owner` (a hash of the id), the model's tables (`tables`),
//!   `merge_rows`/`split_rows` (a table whole, whatever the ps count).
//! - [`ps`] — the parameter-server task: `PsService` and its state by concern, `calls`
//!   (the functions every call runs, on domain types), `serve` (its background tasks),
//!   `follow` (membership and re-shard), `widths` (a ps started with `model.hidden` takes
//!   the widths from the chief: no ps reads the data), its `shard` (the state and the checks on what
//!   comes in; `shard::update`: pushes into updates, the optimizer's pass, a push's parts on the ps's
//!   cores at once), the gRPC
//!   service (`grpc`) and the shared-memory server (`shm`) — the two adapters that see the
//!   wire —, `snapshot` (each ps's own snapshots of its shard: its recovery after a crash),
//!   `replica` (the ring's copies), `table` (an embedding table's rows: storage, sparse
//!   SGD/Adagrad, sync aggregation; `evict`: admission and eviction, `[model.tables]`;
//!   `sketch`: admission's count-min sketch), `rows` (the tables as a service, a lock each),
//!   `memory` (the cgroup's memory limit: no new table rows near it), `limits` (the bounds on connections and calls),
//!   `admission` (calls in progress), `conn`
//!   (a connection, shed or authenticated), `listen` (the accept loop) and `tls` (the
//!   handshake).
//! - [`worker`] — the worker task: the step loop, the same for every worker; `startup`,
//!   `sync`, `rate`, `error`; `chief` (worker 0's duties: init or restore, summaries, the end
//!   of the run, re-shard — `Chief` owns what they need), `checkpoints` (the chief's saver, its chain of incremental checkpoints
//!   and timer), `backoff`, `replay` (the ps load benchmark's compute-free worker), `sparse`
//!   (wide & deep's half of a step: rows pulled, pushed).
//! - [`transport`] — the wire, and the only home of its generated types (`pb`): `call` and
//!   `state` (the domain types the ps, worker, chief, status and metrics speak), `proto`
//!   (the conversion between the two), `cluster::Cluster` (the client of every ps, shared by
//!   worker, chief, `dtf local` and `dtf status`; `cluster/rows`: embedding rows by id;
//!   `cluster/step`: the worker's step,
//!   computed in place in the shared regions; `cluster/seed`: the chief's calls), `ring`
//!   (the ring's calls between ps tasks), `tcp` (gRPC between hosts), `shm` (shared memory on one
//!   host), `compress` (`cluster.compression` on TCP links, a folder: `bf16`, `onebit`, the
//!   error feedback).
//! - [`daemon`] — the daemons' lifecycle (ps, worker, evaluator), a folder: the control loop
//!   (signals, reload, re-exec), `systemd` (readiness, watchdog), `logging`, `args` (the
//!   command line, TensorFlow 1.x's flags included, and the configuration it names).
//! - [`auth`] — the cluster token on every RPC.
//! - [`local`] — `dtf local`: a whole cluster of processes on this machine; `report` (its
//!   summary and `--json`); `stop`
//!   (signals, the ordered stop, how to resume); `init` (`--init-from`: a run seeded from a
//!   TensorFlow or dtf checkpoint).
//! - [`binary_metrics`] — AUC and log loss of a binary model, exact (one place for `dtf
//!   local`, `dtf eval`, the evaluator).
//! - [`regression_metrics`] — RMSE, MAE and the mean squared error of a regression model
//!   (`model.task = "regression"`), one place for the same callers and the chief.
//! - [`eval`] — test accuracy of a checkpoint, raw and EMA, and its test loss.
//! - [`evaluator`] — `dtf-evaluator`: scores each new checkpoint beside training,
//!   TensorBoard events in `eval/`, the best ones kept in `best/`; `ledger`: what was scored; `ranking`: the best set.
//! - [`predict`] — a trained model from its checkpoint alone; `dtf predict`.
//! - [`export`] — `dtf export`: the model as an ONNX graph (`--onnx`), or as a TensorFlow
//!   checkpoint (`--tf-checkpoint`).
//! - [`files`] — only regular files are read from outside (non-blocking, type
//!   checked), each bounded; every file written goes temp, fsync, rename (`write_atomic`,
//!   or its steps `write_temp`, `rename_into_place`, `sync_dir`), temp names made once;
//!   nothing is deleted through a symbolic link dtf did not make.
//! - [`summary`] — the chief's TensorBoard events file (loss, learning rate, accuracy).
//! - [`metrics`] — Prometheus metrics and the daemons' `/metrics` endpoint; `registry`: what
//!   each role exposes.
//! - [`status`] — `dtf status`: every task's state in one table.
//! - [`bench`] — `dtf bench`: compute limit, width scaling, checkpoint timings.
//! - [`cli`] — the bodies of `dtf`'s subcommands (`bin/dtf.rs` parses, `cli` runs): `model`
//!   (eval, predict, export, inspect), `cluster` (status, check-config), `local`.
pub mod auth;
pub mod bench;
pub mod binary_metrics;
pub mod checkpoint;
pub mod cli;
pub mod config;
pub mod daemon;
pub mod data;
pub mod eval;
pub mod evaluator;
pub mod export;
pub mod files;
pub mod kernel;
pub mod local;
pub mod metrics;
pub mod model;
pub mod optimizer;
pub mod placement;
pub mod predict;
pub mod ps;
pub mod regression_metrics;
pub mod status;
pub mod summary;
pub mod transport;
pub mod worker;
