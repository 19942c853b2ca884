//! Shared helpers: a temp dir per test, a tiny learnable data set, configs,
//! running the real binaries, and a gRPC client for a ps.

#![allow(dead_code)]

use dtf::auth::AddToken;
use dtf::config::{Config, Mode};
use dtf::pb::parameter_server_client::ParameterServerClient;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};
use tonic::codegen::InterceptedService;
use tonic::transport::Channel;

/// Image side of the tiny data set (the model input is SIDE²).
pub const SIDE: usize = 8;
pub const CLASSES: usize = 4;
pub const TOKEN: &str = "test-token-0123456789";

/// Path of one of the package's binaries.
pub fn bin(name: &str) -> PathBuf {
    match name {
        "dtf" => PathBuf::from(env!("CARGO_BIN_EXE_dtf")),
        "dtf-ps" => PathBuf::from(env!("CARGO_BIN_EXE_dtf-ps")),
        "dtf-worker" => PathBuf::from(env!("CARGO_BIN_EXE_dtf-worker")),
        other => panic!("no binary {other}"),
    }
}

/// Writes a small learnable IDX data set: class c lights up row band c, plus noise.
pub fn tiny_data(dir: &Path, train: usize, test: usize) -> PathBuf {
    use rand::{Rng, SeedableRng};
    let data = dir.join("data");
    std::fs::create_dir_all(&data).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut make = |n: usize| {
        let mut images = vec![0u8; n * SIDE * SIDE];
        let mut labels = vec![0u8; n];
        for i in 0..n {
            let c = rng.random_range(0..CLASSES);
            labels[i] = c as u8;
            for p in 0..SIDE * SIDE {
                let row = p / SIDE;
                let band = row * CLASSES / SIDE == c;
                let noise: u8 = rng.random_range(0..90);
                images[i * SIDE * SIDE + p] = if band { 160 + noise } else { noise };
            }
        }
        (images, labels)
    };
    let (ti, tl) = make(train);
    dtf::data::write_idx_images(&data.join("train-images-idx3-ubyte.gz"), &ti, SIDE, SIDE).unwrap();
    dtf::data::write_idx_labels(&data.join("train-labels-idx1-ubyte.gz"), &tl).unwrap();
    let (ei, el) = make(test);
    dtf::data::write_idx_images(&data.join("t10k-images-idx3-ubyte"), &ei, SIDE, SIDE).unwrap();
    dtf::data::write_idx_labels(&data.join("t10k-labels-idx1-ubyte"), &el).unwrap();
    data
}

/// Free 127.0.0.1 addresses.
pub fn free_addrs(n: usize) -> Vec<String> {
    let ls: Vec<_> = (0..n).map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    ls.iter().map(|l| l.local_addr().unwrap().to_string()).collect()
}

/// A test's cluster: its directory, config file, and the processes it started
/// (killed when dropped, so nothing outlives a failing test).
pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub config_path: PathBuf,
    pub cfg: Config,
    pub procs: Vec<(String, Child)>,
}

impl Cluster {
    /// A cluster of `ps` + `workers` tasks on free ports over the tiny data set.
    pub fn new(ps: usize, workers: usize, last_step: u64, mode: Mode) -> Self {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let data = tiny_data(dir.path(), 2000, 400);
        let addrs = free_addrs(ps + workers);
        let mut cfg = Config::default();
        cfg.cluster.ps = addrs[..ps].to_vec();
        cfg.cluster.worker = addrs[ps..].to_vec();
        cfg.train.mode = mode;
        cfg.train.last_step = last_step;
        cfg.train.batch_size = 20;
        cfg.train.learning_rate = 0.1;
        cfg.train.log_step_count_steps = 20;
        cfg.model.layers = vec![SIDE * SIDE, 16, CLASSES];
        cfg.data.dir = data;
        cfg.checkpoint.dir = dir.path().join("ckpt");
        cfg.checkpoint.save_secs = 1;
        let token = dir.path().join("token");
        std::fs::write(&token, TOKEN).unwrap();
        std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).unwrap();
        cfg.security.token_file = token;
        let config_path = dir.path().join("dtf.toml");
        let mut c = Self { dir, config_path, cfg, procs: Vec::new() };
        c.write_config();
        c
    }

    pub fn write_config(&mut self) {
        std::fs::write(&self.config_path, self.cfg.to_toml()).unwrap();
    }

    pub fn log_path(&self, name: &str) -> PathBuf {
        self.dir.path().join(format!("{}.log", name.replace(':', "-")))
    }

    /// Starts `dtf-ps` or `dtf-worker` for task `index`, logging to a file
    /// (appended, so a restarted task's log follows its predecessor's).
    pub fn start(&mut self, role: &str, index: usize) -> &mut Child {
        let name = format!("{role}:{index}");
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.log_path(&name)).unwrap();
        let child = Command::new(bin(&format!("dtf-{role}")))
            .arg("--config")
            .arg(&self.config_path)
            .arg("--task")
            .arg(index.to_string())
            .env_remove("NOTIFY_SOCKET")
            .env_remove("TF_CONFIG")
            .env("RUST_BACKTRACE", "1")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        self.procs.retain(|(n, _)| n != &name);
        self.procs.push((name, child));
        &mut self.procs.last_mut().unwrap().1
    }

    /// Starts every ps and worker.
    pub fn start_all(&mut self) {
        for i in 0..self.cfg.cluster.ps.len() {
            self.start("ps", i);
        }
        for i in 0..self.cfg.cluster.worker.len() {
            self.start("worker", i);
        }
    }

    pub fn child(&mut self, name: &str) -> &mut Child {
        &mut self.procs.iter_mut().find(|(n, _)| n == name).unwrap_or_else(|| panic!("no process {name}")).1
    }

    /// SIGKILL, and reap.
    pub fn kill(&mut self, name: &str) {
        let c = self.child(name);
        let _ = c.kill();
        let _ = c.wait();
    }

    /// Sends a signal.
    pub fn signal(&mut self, name: &str, sig: i32) {
        let pid = self.child(name).id() as i32;
        // SAFETY: a pid this test spawned and has not reaped.
        unsafe { libc::kill(pid, sig) };
    }

    /// Waits for a process to exit, failing the test (with its log) past `deadline`.
    pub fn wait(&mut self, name: &str, deadline: Duration) -> ExitStatus {
        let end = Instant::now() + deadline;
        loop {
            if let Some(s) = self.child(name).try_wait().unwrap() {
                return s;
            }
            if Instant::now() > end {
                panic!("{name} still running after {deadline:?}; log:\n{}", self.log(name));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits for every process; asserts each exited 0.
    pub fn wait_all_success(&mut self, deadline: Duration) {
        let names: Vec<String> = self.procs.iter().map(|(n, _)| n.clone()).collect();
        for n in names {
            let s = self.wait(&n, deadline);
            assert!(s.success(), "{n} exited with {s}; log:\n{}", self.log(&n));
        }
    }

    pub fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.log_path(name)).unwrap_or_default()
    }

    /// A client for ps `i` carrying `token` (None: no authorization header).
    pub async fn client(&self, i: usize, token: Option<&str>) -> PsClient {
        client(&self.cfg.cluster.ps[i], token).await
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for (_, c) in &mut self.procs {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

pub type PsClient = ParameterServerClient<InterceptedService<Channel, Auth>>;

/// Adds a token, or nothing.
#[derive(Clone)]
pub struct Auth(Option<AddToken>);

impl tonic::service::Interceptor for Auth {
    fn call(&mut self, req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        match &mut self.0 {
            Some(a) => a.call(req),
            None => Ok(req),
        }
    }
}

/// Connects to `addr`, retrying until it answers (10 s deadline).
pub async fn client(addr: &str, token: Option<&str>) -> PsClient {
    let end = Instant::now() + Duration::from_secs(10);
    let auth = Auth(token.map(|t| AddToken::new(t).unwrap()));
    loop {
        match Channel::from_shared(format!("http://{addr}")).unwrap().connect().await {
            Ok(ch) => return ParameterServerClient::with_interceptor(ch, auth).max_decoding_message_size(64 << 20),
            Err(e) if Instant::now() > end => panic!("cannot connect to {addr}: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// Polls `f` until it returns Some, or panics with `what` after `deadline`.
pub async fn eventually<T, F, Fut>(deadline: Duration, what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let end = Instant::now() + deadline;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < end, "timed out after {deadline:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
