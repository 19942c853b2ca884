//! `dtf`: the operator's tool — run a local cluster, evaluate and inspect
//! checkpoints, ask a running cluster, check a config. The command line is
//! parsed here; each subcommand's body is a function of [`dtf::cli`].

use clap::{Parser, Subcommand};
use dtf::cli::Result;
use dtf::config;
use std::path::PathBuf;
use std::process::ExitCode;

/// Every flag may be given again, the last one winning, as most Unix tools
/// do: a wrapper such as scripts/local.sh passes its defaults first and the
/// user's arguments after them.
#[derive(Parser)]
#[command(
    version,
    about = "Distributed training with parameter servers",
    args_override_self = true
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// Parsed once per process: the size of `local`'s many flags costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Train on a whole cluster of local processes (127.0.0.1), then print the test accuracy.
    Local(LocalArgs),
    /// Test accuracy of a checkpoint (a file, or a directory: its newest), raw and EMA.
    Eval {
        /// A model.ckpt-N.safetensors file or a checkpoint directory.
        path: PathBuf,
        /// The test data: a directory of IDX files, a .npz (x_test, y_test) or a test .csv
        /// (default: the test split of the data the checkpoint was trained on, else
        /// /usr/share/datasets/fashion-mnist).
        #[arg(long)]
        data: Option<PathBuf>,
        /// The label column of a CSV (default: the checkpoint's, else "label").
        #[arg(long)]
        label: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Class and class probabilities of every row of FILE, from a checkpoint alone.
    Predict(PredictArgs),
    /// Write a checkpoint as a model for other runtimes.
    Export(ExportArgs),
    /// What a checkpoint holds: tensors, shapes, dtypes, metadata.
    Inspect {
        /// A model.ckpt-N.safetensors file or a checkpoint directory.
        path: PathBuf,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Ask a running cluster: every task, its step, the newest checkpoint; exit 1 if a ps does not answer before the run is complete.
    Status {
        /// The cluster configuration file (its token authenticates the calls).
        #[arg(long, short = 'c', default_value = config::DEFAULT_PATH)]
        config: PathBuf,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Measure the compute limit (one thread, no network), its scaling with the
    /// hidden width, and checkpoint save/restore (docs/benchmarks.md).
    Bench {
        /// Directory of the IDX files.
        #[arg(long, default_value = config::DEFAULT_DATA_DIR)]
        data: PathBuf,
        /// Hidden widths for the scaling table.
        #[arg(long, value_delimiter = ',', default_value = "500,2000,8000")]
        widths: Vec<usize>,
        /// Timed rounds per measurement (the median is reported).
        #[arg(long, default_value_t = 7)]
        rounds: usize,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Write synthetic click-through data (RecBole atomic files) whose best
    /// attainable AUC is known: Zipf-distributed ids, labels from a planted
    /// logistic model.
    Synth(SynthArgs),
    /// Validate a configuration file; exit 78 if invalid.
    CheckConfig {
        /// The file.
        #[arg(long, short = 'c', default_value = config::DEFAULT_PATH)]
        config: PathBuf,
    },
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum ModeArg {
    Async,
    Sync,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", dtf::cli::chain(&*e));
            ExitCode::FAILURE
        }
    }
}

/// One small function per subcommand (ripgrep's `main → try_main → mode`).
fn run(cli: Cli) -> Result<ExitCode> {
    // These talk to no socket: their output may go to a pipe that closes.
    if !matches!(cli.command, Command::Local(_) | Command::Status { .. }) {
        dtf::cli::end_on_closed_pipe();
    }
    match cli.command {
        Command::Local(args) => match args.overrides() {
            Ok(overrides) => {
                let json = args.json;
                dtf::cli::local(args.into_local(overrides), json)
            }
            Err(e) => Ok(dtf::cli::usage(&e)),
        },
        Command::Eval {
            path,
            data,
            label,
            json,
        } => dtf::cli::eval(&path, data, label, json),
        Command::Predict(a) => dtf::cli::predict(&a.checkpoint, &a.input, a.label, a.raw, a.json),
        Command::Export(a) => dtf::cli::export(
            &a.checkpoint,
            a.onnx.as_deref(),
            a.tf_checkpoint.as_deref(),
            a.raw,
        ),
        Command::Bench {
            data,
            widths,
            rounds,
            json,
        } => dtf::cli::bench(data, widths, rounds, json),
        Command::Inspect { path, json } => dtf::cli::inspect(&path, json),
        Command::Status { config, json } => dtf::cli::status(&config, json),
        Command::CheckConfig { config } => dtf::cli::check_config(&config),
        Command::Synth(a) => dtf::cli::synth(&a.out, &a.options(), a.json),
    }
}

/// `dtf synth`'s options.
#[derive(clap::Args)]
struct SynthArgs {
    /// The directory to write synthetic.inter and synthetic.json (the summary) into.
    #[arg(long)]
    out: PathBuf,
    /// Rows (interactions) to generate.
    #[arg(long, default_value_t = 100_000)]
    rows: usize,
    /// Categorical fields (f0, f1, …).
    #[arg(long, default_value_t = 8)]
    fields: usize,
    /// Distinct values per field: one number for every field, or one per field.
    #[arg(long, value_delimiter = ',', default_value = "10000")]
    cardinality: Vec<u64>,
    /// Zipf exponent of each field's value frequencies: one for all, or one per field.
    #[arg(long, value_delimiter = ',', default_value = "1.1")]
    exponent: Vec<f64>,
    /// Standard deviation of the planted model's weights (one per value).
    #[arg(long, default_value_t = 0.5)]
    weight_std: f64,
    /// The planted model's bias (negative: fewer positives).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    bias: f64,
    /// Seeds the planted weights and the rows.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Dense columns d0, d1, … besides the fields: counts, heavy-tailed as
    /// Criteo's integer columns (means 1, 10, 100, 1000 in turn), each
    /// weighted in the planted model by ln(1 + count).
    #[arg(long, default_value_t = 0)]
    dense: usize,
    /// Print the summary as one JSON object.
    #[arg(long)]
    json: bool,
}

impl SynthArgs {
    fn options(&self) -> dtf::cli::SynthOptions {
        dtf::cli::SynthOptions {
            rows: self.rows,
            fields: self.fields,
            cardinality: self.cardinality.clone(),
            exponent: self.exponent.clone(),
            weight_std: self.weight_std,
            bias: self.bias,
            seed: self.seed,
            dense: self.dense,
        }
    }
}

/// `dtf predict`'s options.
#[derive(clap::Args)]
struct PredictArgs {
    /// A model.ckpt-N.safetensors file or a checkpoint directory (its newest).
    checkpoint: PathBuf,
    /// The rows: a .npy array [N, …], a .npz with array x, or a .csv with a header; for a
    /// wide & deep model a .csv, RecBole atomic files (.inter or their directory) or
    /// Criteo's .txt/.tsv.
    #[arg(long)]
    input: PathBuf,
    /// The label column to leave out (default: the one the checkpoint was trained with, else "label").
    #[arg(long)]
    label: Option<String>,
    /// The trained weights instead of their moving averages (EMA).
    #[arg(long)]
    raw: bool,
    /// One JSON object per row ({"class": …, "probabilities": […]}) instead of CSV.
    #[arg(long)]
    json: bool,
}

/// `dtf export`'s options: at least one output.
#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("output").required(true).multiple(true).args(["onnx", "tf_checkpoint"])))]
struct ExportArgs {
    /// A model.ckpt-N.safetensors file or a checkpoint directory (its newest).
    checkpoint: PathBuf,
    /// Write an ONNX model (opset 13: input "input", output "probabilities") here.
    #[arg(long)]
    onnx: Option<PathBuf>,
    /// Write a TensorFlow V2 checkpoint (DIR/model.ckpt-N.index and .data-00000-of-00001,
    /// and DIR/checkpoint) of every tensor: variables, EMA shadows, slots, global_step.
    #[arg(long, value_name = "DIR")]
    tf_checkpoint: Option<PathBuf>,
    /// The ONNX model's weights are the trained ones instead of their moving averages (EMA).
    #[arg(long)]
    raw: bool,
}

/// The most tasks of one role `dtf local` starts on this machine: each is a process with its
/// own port, and past this a typo (`--workers 10000`) is likelier than a plan.
const MAX_LOCAL_TASKS: i64 = 1000;

/// `dtf local`'s options, as given on the command line. Each key flag
/// stands for its `dtf.toml` key (see [`LocalArgs::overrides`]); unset, the
/// key is the config file's, the environment's (`DTF_…`) or the default.
#[derive(clap::Args)]
struct LocalArgs {
    /// Number of ps tasks (1–1000).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=MAX_LOCAL_TASKS))]
    ps: u16,
    /// Number of worker tasks, 1–1000 (worker 0 is the chief).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=MAX_LOCAL_TASKS))]
    workers: u16,
    /// Train until this global step (train.last_step; default 20000; at most 2⁶³ − 1, TOML's
    /// largest integer).
    #[arg(long, value_parser = clap::value_parser!(u64).range(..=i64::MAX as u64))]
    steps: Option<u64>,
    /// async or sync (train.mode).
    #[arg(long, value_enum)]
    mode: Option<ModeArg>,
    /// The data set: a directory of IDX files, a .npz (x_train, y_train, x_test,
    /// y_test) or a training .csv (default: the config's [data], else
    /// /usr/share/datasets/fashion-mnist).
    #[arg(long)]
    data: Option<PathBuf>,
    /// The test .csv for a training .csv given as --data (default: its name
    /// with "train" replaced by "test").
    #[arg(long)]
    test: Option<PathBuf>,
    /// The CSV's label column (data.label; default: "label", else the one
    /// column named like a label: class, target, y, …).
    #[arg(long)]
    label: Option<String>,
    /// A binary label: 1 where the label column is at least this, else 0
    /// (data.threshold), e.g. --threshold 4 for ratings of 1 to 5.
    #[arg(long)]
    threshold: Option<String>,
    /// The update rule: sgd, momentum, adam or adagrad (train.optimizer).
    #[arg(long)]
    optimizer: Option<String>,
    /// The base learning rate (train.learning_rate).
    #[arg(long)]
    learning_rate: Option<String>,
    /// Examples per worker step (train.batch_size).
    #[arg(long)]
    batch_size: Option<String>,
    /// Hidden widths, e.g. 256,128 (model.hidden; the data gives the input
    /// width and the classes; default 500).
    #[arg(long)]
    hidden: Option<String>,
    /// The seed of init and shuffling (train.seed).
    #[arg(long)]
    seed: Option<String>,
    /// The hidden layers' activation: relu, tanh, sigmoid or gelu (model.activation).
    #[arg(long)]
    activation: Option<String>,
    /// tf.nn.dropout's rate on the hidden layers while training, in [0, 1) (model.dropout).
    #[arg(long)]
    dropout: Option<String>,
    /// What the label is: classification or regression (model.task; default: regression
    /// when a CSV label column holds numbers that are not all integers).
    #[arg(long)]
    task: Option<String>,
    /// Scale each step's gradients to this global norm when above it (train.clip_norm).
    #[arg(long)]
    clip_norm: Option<String>,
    /// Keep checkpoints here (default: a fresh directory, printed at the end).
    #[arg(long)]
    checkpoint_dir: Option<PathBuf>,
    /// Start from this checkpoint: a TensorFlow V2 checkpoint (DIR/model.ckpt-N, or a
    /// directory with its `checkpoint` file) or a dtf one; variables, EMA shadows, slots and
    /// global_step carry over (as tf.train.Saver.restore). The checkpoint directory must be empty.
    #[arg(long, value_name = "CKPT")]
    init_from: Option<PathBuf>,
    /// Seconds between checkpoints (checkpoint.save_secs).
    #[arg(long)]
    save_secs: Option<String>,
    /// Global steps between checkpoints instead (checkpoint.save_steps).
    #[arg(long)]
    save_steps: Option<String>,
    /// Any configuration key, e.g. --set train.beta1=0.8 (repeatable; after
    /// the file and the DTF_… environment, before the flags above).
    #[arg(long = "set", value_name = "SECTION.KEY=VALUE", action = clap::ArgAction::Append)]
    set: Vec<String>,
    /// Hyperparameters from this config file (cluster and paths are replaced).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Keep the run directory (config, token, logs) after a finished run whose checkpoints
    /// went to --checkpoint-dir; it is removed otherwise (kept when a run fails or stops).
    #[arg(long)]
    keep_run_dir: bool,
    /// Also run dtf-evaluator: every checkpoint scored into CHECKPOINT_DIR/eval, the best kept in CHECKPOINT_DIR/best.
    #[arg(long)]
    evaluator: bool,
    /// Print one JSON object on stdout, and the summary on stderr.
    #[arg(long)]
    json: bool,
    /// How the tasks reach the ps tasks: auto (shared memory) or tcp
    /// (cluster.transport; default: the config's, auto).
    #[arg(long, value_enum)]
    transport: Option<TransportArg>,
    /// How tensors cross TCP links: none, bf16 or onebit
    /// (cluster.compression; default: the config's, none).
    #[arg(long, value_enum)]
    compression: Option<CompressionArg>,
    /// The workers' GEMMs' number format: float32 or mixed_bfloat16
    /// (train.precision; default: the config's, float32).
    #[arg(long, value_enum)]
    precision: Option<PrecisionArg>,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum PrecisionArg {
    Float32,
    #[value(name = "mixed_bfloat16")]
    MixedBfloat16,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum CompressionArg {
    None,
    Bf16,
    Onebit,
}

impl LocalArgs {
    /// The run this command line asks for, with its keys `overrides`.
    fn into_local(self, overrides: Vec<config::Override>) -> dtf::local::Options {
        dtf::local::Options {
            ps: self.ps.into(),
            workers: self.workers.into(),
            data: self.data,
            test: self.test,
            checkpoint_dir: self.checkpoint_dir,
            init_from: self.init_from,
            config: self.config,
            overrides,
            evaluator: self.evaluator,
            keep_run_dir: self.keep_run_dir,
            ..Default::default()
        }
    }

    /// The keys this command line sets: every `--set`, then each key flag
    /// given, so that a flag wins over a `--set` of its key.
    fn overrides(&self) -> Result<Vec<config::Override>, String> {
        let mut out = self
            .set
            .iter()
            .map(|s| config::Override::parse_set(s).map_err(|e| format!("--set {e}")))
            .collect::<Result<Vec<_>, _>>()?;
        let hidden = self.hidden.as_ref().map(|h| format!("[{h}]"));
        let flags: [(&str, &str, Option<String>); 18] = [
            (
                "--steps",
                "train.last_step",
                self.steps.map(|s| s.to_string()),
            ),
            ("--mode", "train.mode", value_name(self.mode.as_ref())),
            ("--label", "data.label", self.label.clone()),
            ("--threshold", "data.threshold", self.threshold.clone()),
            ("--optimizer", "train.optimizer", self.optimizer.clone()),
            (
                "--learning-rate",
                "train.learning_rate",
                self.learning_rate.clone(),
            ),
            ("--batch-size", "train.batch_size", self.batch_size.clone()),
            ("--hidden", "model.hidden", hidden),
            ("--activation", "model.activation", self.activation.clone()),
            ("--dropout", "model.dropout", self.dropout.clone()),
            ("--task", "model.task", self.task.clone()),
            ("--clip-norm", "train.clip_norm", self.clip_norm.clone()),
            ("--seed", "train.seed", self.seed.clone()),
            (
                "--save-secs",
                "checkpoint.save_secs",
                self.save_secs.clone(),
            ),
            (
                "--save-steps",
                "checkpoint.save_steps",
                self.save_steps.clone(),
            ),
            (
                "--transport",
                "cluster.transport",
                value_name(self.transport.as_ref()),
            ),
            (
                "--compression",
                "cluster.compression",
                value_name(self.compression.as_ref()),
            ),
            (
                "--precision",
                "train.precision",
                value_name(self.precision.as_ref()),
            ),
        ];
        for (flag, key, value) in flags {
            if let Some(value) = value {
                out.push(config::Override {
                    key: key.into(),
                    flag: format!("{flag} {value}"),
                    value,
                });
            }
        }
        Ok(out)
    }
}

/// A value enum's name as the command line spells it.
fn value_name<T: clap::ValueEnum>(v: Option<&T>) -> Option<String> {
    v.and_then(|v| v.to_possible_value())
        .map(|p| p.get_name().to_owned())
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum TransportArg {
    Auto,
    Tcp,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repeated_flag_takes_its_last_value() {
        let cli = Cli::try_parse_from([
            "dtf",
            "local",
            "--ps",
            "1",
            "--workers",
            "2",
            "--steps",
            "20000",
            "--steps",
            "500",
            "--workers",
            "3",
        ])
        .unwrap_or_else(|e| panic!("{e}"));
        match cli.command {
            Command::Local(a) => assert_eq!((a.ps, a.workers, a.steps), (1, 3, Some(500))),
            _ => panic!("not dtf local"),
        }
    }

    /// Counts no daemon accepts are usage errors (exit 2) before anything is created, not a
    /// cluster that fails to start: `--steps` past TOML's largest integer, no ps, a port each
    /// for ten thousand workers.
    #[test]
    fn absurd_counts_are_usage_errors() {
        for args in [
            &["--steps", "18446744073709551615"][..],
            &["--steps", "9223372036854775808"],
            &["--ps", "0"],
            &["--workers", "0"],
            &["--workers", "100000"],
            &["--ps=-1"],
        ] {
            let e = Cli::try_parse_from(["dtf", "local"].iter().chain(args))
                .err()
                .unwrap_or_else(|| panic!("{args:?} accepted"));
            assert_eq!(e.exit_code(), 2, "{args:?}: {e}");
            let flag = args[0].split('=').next().unwrap_or_default();
            assert!(e.to_string().contains(flag), "{args:?}: {e}");
        }
        let ok = Cli::try_parse_from(["dtf", "local", "--steps", "9223372036854775807"]);
        assert!(ok.is_ok(), "TOML's largest integer is a valid last_step");
    }
}
