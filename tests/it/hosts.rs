//! Hosts for tests: network namespaces that stand for machines, so a test
//! can put a ps on one "host" and workers on others and see what only real
//! hosts show (TCP between them even with `transport = "auto"`, a link that
//! goes down, a slow link). The partition, cross-host, chaos and durability
//! tests all build on it.
//!
//! ```text
//!     host 0 (netns)        host 1 (netns)   …
//!     eth0 10.231.0.1/24    eth0 10.231.0.2/24
//!        │ veth (tbf)          │ veth (tbf)
//!     ───p0────────────────────p1───  br0 in the switch netns
//! ```
//!
//! - [`Hosts::new`]`(n)` makes `n` hosts on one bridge; [`Hosts::shaped`]
//!   gives each host's link a rate (`tbf` on both ends of its veth, so both
//!   directions are shaped; the kernel has tbf, not netem). Every namespace
//!   is private to the harness, so every harness uses the same addresses,
//!   `10.231.0.(i+1)`, and tests run in parallel: only the namespace names
//!   (`dtf-<pid>-<n>-…`) are unique. Dropping it deletes them all (the
//!   veths go with them), also when the test fails.
//! - Each host has its own runtime directory (where a ps puts its
//!   shared-memory socket): [`Host::env`] sets `DTF_CLUSTER__RUNTIME_DIR`
//!   for every task started on it, as `/run/dtf` differs between real
//!   hosts. Tasks on one host still reach each other over shared memory;
//!   between hosts `transport = "auto"` finds the address is not local and
//!   takes TCP.
//! - [`Cluster::place`] rewrites a cluster's addresses onto hosts (the
//!   ports stay); [`Cluster::start_on`] starts a task on its host.
//! - [`Hosts::cut`] / [`Hosts::heal`] take a host's link down and up;
//!   [`Hosts::set_rate`] reshapes it.
//! - [`Host::run`] runs a command inside (e.g. `dtf status`);
//!   [`Host::enter`] runs a closure on a thread inside the namespace (an
//!   HTTP GET of a task's `/metrics`).
//!
//! Needs root (CI runs as root) and iproute2's `ip` and `tc`.

use crate::util::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// Harnesses made by this test process, for unique names.
static MADE: AtomicUsize = AtomicUsize::new(0);

/// The first three octets of every host's address.
const SUBNET: &str = "10.231.0";

/// One host: a network namespace with one link to the switch.
pub struct Host {
    /// The namespace's name (`ip netns`).
    pub netns: String,
    /// Its address on the bridge.
    pub addr: String,
    /// Its runtime directory (shared-memory sockets).
    pub run_dir: PathBuf,
    /// The switch's end of its link (in the switch namespace).
    port: String,
}

/// `n` hosts on one bridge, deleted on drop.
pub struct Hosts {
    /// The namespace holding the bridge.
    switch: String,
    /// The hosts, in order.
    pub hosts: Vec<Host>,
}

/// Runs `ip ARGS`, failing the test with its stderr.
fn ip(args: &[&str]) {
    sh("ip", args);
}

fn sh(cmd: &str, args: &[&str]) {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{cmd} (iproute2): {e}"));
    assert!(
        out.status.success(),
        "{cmd} {args:?} (needs root): {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Host `i`'s address (every harness uses the same: its namespaces are its own).
pub fn address(i: usize) -> String {
    format!("{SUBNET}.{}", i + 1)
}

impl Hosts {
    /// `n` hosts on one bridge, their links unshaped, their runtime
    /// directories under `dir`.
    pub fn new(n: usize, dir: &Path) -> Self {
        let id = format!(
            "dtf-{}-{}",
            std::process::id(),
            MADE.fetch_add(1, Ordering::Relaxed)
        );
        let mut hosts = Hosts {
            switch: format!("{id}-sw"),
            hosts: Vec::new(),
        };
        ip(&["netns", "add", &hosts.switch]);
        let sw = hosts.switch.clone();
        ip(&["-n", &sw, "link", "add", "br0", "type", "bridge"]);
        ip(&["-n", &sw, "link", "set", "br0", "up"]);
        for i in 0..n {
            let host = Host {
                netns: format!("{id}-h{i}"),
                addr: address(i),
                run_dir: dir.join(format!("host{i}")).join("run"),
                port: format!("p{i}"),
            };
            std::fs::create_dir_all(&host.run_dir).unwrap();
            // Pushed before it is configured, so a failure below still deletes it.
            ip(&["netns", "add", &host.netns]);
            hosts.hosts.push(host);
            let host = &hosts.hosts[i];
            ip(&[
                "link",
                "add",
                "eth0",
                "netns",
                &host.netns,
                "type",
                "veth",
                "peer",
                "name",
                &host.port,
                "netns",
                &sw,
            ]);
            ip(&["-n", &sw, "link", "set", &host.port, "master", "br0"]);
            ip(&["-n", &sw, "link", "set", &host.port, "up"]);
            let cidr = format!("{}/24", host.addr);
            ip(&["-n", &host.netns, "addr", "add", &cidr, "dev", "eth0"]);
            ip(&["-n", &host.netns, "link", "set", "eth0", "up"]);
            ip(&["-n", &host.netns, "link", "set", "lo", "up"]);
        }
        hosts
    }

    /// As [`Hosts::new`], each host's link shaped to `rates[i]` (tc's
    /// units: `"1gbit"`, `"100mbit"`; `None`: unshaped) both ways.
    pub fn shaped(rates: &[Option<&str>], dir: &Path) -> Self {
        let hosts = Self::new(rates.len(), dir);
        for (i, rate) in rates.iter().enumerate() {
            if let Some(rate) = rate {
                hosts.set_rate(i, rate);
            }
        }
        hosts
    }

    pub fn host(&self, i: usize) -> &Host {
        &self.hosts[i]
    }

    /// Shapes host `i`'s link to `rate` both ways: a `tbf` on its `eth0`
    /// (what it sends) and on the switch's port (what it receives), with a
    /// burst of 4 ms at that rate and 20 ms of queue.
    pub fn set_rate(&self, i: usize, rate: &str) {
        let h = &self.hosts[i];
        let burst = format!("{}", (bits_per_sec(rate) / 8 / 250).max(64 * 1024));
        for (ns, dev) in [(&h.netns, "eth0"), (&self.switch, h.port.as_str())] {
            sh(
                "tc",
                &[
                    "-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate, "burst",
                    &burst, "latency", "20ms",
                ],
            );
        }
    }

    /// Takes host `i`'s link back to unshaped.
    pub fn unshape(&self, i: usize) {
        let h = &self.hosts[i];
        for (ns, dev) in [(&h.netns, "eth0"), (&self.switch, h.port.as_str())] {
            sh("tc", &["-n", ns, "qdisc", "del", "dev", dev, "root"]);
        }
    }

    /// Takes host `i`'s link down: nothing reaches it or leaves it.
    pub fn cut(&self, i: usize) {
        ip(&[
            "-n",
            &self.switch,
            "link",
            "set",
            &self.hosts[i].port,
            "down",
        ]);
    }

    /// Brings host `i`'s link back.
    pub fn heal(&self, i: usize) {
        ip(&["-n", &self.switch, "link", "set", &self.hosts[i].port, "up"]);
    }
}

/// A tc rate (`"1gbit"`, `"250mbit"`, `"10kbit"`) in bits per second.
fn bits_per_sec(rate: &str) -> u64 {
    let (num, unit) = rate
        .find(|c: char| !c.is_ascii_digit())
        .map_or((rate, ""), |i| rate.split_at(i));
    let n: u64 = num.parse().unwrap_or_else(|_| panic!("rate {rate:?}"));
    n * match unit {
        "gbit" => 1_000_000_000,
        "mbit" => 1_000_000,
        "kbit" => 1_000,
        "bit" | "" => 1,
        other => panic!("rate unit {other:?}"),
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        for ns in self.hosts.iter().map(|h| &h.netns).chain([&self.switch]) {
            let _ = Command::new("ip").args(["netns", "delete", ns]).status();
        }
    }
}

impl Host {
    /// What a task on this host has in its environment.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![(
            "DTF_CLUSTER__RUNTIME_DIR",
            self.run_dir.display().to_string(),
        )]
    }

    /// Runs `cmd` inside this host, bounded by `deadline`.
    pub fn run(&self, cmd: &mut Command, deadline: Duration) -> std::process::Output {
        let mut inside = Command::new("ip");
        inside
            .args(["netns", "exec", self.netns.as_str()])
            .arg(cmd.get_program())
            .args(cmd.get_args());
        for (k, v) in self.env() {
            inside.env(k, v);
        }
        for (k, v) in cmd.get_envs() {
            match v {
                Some(v) => inside.env(k, v),
                None => inside.env_remove(k),
            };
        }
        output_within(&mut inside, deadline)
    }

    /// `f` on a thread inside this host's network namespace (its sockets
    /// are this host's), e.g. `http_get` of a task's `/metrics`.
    pub fn enter<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        use std::os::fd::AsRawFd;
        let ns = std::fs::File::open(format!("/var/run/netns/{}", self.netns)).unwrap();
        std::thread::scope(|s| {
            s.spawn(|| {
                // SAFETY: setns on this thread only, with a namespace file
                // descriptor this function holds open.
                let r = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
                assert_eq!(r, 0, "setns: {}", std::io::Error::last_os_error());
                f()
            })
            .join()
            .unwrap()
        })
    }
}

impl Cluster {
    /// Moves ps `i` onto host `ps[i]` and worker `i` onto `workers[i]`
    /// (addresses rewritten, ports kept; the config written again).
    pub fn place(&mut self, hosts: &Hosts, ps: &[usize], workers: &[usize]) {
        let moved = |addrs: &[String], on: &[usize]| -> Vec<String> {
            assert_eq!(addrs.len(), on.len(), "one host per task");
            addrs
                .iter()
                .zip(on)
                .map(|(a, &h)| {
                    let port = a.rsplit_once(':').unwrap().1;
                    format!("{}:{port}", hosts.host(h).addr)
                })
                .collect()
        };
        self.cfg.cluster.ps = moved(&self.cfg.cluster.ps, ps);
        self.cfg.cluster.worker = moved(&self.cfg.cluster.worker, workers);
        self.write_config();
    }

    /// Starts `role` task `index` on `host` (as [`Cluster::start`]), with
    /// extra environment `env`.
    pub fn start_on(&mut self, host: &Host, role: &str, index: usize, env: &[(&str, &str)]) {
        let mut all: Vec<(&str, std::ffi::OsString)> =
            host.env().into_iter().map(|(k, v)| (k, v.into())).collect();
        all.extend(env.iter().map(|(k, v)| (*k, (*v).into())));
        let env: Vec<(&str, &std::ffi::OsStr)> =
            all.iter().map(|(k, v)| (*k, v.as_os_str())).collect();
        self.start_wrapped(role, index, &env, &["ip", "netns", "exec", &host.netns]);
    }

    /// `dtf status --json` of this cluster, asked from `host`.
    pub fn status_from(&self, host: &Host) -> Option<serde_json::Value> {
        let mut cmd = Command::new(bin("dtf"));
        cmd.args(["status", "--json", "--config"])
            .arg(&self.config_path)
            .env_remove("TF_CONFIG");
        let out = host.run(&mut cmd, Duration::from_secs(30));
        serde_json::from_slice(&out.stdout).ok()
    }

    /// The global step, asked from `host` (`None`: no answer).
    pub fn step_from(&self, host: &Host) -> Option<u64> {
        self.status_from(host)?["global_step"].as_u64()
    }
}
