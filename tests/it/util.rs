//! Shared helpers: a temp dir per test, a tiny learnable data set, configs,
//! running the real binaries, and a gRPC client for a ps.

use dtf::auth::AddToken;
use dtf::config::{Config, Mode};
use dtf::transport::pb::parameter_server_client::ParameterServerClient;
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
        "dtf-evaluator" => PathBuf::from(env!("CARGO_BIN_EXE_dtf-evaluator")),
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

/// Where the tests take their ports from: below the kernel's ephemeral
/// range (`net.ipv4.ip_local_port_range`, 32768–60999 by default), so no
/// port-0 bind and no outgoing connection on this host is ever given one.
/// Only the tests take them, and they agree through a lock per port.
const TEST_PORTS: std::ops::Range<u16> = 20_000..32_000;

/// The port locks this test process holds, for its whole life: a daemon
/// it starts binds the port after the probe listener is gone, and no other
/// test (in this process or another, of this checkout or another) can take
/// it meanwhile. The kernel drops the locks when the process exits.
static HELD_PORTS: std::sync::Mutex<Vec<std::fs::File>> = std::sync::Mutex::new(Vec::new());

/// Locks `port` for this process if no other test holds it and nothing
/// else listens on it.
fn take_port(port: u16) -> bool {
    use std::os::fd::AsRawFd;
    let dir = std::env::temp_dir().join("dtf-test-ports");
    let _ = std::fs::create_dir_all(&dir);
    let Ok(file) = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join(port.to_string()))
    else {
        return false;
    };
    // SAFETY: flock on a descriptor this function owns.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return false;
    }
    if std::net::TcpListener::bind(("127.0.0.1", port)).is_err() {
        return false;
    }
    HELD_PORTS.lock().unwrap().push(file);
    true
}

/// `n` consecutive ports that this test alone will use (see [`TEST_PORTS`]).
pub fn free_port_run(n: usize) -> u16 {
    use rand::Rng;
    let span = TEST_PORTS.end - TEST_PORTS.start - n as u16;
    for _ in 0..10_000 {
        let base = TEST_PORTS.start + rand::rng().random_range(0..span);
        if (0..n as u16).all(|k| take_port(base + k)) {
            return base;
        }
    }
    panic!("no {n} free consecutive ports in {TEST_PORTS:?}");
}

/// Free 127.0.0.1 addresses that no other test will take (see [`TEST_PORTS`]).
pub fn free_addrs(n: usize) -> Vec<String> {
    (0..n)
        .map(|_| format!("127.0.0.1:{}", free_port_run(1)))
        .collect()
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
        // Its tasks inherit this process's descriptor limit, as `dtf local`'s
        // do: raised to the hard one, so `ulimit -n 1024` is no bound.
        dtf::files::raise_nofile_limit();
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
        cfg.checkpoint.save_secs = Some(1);
        let token = dir.path().join("token");
        std::fs::write(&token, TOKEN).unwrap();
        std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).unwrap();
        cfg.security.token_file = token;
        // The shared-memory sockets of this test's ps tasks, apart from every other test's.
        cfg.cluster.runtime_dir = dir.path().join("run").display().to_string();
        // The ps tasks' snapshots (state/ps-N/), apart from every other test's.
        cfg.ps.snapshot_dir = dir.path().join("state").display().to_string();
        let config_path = dir.path().join("dtf.toml");
        let mut c = Self {
            dir,
            config_path,
            cfg,
            procs: Vec::new(),
        };
        c.write_config();
        c
    }

    /// Sets `cluster.transport` and rewrites the config.
    pub fn use_transport(&mut self, transport: dtf::config::Transport) {
        self.cfg.cluster.transport = transport;
        self.write_config();
    }

    /// Checks that every worker that logged its connections reached every ps
    /// by the transport `transport` means here (all on 127.0.0.1: `auto` is
    /// shared memory), so a test on `auto` cannot pass over TCP unnoticed.
    pub fn assert_transport(&self, transport: dtf::config::Transport) {
        let want = match transport {
            dtf::config::Transport::Auto => "transport=shm",
            dtf::config::Transport::Tcp => "transport=tcp",
        };
        let mut seen = 0;
        for i in 0..self.cfg.cluster.worker.len() {
            let log = self.log(&format!("worker:{i}"));
            for line in log.lines().filter(|l| l.contains("Connected to ps.")) {
                assert!(line.contains(want), "worker:{i} expected {want}: {line}");
                seen += 1;
            }
        }
        assert!(seen > 0, "no worker logged its transport");
    }

    pub fn write_config(&mut self) {
        std::fs::write(&self.config_path, self.cfg.to_toml()).unwrap();
    }

    pub fn log_path(&self, name: &str) -> PathBuf {
        self.dir
            .path()
            .join(format!("{}.log", name.replace(':', "-")))
    }

    /// Starts `dtf-ps` or `dtf-worker` for task `index`, logging to a file
    /// (appended, so a restarted task's log follows its predecessor's).
    pub fn start(&mut self, role: &str, index: usize) -> &mut Child {
        self.start_with_env(role, index, &[])
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
        &mut self
            .procs
            .iter_mut()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("no process {name}"))
            .1
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
        if sig == libc::SIGSTOP {
            // kill(2) returns before the stop takes effect: a process may
            // answer one more call. Wait until every thread is stopped.
            // A process that already exited (a zombie, or reaped by a
            // wrapper) cannot stop: that is not this wait's business.
            let end = Instant::now() + Duration::from_secs(2);
            while !all_threads_stopped(pid) && Instant::now() < end {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    /// Waits for a process to exit, failing the test (with its log) past `deadline`.
    pub fn wait(&mut self, name: &str, deadline: Duration) -> ExitStatus {
        let end = Instant::now() + deadline;
        loop {
            if let Some(s) = self.child(name).try_wait().unwrap() {
                return s;
            }
            if Instant::now() > end {
                panic!(
                    "{name} still running after {deadline:?}; log:\n{}",
                    self.log(name)
                );
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

    /// ps `i`'s `State`, or `None` while it does not answer.
    pub async fn state(&self, i: usize) -> Option<dtf::transport::pb::StateResponse> {
        ps_state(&mut self.client(i, Some(TOKEN)).await).await
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for (_, c) in &mut self.procs {
            let _ = c.kill();
            let _ = c.wait();
        }
        // A failed test shows what each task logged last: the cause of a
        // timeout is in them, and the directory goes with the cluster.
        if std::thread::panicking() {
            for (name, _) in &self.procs {
                let log = self.log(name);
                let lines: Vec<&str> = log.lines().collect();
                let tail = lines[lines.len().saturating_sub(40)..].join("\n");
                eprintln!("---- {name}: the last of its log ----\n{tail}");
            }
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
        match Channel::from_shared(format!("http://{addr}"))
            .unwrap()
            // Every test RPC has a deadline: a hung ps fails the test, never
            // stalls the suite (the ps's own waits are bounded at 1 s).
            .timeout(Duration::from_secs(30))
            .connect_timeout(Duration::from_secs(5))
            .connect()
            .await
        {
            Ok(ch) => {
                return ParameterServerClient::with_interceptor(ch, auth)
                    .max_decoding_message_size(64 << 20);
            }
            Err(e) if Instant::now() > end => panic!("cannot connect to {addr}: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// dtf's own client of the ps tasks of `c` (the transport `c`'s config
/// says), presenting `token`.
pub fn ps_client(c: &Cluster, token: &str) -> dtf::transport::Cluster {
    let specs = dtf::model::Mlp::new(&c.cfg.model.layers)
        .unwrap()
        .variables();
    dtf::transport::Cluster::new(&c.cfg, specs, &dtf::auth::Credentials::plaintext(token)).unwrap()
}

/// Polls `f` until it returns Some, or panics with `what` after `deadline`
/// (the blocking twin of [`eventually`]).
/// Whether every thread of `pid` is in the stopped state (`T` or `t` in
/// `/proc/PID/task/TID/stat`).
fn all_threads_stopped(pid: i32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return true;
    };
    tasks.flatten().all(|t| {
        // A thread gone since the listing, or exited (Z, X), counts as
        // stopped. The state follows the command name's closing parenthesis.
        std::fs::read_to_string(t.path().join("stat")).map_or(true, |stat| {
            stat.rsplit_once(") ")
                .is_none_or(|(_, rest)| rest.starts_with(['T', 't', 'Z', 'X']))
        })
    })
}

pub fn until<T>(deadline: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let end = Instant::now() + deadline;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            Instant::now() < end,
            "timed out after {deadline:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Room for a live `last_step` to land on every task before the run gets
/// there: five seconds of steps at the rate ps 0 trains now, at least 500
/// (a reload settles for 200 ms; shm trains the tiny model at ~14000
/// steps/s, sync TCP on a loaded machine at ~200, where a fixed 20000
/// steps once took longer than a test's whole wait for the run's end).
pub async fn room(c: &Cluster) -> u64 {
    let step = || async {
        eventually(Duration::from_secs(120), "ps:0 initialized", || async {
            c.state(0)
                .await
                .filter(|s| s.initialized)
                .map(|s| s.global_step)
        })
        .await
    };
    let (from, at) = (step().await, Instant::now());
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rate = step().await.saturating_sub(from) as f64 / at.elapsed().as_secs_f64();
    ((rate * 5.0) as u64).max(500)
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
        assert!(
            Instant::now() < end,
            "timed out after {deadline:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// ---- Added for the daemon, config-error and auth tests. ----

/// Environment variables a test binary must not inherit from the test runner.
const INHERITED_CONTROL_VARS: &[&str] = &[
    "NOTIFY_SOCKET",
    "TF_CONFIG",
    "WATCHDOG_USEC",
    "WATCHDOG_PID",
    "DTF_CONFIG",
];

impl Cluster {
    /// As [`Cluster::start`], with extra environment variables (e.g.
    /// `NOTIFY_SOCKET`, `WATCHDOG_USEC`, `DTF_TRAIN__LAST_STEP`).
    pub fn start_with_env(
        &mut self,
        role: &str,
        index: usize,
        env: &[(&str, &std::ffi::OsStr)],
    ) -> &mut Child {
        self.start_wrapped(role, index, env, &[])
    }

    /// Starts a daemon as `wrapper… dtf-<role> --config … --task index`.
    pub fn start_wrapped(
        &mut self,
        role: &str,
        index: usize,
        env: &[(&str, &std::ffi::OsStr)],
        wrapper: &[&str],
    ) -> &mut Child {
        let config = self.config_path.clone();
        self.spawn(
            &format!("{role}:{index}"),
            role,
            index,
            &config,
            env,
            wrapper,
        )
    }

    /// Starts `dtf-<role> --config <config> --task <index>` as process
    /// `name` (its log `name`.log): a second process claiming a task, or a
    /// task reading a file of its own.
    pub fn start_as(&mut self, name: &str, role: &str, index: usize, config: &Path) -> &mut Child {
        self.spawn(name, role, index, config, &[], &[])
    }

    /// Spawns `wrapper… dtf-<role> --config <config> --task <index>` as
    /// process `name`, its output appended to `name`.log, replacing any
    /// process of that name.
    fn spawn(
        &mut self,
        name: &str,
        role: &str,
        index: usize,
        config: &Path,
        env: &[(&str, &std::ffi::OsStr)],
        wrapper: &[&str],
    ) -> &mut Child {
        let index = index.to_string();
        let args = [
            "--config".as_ref(),
            config.as_os_str(),
            "--task".as_ref(),
            index.as_ref(),
        ];
        self.spawn_args(name, role, &args, env, wrapper)
    }

    /// Starts `dtf-<role> ARGS` as process `name` (its log `name`.log) with
    /// exactly these arguments, no `--config` or `--task` added: a task
    /// launched with TensorFlow's flags.
    pub fn start_args(
        &mut self,
        name: &str,
        role: &str,
        args: &[&std::ffi::OsStr],
        env: &[(&str, &std::ffi::OsStr)],
    ) -> &mut Child {
        self.spawn_args(name, role, args, env, &[])
    }

    /// Spawns `wrapper… dtf-<role> ARGS` as process `name`, its output
    /// appended to `name`.log, replacing any process of that name.
    fn spawn_args(
        &mut self,
        name: &str,
        role: &str,
        args: &[&std::ffi::OsStr],
        env: &[(&str, &std::ffi::OsStr)],
        wrapper: &[&str],
    ) -> &mut Child {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path(name))
            .unwrap();
        let daemon = bin(&format!("dtf-{role}"));
        let mut cmd = match wrapper.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(daemon);
                c
            }
            None => Command::new(daemon),
        };
        cmd.args(args);
        for var in INHERITED_CONTROL_VARS {
            cmd.env_remove(var);
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd
            .env("RUST_BACKTRACE", "1")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        self.procs.retain(|(n, _)| n != name);
        self.procs.push((name.to_owned(), child));
        &mut self.procs.last_mut().unwrap().1
    }

    /// Waits until `name`'s log contains `needle` at least `count` times
    /// (failing the test with the log past `deadline`).
    pub fn wait_log(&self, name: &str, needle: &str, count: usize, deadline: Duration) -> String {
        let end = Instant::now() + deadline;
        loop {
            let log = self.log(name);
            if log.matches(needle).count() >= count {
                return log;
            }
            assert!(
                Instant::now() < end,
                "{name}'s log has not said {needle:?} {count} time(s) after {deadline:?}:\n{log}"
            );
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    /// Writes the config like an editor does: a temp file, then a rename over the old one.
    pub fn write_config_by_rename(&mut self) {
        let tmp = self.config_path.with_extension("toml.new");
        std::fs::write(&tmp, self.cfg.to_toml()).unwrap();
        std::fs::rename(&tmp, &self.config_path).unwrap();
    }
}

/// A stand-in for systemd's notification socket: a unix datagram socket in
/// the test's directory, passed to a daemon as `NOTIFY_SOCKET`.
pub struct NotifySocket {
    /// The bound socket.
    sock: std::os::unix::net::UnixDatagram,
    /// Its path, the value of `NOTIFY_SOCKET`.
    pub path: PathBuf,
}

impl NotifySocket {
    pub fn bind(dir: &Path) -> Self {
        let path = dir.join("notify.sock");
        let sock = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
        Self { sock, path }
    }

    /// The next datagram, or None if none arrives within `timeout`.
    pub fn recv(&self, timeout: Duration) -> Option<String> {
        self.sock
            .set_read_timeout(Some(timeout.max(Duration::from_millis(1))))
            .unwrap();
        let mut buf = [0u8; 4096];
        match self.sock.recv(&mut buf) {
            Ok(n) => Some(String::from_utf8_lossy(&buf[..n]).into_owned()),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                None
            }
            Err(e) => panic!("notify socket: {e}"),
        }
    }

    /// The next datagram that is not a watchdog ping, failing the test past `deadline`.
    pub fn next(&self, deadline: Duration, what: &str) -> String {
        let end = Instant::now() + deadline;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.recv(left) {
                Some(m) if m.lines().all(|l| l == "WATCHDOG=1") => continue,
                Some(m) => return m,
                None => panic!("no notification after {deadline:?} waiting for {what}"),
            }
        }
    }

    /// Every datagram already queued (none are waited for).
    pub fn drain(&self) -> Vec<String> {
        self.sock.set_nonblocking(true).unwrap();
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        while let Ok(n) = self.sock.recv(&mut buf) {
            out.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
        self.sock.set_nonblocking(false).unwrap();
        out
    }
}

/// What a finished command printed, and how it exited.
pub struct Ran {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

/// Runs one of the binaries to completion with `args` and `env` (control
/// variables not inherited), failing the test if it takes longer than `deadline`.
pub fn run(name: &str, args: &[&std::ffi::OsStr], env: &[(&str, &str)], deadline: Duration) -> Ran {
    let mut cmd = Command::new(bin(name));
    cmd.args(args);
    for var in INHERITED_CONTROL_VARS {
        cmd.env_remove(var);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = output_within(&mut cmd, deadline);
    Ran {
        status: out.status,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Writes a final-looking checkpoint at `step` for `cfg`'s model into its checkpoint dir.
pub fn write_checkpoint(cfg: &Config, step: u64) -> PathBuf {
    let mlp = dtf::model::Mlp::new(&cfg.model.layers).unwrap();
    let names: Vec<String> = mlp.variables().iter().map(|v| v.name.clone()).collect();
    let values = mlp.init(cfg.train.seed);
    let ckpt = dtf::checkpoint::Checkpoint {
        global_step: step,
        variables: names.iter().cloned().zip(values.iter().cloned()).collect(),
        shadows: names.into_iter().zip(values).collect(),
        slots: Default::default(),
        run: 0,
        shard_steps: Vec::new(),
        table_optimizers: Vec::new(),
        increment: None,
        tables: Vec::new(),
    };
    dtf::checkpoint::Saver::new(&cfg.checkpoint.dir, 5)
        .unwrap()
        .save(&ckpt)
        .unwrap()
}

/// Steps of the `model.ckpt-<step>.safetensors` files in `dir`.
pub fn checkpoint_steps(dir: &Path) -> Vec<u64> {
    let mut steps: Vec<u64> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| {
                let name = e.ok()?.file_name().into_string().ok()?;
                name.strip_prefix("model.ckpt-")?
                    .strip_suffix(".safetensors")?
                    .parse()
                    .ok()
            })
            .collect()
        })
        .unwrap_or_default();
    steps.sort();
    steps
}

/// CLOCK_MONOTONIC now, in µs (what `MONOTONIC_USEC=` is measured in).
pub fn monotonic_usec() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer to a timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000 + ts.tv_nsec as u64 / 1000
}

// ---- Added for the observability tests. ----

impl Cluster {
    /// [`Cluster::start_with_env`] for string values.
    pub fn start_env(&mut self, role: &str, index: usize, env: &[(&str, &str)]) -> &mut Child {
        let env: Vec<(&str, &std::ffi::OsStr)> = env
            .iter()
            .map(|(k, v)| (*k, std::ffi::OsStr::new(*v)))
            .collect();
        self.start_with_env(role, index, &env)
    }

    /// Runs `dtf ARGS --config <this cluster's config>` to completion
    /// (at most 5 minutes).
    pub fn dtf(&self, args: &[&str]) -> std::process::Output {
        let mut cmd = Command::new(bin("dtf"));
        cmd.args(args)
            .arg("--config")
            .arg(&self.config_path)
            .env_remove("TF_CONFIG");
        output_within(&mut cmd, Duration::from_secs(300))
    }
}

/// The body of `GET http://addr/path` (HTTP/1.1, `Connection: close`), or
/// None if nothing answers or the status is not 200.
pub fn http_get(addr: &str, path: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).ok()?;
    let text = String::from_utf8(raw).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    if !head.starts_with("HTTP/1.1 200") {
        return None;
    }
    // axum answers a small body with Content-Length; undo chunking if it did not.
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        let mut out = String::new();
        let mut rest = body;
        loop {
            let (size, after) = rest.split_once("\r\n")?;
            let n = usize::from_str_radix(size.trim(), 16).ok()?;
            if n == 0 {
                return Some(out);
            }
            out.push_str(after.get(..n)?);
            rest = after.get(n + 2..)?;
        }
    }
    Some(body.to_string())
}

/// `cmd.output()` with a deadline: the child is killed and the test fails
/// (with what it printed to stderr) if it runs longer than `deadline`.
pub fn output_within(cmd: &mut Command, deadline: Duration) -> std::process::Output {
    use std::io::Read;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let out = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = out.read_to_end(&mut v);
        v
    });
    let err = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = err.read_to_end(&mut v);
        v
    });
    let end = Instant::now() + deadline;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > end {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{cmd:?} still running after {deadline:?}; stderr:\n{}",
                String::from_utf8_lossy(&err.join().unwrap())
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    std::process::Output {
        status,
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    }
}

/// A ps's step and its values and shadows, as the bytes on the wire: equal
/// snapshots mean nothing changed, bit for bit.
pub async fn snapshot(ps: &mut PsClient) -> (u64, Vec<dtf::transport::pb::Tensor>) {
    let r = ps
        .pull(dtf::transport::pb::PullRequest {
            with_shadows: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    (r.global_step, [r.variables, r.shadows].concat())
}

/// An integration test run once per transport: `<name>::tcp` and
/// `<name>::auto` (shared memory: every ps of a test is on this host). The
/// body gets the transport as `$t`.
#[macro_export]
macro_rules! on_each_transport {
    ($(#[$m:meta])* async fn $name:ident($t:ident) $body:block) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            $(#[$m])*
            async fn run($t: dtf::config::Transport) $body
            #[tokio::test(flavor = "multi_thread")]
            async fn tcp() {
                run(dtf::config::Transport::Tcp).await
            }
            #[tokio::test(flavor = "multi_thread")]
            async fn auto() {
                run(dtf::config::Transport::Auto).await
            }
        }
    };
}

/// Makes a FIFO at `path`.
pub fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
}

/// A file of this repository, by its path from the root.
pub fn repo_file(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(rel)
}

/// `dtf ARGS` to completion, failing the test past 30 s: the tools that
/// read one file (inspect, eval, export, check-config).
pub fn dtf_quick(args: &[&std::ffi::OsStr]) -> Ran {
    run("dtf", args, &[], Duration::from_secs(30))
}

/// `dtf ARGS` to completion as [`run`] runs it, failing the test past
/// 300 s (`dtf local` trains), its output as bytes.
pub fn dtf_output(args: &[&str]) -> std::process::Output {
    let args: Vec<&std::ffi::OsStr> = args.iter().map(std::ffi::OsStr::new).collect();
    let ran = run("dtf", &args, &[], Duration::from_secs(300));
    std::process::Output {
        status: ran.status,
        stdout: ran.stdout.into_bytes(),
        stderr: ran.stderr.into_bytes(),
    }
}

/// `dtf check-config -c CONFIG`.
pub fn dtf_check(config: &Path) -> Ran {
    let args = [
        std::ffi::OsStr::new("check-config"),
        std::ffi::OsStr::new("-c"),
        config.as_os_str(),
    ];
    run("dtf", &args, &[], Duration::from_secs(10))
}

/// ps `State`, or `None` when the call fails (the ps is down or starting).
pub async fn ps_state(ps: &mut PsClient) -> Option<dtf::transport::pb::StateResponse> {
    ps.state(dtf::transport::pb::StateRequest {})
        .await
        .ok()
        .map(|r| r.into_inner())
}

/// Starts ps 0 of a one-ps cluster in `mode` and initializes it at step 7
/// (a pull before that is refused `FAILED_PRECONDITION`, checked); returns
/// the cluster, a client and the model's initial values.
pub async fn live_ps(mode: Mode) -> (Cluster, PsClient, Vec<(String, ndarray::ArrayD<f32>)>) {
    let mut c = Cluster::new(1, 2, 100, mode);
    c.start("ps", 0);
    let mut ps = c.client(0, Some(TOKEN)).await;
    let mlp = dtf::model::Mlp::new(&c.cfg.model.layers).unwrap();
    let values: Vec<(String, ndarray::ArrayD<f32>)> = mlp
        .variables()
        .into_iter()
        .map(|v| v.name)
        .zip(mlp.init(1))
        .collect();
    let err = ps
        .pull(dtf::transport::pb::PullRequest::default())
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
    let init = dtf::transport::pb::InitializeRequest {
        variables: values
            .iter()
            .map(|(n, a)| dtf::transport::proto::encode(n, a))
            .collect(),
        global_step: 7,
        ..Default::default()
    };
    assert!(ps.initialize(init).await.unwrap().into_inner().applied);
    (c, ps, values)
}

/// The `shard-<step>.safetensors` files in `dir` (a ps's snapshots, or the
/// copies its ring keeper holds), highest named step first.
pub fn shard_files(dir: &Path) -> Vec<(u64, PathBuf)> {
    let mut files: Vec<(u64, PathBuf)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let step = name.strip_prefix("shard-")?.strip_suffix(".safetensors")?;
            Some((step.parse().ok()?, e.path()))
        })
        .collect();
    files.sort_by_key(|f| std::cmp::Reverse(f.0));
    files
}

/// ps 0's step (0 while it does not answer).
pub fn global_step(c: &Cluster) -> u64 {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut ps = c.client(0, Some(TOKEN)).await;
        ps.state(dtf::transport::pb::StateRequest {})
            .await
            .map_or(0, |r| r.into_inner().global_step)
    })
}

/// Waits until ps 0 is past `step`; returns its step.
pub fn past(c: &Cluster, step: u64) -> u64 {
    until(
        Duration::from_secs(120),
        &format!("global step past {step}"),
        || {
            let s = global_step(c);
            (s > step).then_some(s)
        },
    )
}

/// The `global_step=`/`step=` of the `n`th line of `name`'s log holding
/// `needle` (waiting up to 120 s for it).
pub fn logged_step(c: &Cluster, name: &str, needle: &str, n: usize) -> u64 {
    let log = c.wait_log(name, needle, n, Duration::from_secs(120));
    let line = log
        .lines()
        .filter(|l| l.contains(needle))
        .nth(n - 1)
        .unwrap_or_default();
    line.split_whitespace()
        .find_map(|f| {
            f.strip_prefix("global_step=")
                .or_else(|| f.strip_prefix("step="))
        })
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no step in {line:?}"))
}

/// The sample `series` (`name{labels}`) in a `/metrics` text, if there.
pub fn metric_sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// `c` made a wide & deep cluster (its config not written yet): synthetic
/// CTR data in its directory (`dtf synth`: 20,000 rows, 4 Zipf(1.1) fields
/// of `cardinality` ids, a planted model), embedding tables 4 wide under
/// Adagrad, layers [16, 8, 1] (4 fields × 4, no dense column).
pub fn wide_deep_on_synth(c: &mut Cluster, cardinality: u64) {
    let data = c.dir.path().join("syn");
    let cardinality = cardinality.to_string();
    let out = dtf_output(&[
        "synth",
        "--out",
        data.to_str().unwrap(),
        "--rows",
        "20000",
        "--fields",
        "4",
        "--cardinality",
        &cardinality,
        "--exponent",
        "1.1",
    ]);
    assert!(out.status.success(), "{out:?}");
    c.cfg.model.kind = dtf::config::ModelKind::WideDeep;
    c.cfg.model.embedding_dim = 4;
    c.cfg.model.layers = vec![16, 8, 1];
    c.cfg.train.optimizer = dtf::config::OptimizerKind::Adagrad;
    c.cfg.data.format = dtf::config::DataFormat::Recbole;
    c.cfg.data.dir = data;
}
