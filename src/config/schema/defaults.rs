//! Every section's defaults: the reference program's values, and the paths the
//! package installs.

use super::*;

impl Default for ClusterConfig {
    fn default() -> Self {
        Self {
            ps: vec!["127.0.0.1:2222".into()],
            worker: vec!["127.0.0.1:2223".into()],
            placement: Placement::RoundRobin,
            ps_exit_when_complete: true,
            transport: Transport::Auto,
            runtime_dir: String::new(),
            compression: Compression::None,
        }
    }
}

impl Default for TrainConfig {
    fn default() -> Self {
        Self {
            mode: Mode::Async,
            batch_size: 100,
            learning_rate: 0.01,
            learning_rate_decay: 0.99,
            lr_schedule: LrSchedule::ExponentialDecay,
            learning_rate_decay_steps: 0,
            staircase: false,
            lr_boundaries: Vec::new(),
            lr_values: Vec::new(),
            cosine_alpha: 0.0,
            warmup_steps: 0,
            clip_norm: 0.0,
            regularization_rate: 0.0001,
            moving_average_decay: 0.99,
            last_step: 20000,
            replicas_to_aggregate: None,
            total_num_replicas: None,
            seed: 0,
            log_step_count_steps: 100,
            save_summaries_steps: 100,
            // TensorFlow 1.x's defaults (MomentumOptimizer has none for
            // `momentum`; 0.9 is the usual choice).
            optimizer: OptimizerKind::Sgd,
            momentum: 0.9,
            use_nesterov: false,
            beta1: 0.9,
            beta2: 0.999,
            epsilon: 1e-8,
            initial_accumulator_value: 0.1,
            precision: crate::kernel::Precision::Float32,
            flush_denormals: true,
        }
    }
}

impl Default for ModelConfig {
    fn default() -> Self {
        Self {
            layers: vec![784, 500, 10],
            hidden: None,
            kind: ModelKind::Mlp,
            embedding_dim: 16,
            partitioner: Partitioner::MinSize,
            partitions: 0,
            min_shard_bytes: 256 << 10,
            max_shards: 0,
            activation: crate::model::Activation::Relu,
            dropout: 0.0,
            task: ModelTask::Classification,
            tables: TablesConfig::default(),
        }
    }
}

impl Default for TablesConfig {
    fn default() -> Self {
        Self {
            min_count: 1,
            steps_to_live: 0,
            max_rows: 0,
            optimizer: None,
            linear_optimizer: None,
            learning_rate: 0.0,
            linear_learning_rate: 0.0,
            ftrl_l1: 0.0,
            ftrl_l2: 0.0,
            ftrl_learning_rate_power: -0.5,
            ftrl_initial_accumulator_value: 0.1,
            moving_average: true,
        }
    }
}

impl Default for DataConfig {
    fn default() -> Self {
        Self {
            format: DataFormat::Idx,
            dir: DEFAULT_DATA_DIR.into(),
            path: None,
            train: None,
            test: None,
            label: "label".into(),
            standardize: false,
            threshold: None,
            categorical: Vec::new(),
            test_fraction: 0.2,
            delimiter: AUTO_DELIMITER.into(),
        }
    }
}

impl Default for CheckpointConfig {
    fn default() -> Self {
        Self {
            dir: "/var/lib/dtf/checkpoints".into(),
            save_secs: None,
            save_steps: 0,
            max_to_keep: 5,
            full_every: 1,
        }
    }
}

impl Default for SecurityConfig {
    fn default() -> Self {
        Self {
            token_file: "/etc/dtf/token".into(),
            tls_cert: None,
            tls_key: None,
            tls_ca: None,
        }
    }
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            level: "info".into(),
        }
    }
}
