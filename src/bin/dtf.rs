//! `dtf`: the operator's tool — run a local cluster, evaluate and inspect
//! checkpoints, ask a running cluster, check a config.

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use dtf::config::{self, Config};
use std::io::IsTerminal;
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

/// The error and its causes, as `{:#}` prints them, but without a cause
/// whose text the message already ends with: a library error that keeps its
/// cause as `source` often names it in its own message too.
fn chain(e: &anyhow::Error) -> String {
    let mut out = e.to_string();
    for cause in e.chain().skip(1) {
        let cause = cause.to_string();
        if !out.ends_with(&cause) {
            out.push_str(": ");
            out.push_str(&cause);
        }
    }
    out
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", chain(&e));
            ExitCode::FAILURE
        }
    }
}

/// One small function per subcommand (ripgrep's `main → try_main → mode`).
fn run(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Command::Local(args) => local(args),
        Command::Eval {
            path,
            data,
            label,
            json,
        } => eval(&path, data, label, json),
        Command::Predict(args) => predict(args),
        Command::Export(args) => export(args),
        Command::Bench {
            data,
            widths,
            rounds,
            json,
        } => bench(data, widths, rounds, json),
        Command::Inspect { path, json } => inspect(&path, json),
        Command::Status { config, json } => status(&config, json),
        Command::CheckConfig { config } => check_config(&config),
    }
}

/// `dtf eval`: the accuracy of a checkpoint, raw and EMA.
fn eval(
    path: &std::path::Path,
    data: Option<PathBuf>,
    label: Option<String>,
    json: bool,
) -> Result<ExitCode> {
    let meta = dtf::predict::Trained::load(path)?.meta;
    // The checkpoint's own data by default: a model trained on a CSV is
    // scored on that CSV's test file, not on Fashion-MNIST.
    let (mut cfg, recorded) = match (&data, meta.training_data) {
        (Some(d), _) => (dtf::data::test_config_for_path(d)?, false),
        (None, Some(trained_on)) => (trained_on, true),
        (None, None) => (
            dtf::data::test_config_for_path(std::path::Path::new(config::DEFAULT_DATA_DIR))?,
            false,
        ),
    };
    if let Some(l) = label {
        cfg.label = l;
    } else if !recorded && let Some(l) = meta.label {
        cfg.label = l;
    }
    let ev = match dtf::eval::evaluate_on(path, &cfg) {
        Ok(ev) => ev,
        Err(e) if recorded => {
            return Err(anyhow::Error::new(e).context(format!(
                "the test data the checkpoint was trained with ({}; give other test data with --data)",
                dtf::data::describe(&cfg)
            )));
        }
        Err(e) => return Err(e.into()),
    };
    if json {
        println!("{}", serde_json::to_string(&ev)?);
    } else {
        println!("checkpoint    {}", ev.checkpoint.display());
        println!("global_step   {}", ev.global_step);
        println!("accuracy      {:.4}", ev.accuracy);
        println!("ema_accuracy  {:.4}", ev.ema_accuracy);
        println!("loss          {:.4}", ev.loss);
        println!("examples      {}", ev.examples);
    }
    Ok(ExitCode::SUCCESS)
}

/// `dtf predict`'s options.
#[derive(clap::Args)]
struct PredictArgs {
    /// A model.ckpt-N.safetensors file or a checkpoint directory (its newest).
    checkpoint: PathBuf,
    /// The rows: a .npy array [N, …], a .npz with array x, or a .csv with a header.
    #[arg(long)]
    input: PathBuf,
    /// A CSV column to leave out (default: the checkpoint's label column, else "label").
    #[arg(long)]
    label: Option<String>,
    /// The trained weights instead of their moving averages (EMA).
    #[arg(long)]
    raw: bool,
    /// One JSON object per row ({"class": …, "probabilities": […]}) instead of CSV.
    #[arg(long)]
    json: bool,
}

/// `dtf predict`: class and probabilities per row, on stdout.
fn predict(args: PredictArgs) -> Result<ExitCode> {
    use std::io::Write;
    let model = dtf::predict::Trained::load(&args.checkpoint)?;
    let label = args
        .label
        .or_else(|| model.meta.label.clone())
        .unwrap_or_else(|| "label".into());
    let x = dtf::predict::read_input(&args.input, &label, model.meta.features.as_deref())?;
    let probabilities = model.probabilities(x, !args.raw, &args.input)?;
    let predictions = dtf::predict::predictions(&probabilities);
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    if args.json {
        for p in &predictions {
            serde_json::to_writer(&mut out, p)?;
            writeln!(out)?;
        }
        out.flush()?;
    } else {
        dtf::predict::write_csv(&mut out, &predictions)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `dtf export`'s options.
#[derive(clap::Args)]
struct ExportArgs {
    /// A model.ckpt-N.safetensors file or a checkpoint directory (its newest).
    checkpoint: PathBuf,
    /// Write an ONNX model (opset 13: input "input", output "probabilities") here.
    #[arg(long, required = true)]
    onnx: PathBuf,
    /// The trained weights instead of their moving averages (EMA).
    #[arg(long)]
    raw: bool,
}

/// `dtf export --onnx`: the checkpoint as an ONNX model.
fn export(args: ExportArgs) -> Result<ExitCode> {
    let model = dtf::predict::Trained::load(&args.checkpoint)?;
    dtf::export::write_onnx(&model, !args.raw, &args.onnx)?;
    eprintln!(
        "{}: ONNX model {:?} ({} weights) of {} (global step {})",
        args.onnx.display(),
        model.meta.layers,
        if args.raw { "raw" } else { "EMA" },
        model.file.display(),
        model.global_step
    );
    Ok(ExitCode::SUCCESS)
}

/// `dtf bench`: the compute limit and width scaling on this machine.
fn bench(data: PathBuf, widths: Vec<usize>, rounds: usize, json: bool) -> Result<ExitCode> {
    let opts = dtf::bench::Options {
        data,
        widths,
        batch: 100,
        rounds,
        round_secs: 0.5,
    };
    let report = dtf::bench::run(&opts)?;
    if json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{}", dtf::bench::table(&report));
    }
    Ok(ExitCode::SUCCESS)
}

/// `dtf inspect`: what a checkpoint holds.
fn inspect(path: &std::path::Path, json: bool) -> Result<ExitCode> {
    let file = dtf::checkpoint::resolve(path)?;
    let inspection = dtf::checkpoint::inspect(&file)?;
    if json {
        println!(
            "{}",
            serde_json::to_string(&InspectJson::from(&inspection))?
        );
    } else {
        print!("{inspection}");
    }
    Ok(ExitCode::SUCCESS)
}

/// `dtf status`: every task's state; exit 1 if a ps does not answer and
/// the run is not complete.
fn status(config: &std::path::Path, json: bool) -> Result<ExitCode> {
    let cfg = Config::load(config).map_err(|e| match e {
        dtf::config::ConfigError::Read { .. } => anyhow::anyhow!(
            "{e}; give the cluster's file with --config (dtf local prints the command for its run)"
        ),
        e => e.into(),
    })?;
    let credentials = dtf::auth::Credentials::load(&cfg)?;
    let status = tokio::runtime::Runtime::new()?.block_on(dtf::status::query(&cfg, &credentials));
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
fn check_config(config: &std::path::Path) -> Result<ExitCode> {
    // The daemons' own checks (a worker's, the most a task checks), so
    // `valid` here means they start.
    let checked = Config::load(config)
        .map_err(anyhow::Error::from)
        .and_then(|mut cfg| {
            dtf::daemon::preflight(&mut cfg, dtf::config::Role::Worker)?;
            Ok(cfg)
        });
    match checked {
        Ok(_) => {
            println!("{}: valid", config.display());
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("error: {}", chain(&e));
            Ok(ExitCode::from(dtf::daemon::EX_CONFIG))
        }
    }
}

/// `dtf local`'s options, as given on the command line. Each key flag
/// stands for its `dtf.toml` key (see [`LocalArgs::overrides`]); unset, the
/// key is the config file's, the environment's (`DTF_…`) or the default.
#[derive(clap::Args)]
struct LocalArgs {
    /// Number of ps tasks.
    #[arg(long, default_value_t = 1)]
    ps: usize,
    /// Number of worker tasks (worker 0 is the chief).
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Train until this global step (train.last_step; default 20000).
    #[arg(long)]
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
    /// Keep checkpoints here (default: a fresh directory, printed at the end).
    #[arg(long)]
    checkpoint_dir: Option<PathBuf>,
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
    /// The keys this command line sets: every `--set`, then each key flag
    /// given, so that a flag wins over a `--set` of its key.
    fn overrides(&self) -> Result<Vec<config::Override>, String> {
        let mut out = self
            .set
            .iter()
            .map(|s| config::Override::parse_set(s).map_err(|e| format!("--set {e}")))
            .collect::<Result<Vec<_>, _>>()?;
        let hidden = self.hidden.as_ref().map(|h| format!("[{h}]"));
        let flags: [(&str, &str, Option<String>); 13] = [
            (
                "--steps",
                "train.last_step",
                self.steps.map(|s| s.to_string()),
            ),
            ("--mode", "train.mode", value_name(self.mode.as_ref())),
            ("--label", "data.label", self.label.clone()),
            ("--optimizer", "train.optimizer", self.optimizer.clone()),
            (
                "--learning-rate",
                "train.learning_rate",
                self.learning_rate.clone(),
            ),
            ("--batch-size", "train.batch_size", self.batch_size.clone()),
            ("--hidden", "model.hidden", hidden),
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

/// How a bad command line exits (dtf(1)), as clap's own errors do.
const EX_USAGE: u8 = 2;

/// `dtf local`: exit 0 when trained, 2 for a command line that cannot run
/// (nothing is created), 130/143 when stopped by SIGINT/SIGTERM.
fn local(args: LocalArgs) -> Result<ExitCode> {
    let json = args.json;
    let _log = dtf::daemon::init_logging("warn");
    let usage = |e: &dyn std::fmt::Display| {
        eprintln!("error: {e}");
        Ok(ExitCode::from(EX_USAGE))
    };
    let overrides = match args.overrides() {
        Ok(o) => o,
        Err(e) => return usage(&e),
    };
    let exe = std::env::current_exe().context("locating the dtf binary")?;
    let bin_dir = exe
        .parent()
        .context("the dtf binary has no directory")?
        .to_path_buf();
    // The hints name the dtf that was run: `dtf` from $PATH as typed, any
    // other as its absolute path (a relative one breaks after a `cd`).
    let typed = std::env::args().next().unwrap_or_else(|| "dtf".into());
    let program = if typed.contains('/') {
        exe.display().to_string()
    } else {
        typed
    };
    let opts = dtf::local::Options {
        ps: args.ps,
        workers: args.workers,
        data: args.data.as_deref().map(dtf::local::absolute),
        test: args.test.as_deref().map(dtf::local::absolute),
        checkpoint_dir: args.checkpoint_dir.as_deref().map(dtf::local::absolute),
        config: args.config.as_deref().map(dtf::local::absolute),
        overrides,
        evaluator: args.evaluator,
        bin_dir,
        program,
        progress: if std::io::stderr().is_terminal() {
            dtf::local::Progress::Bar
        } else {
            dtf::local::Progress::Lines(std::time::Duration::from_secs(10))
        },
    };
    let mut notes = Vec::new();
    let planned = match dtf::local::plan(&opts, &mut notes) {
        Ok(cfg) => cfg,
        Err(e) => return usage(&chain(&e.into())),
    };
    let run_dir = tempfile::Builder::new()
        .prefix("dtf-local-")
        .tempdir()
        .context("creating a run directory")?
        .keep();
    let t = &planned.train;
    eprintln!(
        "dtf local: {} ps + {} workers, {}, {} (learning rate {}), model {:?}, batch {}, to step {}; run directory {}",
        opts.ps,
        opts.workers,
        t.mode,
        t.optimizer().describe(),
        t.learning_rate,
        planned.model.layers,
        t.batch_size,
        t.last_step,
        run_dir.display()
    );
    for note in &notes {
        eprintln!("dtf local: {note}");
    }
    eprintln!(
        "watch it from another shell: {} status --config {}",
        opts.program,
        run_dir.join("dtf.toml").display()
    );
    let rt = tokio::runtime::Runtime::new()?;
    let outcome = rt.block_on(dtf::local::run(&opts, &planned, &run_dir))?;
    let code = summary(&outcome, json);
    if json {
        println!("{}", serde_json::to_string(&outcome)?);
    }
    Ok(code)
}

/// Prints how a local run ended and returns its exit code: 0 when trained,
/// 130/143 when stopped by SIGINT/SIGTERM. With --json, stdout holds the
/// JSON alone; the lines for people go to stderr.
fn summary(outcome: &dtf::local::Outcome, json: bool) -> ExitCode {
    let say = |line: String| {
        if json {
            eprintln!("{line}");
        } else {
            println!("{line}");
        }
    };
    match outcome {
        dtf::local::Outcome::Trained(report) => {
            if report.already_complete {
                say(format!(
                    "already complete: the newest checkpoint is at global step {}; nothing to \
                     train (raise --steps to train on)",
                    report.global_step
                ));
            }
            let rate = report
                .steps_per_sec
                .map_or_else(String::new, |r| format!("  {r:.1} steps/s"));
            say(format!(
                "global_step {}  test accuracy {:.4}  EMA test accuracy {:.4}{rate}  ({:.1} s)",
                report.global_step, report.test_accuracy, report.ema_test_accuracy, report.seconds
            ));
            say(format!("precision {}", report.precision.name()));
            say(format!(
                "model {:?} trained with {}",
                report.layers,
                serde_json::to_value(report.optimizer)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_default()
            ));
            say(format!("checkpoints: {}", report.checkpoint_dir.display()));
            if let Some(b) = &report.best {
                say(format!(
                    "best checkpoint: {} (global_step {}, {} {:.4}; {} checkpoints scored)",
                    b.checkpoint.display(),
                    b.global_step,
                    b.metric,
                    b.score,
                    b.scored
                ));
            }
            ExitCode::SUCCESS
        }
        dtf::local::Outcome::Stopped(s) => {
            for p in &s.problems {
                eprintln!("warning: {p}");
            }
            let how = if s.forced { "killed" } else { "stopped" };
            match (&s.global_step, &s.checkpoint) {
                (Some(step), Some(path)) => say(format!(
                    "{how} by {} at global step {step} of {}; newest checkpoint {}",
                    s.signal.name(),
                    s.last_step,
                    path.display()
                )),
                _ => say(format!(
                    "{how} by {} with no usable checkpoint yet (last step {}); a new run starts afresh",
                    s.signal.name(),
                    s.last_step
                )),
            }
            say(format!("logs: {}", s.run_dir.join("logs").display()));
            say(format!("resume: {}", s.resume));
            ExitCode::from(s.signal.exit_code())
        }
    }
}

/// `dtf inspect --json`: what [`dtf::checkpoint::Inspection`] holds, as one object.
#[derive(serde::Serialize)]
struct InspectJson<'a> {
    /// The model file.
    model: FileJson<'a>,
    /// The EMA file, when it could be read.
    ema: Option<FileJson<'a>>,
    /// Why the EMA file could not be read.
    ema_error: Option<&'a str>,
    /// The pair verifies (checksums, shapes, names).
    verified: bool,
    /// What is wrong, when it does not.
    problem: Option<&'a str>,
}

/// One safetensors file in `dtf inspect --json`.
#[derive(serde::Serialize)]
struct FileJson<'a> {
    /// Its path.
    path: &'a std::path::Path,
    /// Its size in bytes.
    bytes: u64,
    /// Its metadata (strings, as the file has them: `global_step` included).
    metadata: &'a std::collections::BTreeMap<String, String>,
    /// Its tensors, sorted by name.
    tensors: Vec<TensorJson<'a>>,
}

/// One tensor in `dtf inspect --json`.
#[derive(serde::Serialize)]
struct TensorJson<'a> {
    /// Its name.
    name: &'a str,
    /// Its safetensors dtype (`F32`, `I64`).
    dtype: &'a str,
    /// Its dimensions; `[]` for a scalar.
    shape: &'a [usize],
}

impl<'a> From<&'a dtf::checkpoint::InspectedFile> for FileJson<'a> {
    fn from(f: &'a dtf::checkpoint::InspectedFile) -> Self {
        FileJson {
            path: &f.path,
            bytes: f.bytes,
            metadata: &f.metadata,
            tensors: f
                .tensors
                .iter()
                .map(|t| TensorJson {
                    name: &t.name,
                    dtype: &t.dtype,
                    shape: &t.shape,
                })
                .collect(),
        }
    }
}

impl<'a> From<&'a dtf::checkpoint::Inspection> for InspectJson<'a> {
    fn from(i: &'a dtf::checkpoint::Inspection) -> Self {
        InspectJson {
            model: FileJson::from(&i.model),
            ema: i.ema.as_ref().ok().map(FileJson::from),
            ema_error: i.ema.as_ref().err().map(String::as_str),
            verified: i.problem.is_none(),
            problem: i.problem.as_deref(),
        }
    }
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
}
