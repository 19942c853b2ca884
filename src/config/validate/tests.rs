//! Validation's unit tests: each section's bad values and the messages they get.

use super::*;
use crate::config::Override;
use crate::config::test_util::*;

#[test]
fn out_of_range_values_are_errors() {
    let cases: &[(&str, &str)] = &[
        ("[train]\nbatch_size = 0", "train.batch_size"),
        ("[train]\nlearning_rate = 0.0", "train.learning_rate"),
        ("[train]\nlearning_rate = -0.1", "train.learning_rate"),
        ("[train]\nlearning_rate = inf", "train.learning_rate"),
        ("[train]\nlearning_rate = nan", "train.learning_rate"),
        (
            "[train]\nlearning_rate_decay = 0.0",
            "train.learning_rate_decay",
        ),
        (
            "[train]\nlearning_rate_decay = 1.5",
            "train.learning_rate_decay",
        ),
        (
            "[train]\nregularization_rate = -1e-4",
            "train.regularization_rate",
        ),
        (
            "[train]\nmoving_average_decay = 1.0",
            "train.moving_average_decay",
        ),
        (
            "[train]\nmoving_average_decay = -0.5",
            "train.moving_average_decay",
        ),
        ("[train]\nlast_step = 0", "train.last_step"),
        (
            "[train]\nlog_step_count_steps = 0",
            "train.log_step_count_steps",
        ),
        (
            "[train]\nsave_summaries_steps = 0",
            "train.save_summaries_steps",
        ),
        ("[train]\nmomentum = 1.0", "train.momentum"),
        ("[train]\nmomentum = -0.1", "train.momentum"),
        ("[train]\nbeta1 = 1.0", "train.beta1"),
        ("[train]\nbeta2 = nan", "train.beta2"),
        ("[train]\nepsilon = 0.0", "train.epsilon"),
        (
            "[train]\ninitial_accumulator_value = 0.0",
            "train.initial_accumulator_value",
        ),
        (
            "[train]\ninitial_accumulator_value = inf",
            "train.initial_accumulator_value",
        ),
        ("[model]\nlayers = [784]", "model.layers"),
        ("[model]\nlayers = [784, 0, 10]", "model.layers[1]"),
        ("[model]\npartitioner = \"fixed\"", "model.partitions"),
        ("[model]\npartitions = 4", "model.partitions"),
        ("[model]\nmin_shard_bytes = 0", "model.min_shard_bytes"),
        ("[model]\npartitioner = \"even\"", "model.partitioner"),
        ("[cluster]\nps = []", "cluster.ps"),
        ("[cluster]\nworker = []", "cluster.worker"),
        ("[checkpoint]\nsave_secs = 0", "checkpoint.save_secs"),
        ("[checkpoint]\nmax_to_keep = 0", "checkpoint.max_to_keep"),
        ("[checkpoint]\nfull_every = 0", "checkpoint.full_every"),
        ("[checkpoint]\nfull_every = 1001", "checkpoint.full_every"),
        (
            "[checkpoint]\nsave_secs = 10\nsave_steps = 100",
            "checkpoint.save_steps",
        ),
        ("[eval]\nkeep_best = 0", "eval.keep_best"),
        ("[checkpoint]\ndir = \"\"", "checkpoint.dir"),
        ("[metrics]\nlisten = \"9464\"", "metrics.listen"),
        ("[ps]\nsnapshot_secs = 86401", "ps.snapshot_secs"),
        ("[ps]\nsnapshot_full_every = 0", "ps.snapshot_full_every"),
        ("[ps]\nsnapshot_full_every = 1001", "ps.snapshot_full_every"),
        (
            "[ps]\nsnapshot_delta_min_bytes = -1",
            "snapshot_delta_min_bytes",
        ),
        ("[ps]\nsnapshot_dir = \"state\"", "ps.snapshot_dir"),
        ("[log]\nlevel = \"degub\"", "log.level"),
        ("[log]\nlevel = \"dtf=loud\"", "log.level"),
        ("[log]\nlevel = \"\"", "log.level"),
    ];
    for (text, key) in cases {
        let err = error_for(text, key);
        assert!(err.contains("expected"), "{err}");
    }
}

#[test]
fn optimizers_take_tensorflow_defaults_and_their_keys() {
    use crate::optimizer::Optimizer;
    let default = Config::from_toml_str("", "f").unwrap();
    assert_eq!(default.train.optimizer(), Optimizer::Sgd);
    let adam = Config::from_toml_str("[train]\noptimizer = \"adam\"\n", "f").unwrap();
    assert_eq!(
        adam.train.optimizer(),
        Optimizer::Adam {
            beta1: 0.9,
            beta2: 0.999,
            epsilon: 1e-8
        }
    );
    let momentum = Config::from_toml_str(
        "[train]\noptimizer = \"momentum\"\nmomentum = 0.5\nuse_nesterov = true\n",
        "f",
    )
    .unwrap();
    assert_eq!(
        momentum.train.optimizer(),
        Optimizer::Momentum {
            momentum: 0.5,
            use_nesterov: true
        }
    );
    let adagrad = Config::from_toml_str("[train]\noptimizer = \"adagrad\"\n", "f").unwrap();
    assert_eq!(
        adagrad.train.optimizer(),
        Optimizer::Adagrad {
            initial_accumulator_value: 0.1
        }
    );
    let err = Config::from_toml_str("[train]\noptimizer = \"rmsprop\"\n", "f")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("train.optimizer") || err.contains("rmsprop"),
        "{err}"
    );
    assert!(err.contains("adam"), "the error lists the choices: {err}");
}

#[test]
fn flush_denormals_is_on_by_default_and_a_boolean() {
    assert!(
        Config::from_toml_str("", "f")
            .unwrap()
            .train
            .flush_denormals
    );
    let off = Config::from_toml_str("[train]\nflush_denormals = false\n", "f").unwrap();
    assert!(!off.train.flush_denormals);
    let err = Config::from_toml_str("[train]\nflush_denormals = \"no\"\n", "f")
        .unwrap_err()
        .to_string();
    assert!(err.contains("flush_denormals"), "{err}");
    assert!(
        err.contains("bool"),
        "the error says what would be right: {err}"
    );
}

#[test]
fn sync_replica_counts_are_checked() {
    let ok = format!(
        "{TWO_WORKERS}[train]\nmode = \"sync\"\nreplicas_to_aggregate = 1\ntotal_num_replicas = 2\n"
    );
    let config = Config::from_toml_str(&ok, "f").unwrap();
    assert_eq!(
        (config.replicas_to_aggregate(), config.total_num_replicas()),
        (1, 2)
    );
    let err = error_for(
        &format!("{TWO_WORKERS}[train]\nreplicas_to_aggregate = 3\n"),
        "train.replicas_to_aggregate",
    );
    assert!(err.contains("1 to 2"), "{err}");
    error_for(
        &format!("{TWO_WORKERS}[train]\nreplicas_to_aggregate = 0\n"),
        "train.replicas_to_aggregate",
    );
    error_for(
        &format!("{TWO_WORKERS}[train]\nreplicas_to_aggregate = 2\ntotal_num_replicas = 1\n"),
        "train.total_num_replicas",
    );
    error_for(
        &format!("{TWO_WORKERS}[train]\ntotal_num_replicas = 3\n"),
        "train.total_num_replicas",
    );
}

#[test]
fn addresses_are_checked() {
    let err = error_for(
        "[cluster]\nps = [\"a:1\"]\nworker = [\"b:2\", \"a:1\"]\n",
        "cluster.worker[1]",
    );
    assert!(
        err.contains("duplicate address \"a:1\" (also cluster.ps[0])"),
        "{err}"
    );
    error_for(
        "[cluster]\nworker = [\"b:2\", \"b:2\"]\n",
        "cluster.worker[1]",
    );
    for bad in [
        "host",
        "host:0",
        "host:65536",
        ":80",
        "ho st:1",
        "::1:80",
        "[nope]:80",
        "h:x",
    ] {
        error_for(&format!("[cluster]\nps = [\"{bad}\"]\n"), "cluster.ps[0]");
    }
    for good in [
        "10.0.0.1:2222",
        "ps-0.dtf.svc.cluster.local:2222",
        "[::1]:2222",
        "h:65535",
    ] {
        Config::from_toml_str(&format!("[cluster]\nps = [\"{good}\"]\n"), "f").unwrap();
    }
}

#[test]
fn task_outside_cluster() {
    let config = Config::from_toml_str(TWO_WORKERS, "/etc/dtf/dtf.toml").unwrap();
    config
        .check_task(TaskId {
            role: Role::Worker,
            index: 1,
        })
        .unwrap();
    config
        .check_task(TaskId {
            role: Role::Ps,
            index: 0,
        })
        .unwrap();
    let err = config
        .check_task(TaskId {
            role: Role::Worker,
            index: 3,
        })
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "task worker:3: the cluster has 2 worker tasks (cluster.worker in /etc/dtf/dtf.toml)"
    );
    let err = config
        .check_task(TaskId {
            role: Role::Ps,
            index: 1,
        })
        .unwrap_err();
    assert!(
        err.to_string().contains("cluster.ps in /etc/dtf/dtf.toml"),
        "{err}"
    );
}

#[test]
fn tls_needs_all_three_files_or_none() {
    let base = "[security]\ntls_cert = \"/c\"\ntls_key = \"/k\"\ntls_ca = \"/a\"\n";
    let all = Config::from_toml_str(&format!("{TWO_WORKERS}{base}"), "/etc/dtf/test.toml");
    assert_eq!(all.unwrap().security.tls_key, Some("/k".into()));
    let err = error_for(
        &format!("{TWO_WORKERS}[security]\ntls_cert = \"/c\"\ntls_ca = \"/a\"\n"),
        "security.tls_key",
    );
    assert!(err.contains("security.tls_cert"), "{err}");
    error_for(
        &format!("{TWO_WORKERS}{}", base.replace("\"/a\"", "\"\"")),
        "security.tls_ca",
    );
    // A change of TLS files needs a restart.
    let old = Config::default();
    let mut new = old.clone();
    new.security.tls_ca = Some("/a".into());
    assert_eq!(old.changed_keys(&new), ["security.tls_ca"]);
    assert!(old.reload(new).is_err());
}

#[test]
fn a_huge_learning_rate_is_refused_naming_the_range() {
    let err = error_for("[train]\nlearning_rate = 1e30", "train.learning_rate");
    assert!(err.contains("expected a number in (0, 10]"), "{err}");
    let err = error_for(
        "[train]\nregularization_rate = 1e30",
        "train.regularization_rate",
    );
    assert!(err.contains("[0, 1]"), "{err}");
    let err = error_for(
        "[train]\nlearning_rate = 5.0\nregularization_rate = 0.5",
        "train.regularization_rate",
    );
    assert!(err.contains("train.learning_rate = 5"), "{err}");
    Config::from_toml_str(
        "[train]\nlearning_rate = 0.8\nregularization_rate = 0.0001",
        "/f",
    )
    .unwrap();
}

#[test]
fn localhost_and_127_0_0_1_on_one_port_are_a_duplicate() {
    let err = error_for(
        "[cluster]\nps = [\"localhost:7000\"]\nworker = [\"127.0.0.1:7000\"]\n",
        "cluster.worker[0]",
    );
    assert!(
        err.contains("also cluster.ps[0], \"localhost:7000\", the same endpoint"),
        "{err}"
    );
    for (a, b) in [
        ("[::1]:7000", "localhost:7000"),
        ("[::ffff:10.0.0.1]:7000", "10.0.0.1:7000"),
        ("Host-A:7000", "host-a:7000"),
    ] {
        error_for(
            &format!("[cluster]\nps = [\"{a}\"]\nworker = [\"{b}\"]\n"),
            "cluster.worker[0]",
        );
    }
    Config::from_toml_str(
        "[cluster]\nps = [\"localhost:7000\"]\nworker = [\"127.0.0.1:7001\"]\n",
        "/f",
    )
    .unwrap();
}

#[test]
fn hidden_widths_take_the_data_shape_and_layers_must_fit_it() {
    let mut c = Config::from_toml_str("[model]\nhidden = [32, 16]\n", "f").unwrap();
    c.resolve_layers(20, 3, "d").unwrap();
    assert_eq!(c.model.layers, [20, 32, 16, 3]);
    error_for("[model]\nhidden = [32, 0]\n", "model.hidden[1]");
    error_for("[model]\nhidden = [32]\nlayers = [5, 3]\n", "model.hidden");

    let mut c = Config::from_toml_str("[model]\nlayers = [20, 8, 3]\n", "f").unwrap();
    c.resolve_layers(20, 2, "d").unwrap();
    let err = c.resolve_layers(21, 3, "the npz").unwrap_err().to_string();
    assert!(
        err.contains("model.layers[0]") && err.contains("21 features"),
        "{err}"
    );
    let err = c.resolve_layers(20, 5, "d").unwrap_err().to_string();
    assert!(
        err.contains("model.layers[2]") && err.contains("labels up to 4"),
        "{err}"
    );
}

#[test]
fn each_data_format_needs_its_paths() {
    error_for("[data]\nformat = \"npz\"\n", "data.path");
    error_for("[data]\nformat = \"csv\"\ntest = \"a.csv\"\n", "data.train");
    // A CSV without data.test is split (data.test_fraction).
    Config::from_toml_str("[data]\nformat = \"csv\"\ntrain = \"a.csv\"\n", "f").unwrap();
    error_for(
        "[data]\nformat = \"csv\"\ntrain = \"a\"\ntest = \"b\"\nlabel = \"\"\n",
        "data.label",
    );
    Config::from_toml_str("[data]\nformat = \"npz\"\npath = \"x.npz\"\n", "f").unwrap();
}

#[test]
fn the_csv_delimiter_is_auto_or_one_character() {
    let c = Config::from_toml_str("", "f").unwrap();
    assert_eq!(
        (c.data.delimiter.as_str(), c.data.delimiter_byte()),
        ("auto", None)
    );
    for (text, byte) in [("|", b'|'), ("\\t", b'\t'), (";", b';'), (",", b',')] {
        let c = Config::from_toml_str(&format!("[data]\ndelimiter = \"{text}\"\n"), "f").unwrap();
        assert_eq!(c.data.delimiter_byte(), Some(byte), "{text}");
    }
    for bad in ["", "||", "ab", "\\\"", "é", "\\n"] {
        let err = error_for(
            &format!("[data]\ndelimiter = \"{bad}\"\n"),
            "data.delimiter",
        );
        assert!(err.contains("one ASCII character"), "{bad}: {err}");
    }
}

#[test]
fn wide_deep_takes_tensorflows_wide_deep_defaults_for_keys_nobody_set() {
    let c = Config::from_toml_str("[model]\nkind = \"wide_deep\"\n", "f").unwrap();
    assert_eq!(c.train.optimizer, OptimizerKind::Adagrad);
    assert_eq!(c.train.learning_rate, 0.05);
    assert_eq!(c.train.batch_size, 256);
    assert_eq!(c.model.hidden, Some(vec![64, 32]));
    // A key set keeps its value; the MLP keeps its own defaults.
    let c = Config::from_toml_str(
        "[model]\nkind = \"wide_deep\"\nhidden = [8]\n[train]\noptimizer = \"sgd\"\nlearning_rate = 0.2\n",
        "f",
    )
    .unwrap();
    assert_eq!(c.train.optimizer, OptimizerKind::Sgd);
    assert_eq!(
        (c.train.learning_rate, c.model.hidden),
        (0.2, Some(vec![8]))
    );
    let c = Config::from_toml_str("", "f").unwrap();
    assert_eq!(c.train.optimizer, OptimizerKind::Sgd);
    assert_eq!(c.model.hidden, None);
}

#[test]
fn embedding_tables_need_a_width_and_a_sparse_optimizer() {
    let err = error_for(
        "[model]\nkind = \"wide_deep\"\nembedding_dim = 0",
        "model.embedding_dim",
    );
    assert!(err.contains("expected a positive width"), "{err}");
    let err = error_for(
        "[model]\nkind = \"wide_deep\"\n[train]\noptimizer = \"adam\"",
        "train.optimizer",
    );
    assert!(
        err.contains("\"adam\" cannot update embedding tables") && err.contains("\"adagrad\""),
        "{err}"
    );
    assert!(err.contains("model.tables.optimizer"), "{err}");
    // The MLP has no tables: any optimizer.
    let (_dir, path) = write_config("[train]\noptimizer = \"adam\"");
    assert!(Config::load(&path).is_ok());
}

#[test]
fn each_part_of_wide_and_deep_takes_its_own_optimizer() {
    use crate::model::table::{EMBEDDINGS, WIDE};
    use crate::optimizer::{Optimizer, TableOptimizer};
    // Adam for the MLP, Adagrad for the embeddings, FTRL for the wide part.
    let c = Config::from_toml_str(
        "[model]\nkind = \"wide_deep\"\n[model.tables]\noptimizer = \"adagrad\"\n\
         linear_optimizer = \"ftrl\"\nftrl_l1 = 0.01\n[train]\noptimizer = \"adam\"\n",
        "f",
    )
    .unwrap();
    assert!(matches!(c.train.optimizer(), Optimizer::Adam { .. }));
    assert_eq!(
        c.table_optimizer(EMBEDDINGS),
        Some(TableOptimizer::Adagrad {
            initial_accumulator_value: 0.1
        })
    );
    assert_eq!(
        c.table_optimizer(WIDE),
        Some(TableOptimizer::Ftrl {
            learning_rate_power: -0.5,
            initial_accumulator_value: 0.1,
            l1: 0.01,
            l2: 0.0
        })
    );
    // Recorded in checkpoints and snapshot identities, each table's.
    let own: Vec<_> = c
        .own_table_optimizers()
        .into_iter()
        .map(|(n, o)| (n, o.name()))
        .collect();
    assert_eq!(
        own,
        [
            (EMBEDDINGS.to_owned(), "adagrad"),
            (WIDE.to_owned(), "ftrl")
        ]
    );
    let slots: Vec<_> = crate::placement::tables(&c)
        .iter()
        .map(|t| t.slots)
        .collect();
    assert_eq!(slots, [&["Adagrad"][..], &["Ftrl", "Ftrl_1"][..]]);
    // linear_optimizer unset: the wide part follows model.tables.optimizer;
    // both unset: train.optimizer's sparse form.
    let c = Config::from_toml_str(
        "[model]\nkind = \"wide_deep\"\n[model.tables]\noptimizer = \"lazy_adam\"\n",
        "f",
    )
    .unwrap();
    assert_eq!(c.table_optimizer(WIDE).unwrap().name(), "lazy_adam");
    let c = Config::from_toml_str("[model]\nkind = \"wide_deep\"\n", "f").unwrap();
    assert_eq!(c.table_optimizer(WIDE).unwrap().name(), "adagrad");
    assert!(
        c.own_table_optimizers().is_empty(),
        "files as before table rules"
    );
    // FTRL's hyperparameters as TensorFlow bounds them.
    for (toml, key) in [
        ("ftrl_l1 = -1.0", "model.tables.ftrl_l1"),
        ("ftrl_l2 = nan", "model.tables.ftrl_l2"),
        (
            "ftrl_learning_rate_power = 0.5",
            "model.tables.ftrl_learning_rate_power",
        ),
        (
            "ftrl_initial_accumulator_value = 0.0",
            "model.tables.ftrl_initial_accumulator_value",
        ),
    ] {
        error_for(&format!("[model.tables]\n{toml}"), key);
    }
    error_for(
        "[model.tables]\noptimizer = \"adam\"",
        "model.tables.optimizer",
    );
    // Each part's own rate, as a multiple of the model's (the schedule
    // shapes both); 0: the model's.
    let c = Config::from_toml_str(
        "[model]\nkind = \"wide_deep\"\n[model.tables]\nlinear_learning_rate = 0.2\n\
         [train]\nlearning_rate = 0.05\n",
        "f",
    )
    .unwrap();
    assert_eq!(c.table_learning_rate_scale(WIDE), 4.0);
    assert_eq!(c.table_learning_rate_scale(EMBEDDINGS), 1.0);
    error_for(
        "[model.tables]\nlearning_rate = -0.1",
        "model.tables.learning_rate",
    );
    error_for(
        "[model.tables]\nlinear_learning_rate = inf",
        "model.tables.linear_learning_rate",
    );
}

#[test]
fn table_admission_and_eviction_keys_refuse_what_cannot_work() {
    for (toml, key, expected) in [
        (
            "min_count = 0",
            "model.tables.min_count",
            "expected 1 to 255",
        ),
        (
            "min_count = 256",
            "model.tables.min_count",
            "expected 1 to 255",
        ),
        (
            "steps_to_live = 5000000000",
            "model.tables.steps_to_live",
            "to 4294967295 global steps",
        ),
        (
            "max_rows = 5000000000",
            "model.tables.max_rows",
            "rows per table per ps",
        ),
    ] {
        let err = error_for(&format!("[model.tables]\n{toml}"), key);
        assert!(err.contains(expected), "{toml}: {err}");
    }
    let c = Config::from_toml_str(
        "[model]\nkind = \"wide_deep\"\n[model.tables]\nmin_count = 2\nsteps_to_live = 100\nmax_rows = 1000\n",
        "f",
    )
    .unwrap();
    assert_eq!(
        (
            c.model.tables.min_count,
            c.model.tables.steps_to_live,
            c.model.tables.max_rows
        ),
        (2, 100, 1000)
    );
    // Not live: a reload that changes one names it.
    let mut new = c.clone();
    new.model.tables.max_rows = 10;
    let err = c.reload(new).unwrap_err().to_string();
    assert!(err.contains("model.tables.max_rows"), "{err}");
    // `--set` reaches a sub-table's keys.
    let o = Override::parse_set("model.tables.max_rows=5").unwrap();
    let c = Config::load_with(None, &[o]).unwrap();
    assert_eq!(c.model.tables.max_rows, 5);
    assert!(Override::parse_set("model.tables.x.y=1").is_err());
}

/// Wide & deep's best checkpoints rank by EMA AUC unless `[eval] metric`
/// says otherwise (accuracy at ½ included); the MLP has no AUC to rank by.
#[test]
fn wide_deep_ranks_by_ema_auc_unless_told_and_the_mlp_refuses_an_auc() {
    let c = Config::from_toml_str("[model]\nkind = \"wide_deep\"\n", "f").unwrap();
    assert_eq!(c.eval.metric, Metric::EmaAuc);
    for (metric, want) in [
        ("auc", Metric::Auc),
        ("accuracy", Metric::Accuracy),
        ("loss", Metric::Loss),
    ] {
        let c = Config::from_toml_str(
            &format!("[model]\nkind = \"wide_deep\"\n[eval]\nmetric = \"{metric}\"\n"),
            "f",
        )
        .unwrap();
        assert_eq!(c.eval.metric, want);
    }
    assert_eq!(
        Config::from_toml_str("", "f").unwrap().eval.metric,
        Metric::EmaAccuracy
    );
    for metric in ["auc", "ema_auc"] {
        let err = error_for(&format!("[eval]\nmetric = \"{metric}\""), "eval.metric");
        assert!(
            err.contains("wide_deep") && err.contains("\"ema_accuracy\""),
            "{err}"
        );
    }
}

/// `--set` reaches past TOML's integers (an i64), which a dtf.toml written for the tasks
/// could not hold: refused here, naming the key, not by a ps that cannot read its file.
#[test]
fn integers_a_dtf_toml_cannot_hold_are_errors() {
    for key in ["train.last_step", "train.seed", "checkpoint.save_steps"] {
        let o = Override::parse_set(&format!("{key}=9223372036854775808"))
            .unwrap_or_else(|e| panic!("{e}"));
        let e = Config::load_with(None, &[o]).expect_err(key).to_string();
        assert!(e.contains(key) && e.contains("2^63"), "{key}: {e}");
    }
    let o = Override::parse_set("train.last_step=9223372036854775807").unwrap();
    Config::load_with(None, &[o]).expect("TOML's largest integer");
}
