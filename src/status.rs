//! `dtf status`: asks every ps task of a running cluster for its `State` and
//! reads the newest checkpoint, for one table (or one JSON object).
//!
//! Workers serve no RPC: what is known of them comes from the ps tasks,
//! which record every worker's latest push (its step, examples/s, and how
//! long ago). A worker is `live` when a ps heard from it within
//! [`STALE_AFTER`], `stale` when only before, `never seen` when no ps that
//! answered ever had a push from it.

use crate::auth::Credentials;
use crate::checkpoint;
use crate::config::Config;
use crate::model::Mlp;
use crate::transport::{Cluster, Link, PsState, Via, WorkerContact};
use serde::Serialize;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};
use tonic::Code;

/// How long to wait for each ps to answer.
const TIMEOUT: Duration = Duration::from_secs(3);

/// A worker whose latest push is older than this is `stale`: a training
/// worker pushes many times a second, and a sync worker waiting for its
/// peers gives up after a minute (its wait logs say why).
pub const STALE_AFTER: Duration = Duration::from_secs(10);

/// One task of the cluster as `dtf status` sees it.
#[derive(Debug, Clone, Default, Serialize)]
pub struct TaskStatus {
    /// `ps:0`, `worker:1`.
    pub task: String,
    /// `ps`, `chief` (worker 0), `worker` or `evaluator`.
    pub role: String,
    /// Its `host:port` from `cluster`; the evaluator's: its `eval/` directory.
    pub address: String,
    /// Whether it answered; `None` for workers, which do not listen.
    pub reachable: Option<bool>,
    /// Workers: `live`, `stale` or `never seen` (see [`STALE_AFTER`]), `finished` once the
    /// run is complete; the
    /// evaluator: `scored N` or `nothing scored`.
    pub contact: Option<String>,
    /// Workers: seconds since a ps last had a push from it; the evaluator:
    /// since it last scored a checkpoint.
    pub last_contact_secs: Option<f64>,
    /// Why it did not answer.
    pub error: Option<String>,
    /// Changes on every ps start. A string in JSON: a random 64-bit id
    /// loses its low bits as a JSON number read into a double (JavaScript, jq).
    #[serde(serialize_with = "as_decimal_string")]
    pub incarnation: Option<u64>,
    /// The shard holds values.
    pub initialized: Option<bool>,
    /// The shard's step (ps 0: the global step); a worker's latest push's
    /// step; the newest step the evaluator scored.
    pub global_step: Option<u64>,
    /// Examples per second the ps saw lately; a worker's, as the ps saw them
    /// (0 once it is stale).
    pub examples_per_sec: Option<f64>,
    /// The chief declared the run complete.
    pub complete: Option<bool>,
    /// How `dtf status` reached this ps: `shm` (shared memory, same host) or `tcp`.
    pub transport: Option<String>,
    /// The ps's open shared-memory connections (tasks on its host); the rest use TCP.
    pub shm_connections: Option<u32>,
    /// How tensors cross the connection to this ps (`cluster.compression`
    /// over TCP; `none` over shared memory, which is exact), and the ps's
    /// own setting when it differs: `bf16 (ps: none)`, a mismatch its
    /// pushes and pulls refuse.
    pub compression: Option<String>,
    /// Workers: in `cluster.worker` (here and at every ps that heard from
    /// it). `false`: a worker the ps tasks refuse (a wrong task index, a
    /// host with another file, a ps that has not reloaded yet).
    pub member: Option<bool>,
    /// Workers: pushes the ps tasks refused from its index (not a member,
    /// or a second process fenced off it).
    pub refused: Option<u64>,
    /// Ps: its membership epoch (changes of `cluster.worker` it applied, from 1).
    pub membership_epoch: Option<u64>,
    /// The step of the ps's newest snapshot of its shard (`ps.snapshot_secs`).
    pub snapshot_step: Option<u64>,
    /// Seconds since that snapshot's state was taken; absent: none yet.
    pub snapshot_age_secs: Option<f64>,
    /// Snapshots the ps could not write since it started.
    pub snapshot_failures: Option<u64>,
    /// Ps: it reloaded a changed `cluster.ps` and takes no pushes until the
    /// chief's re-shard checkpoint, then starts again under the new list.
    pub resharding: Option<bool>,
    /// Ps: it started with no snapshot of its own and fetches its shard's
    /// copy from its ring neighbour before it serves.
    pub fetching: Option<bool>,
    /// Ps: started with `model.hidden`, it waits for the chief to send the
    /// model's widths before it holds a shard.
    pub needs_widths: Option<bool>,
    /// Ps: the f32 values of the variables (parts) it holds, slots and
    /// shadows excluded: how `model.partitioner` spread the model.
    pub parameters: Option<u64>,
    /// Ps, with embedding tables: the rows of each table it holds now.
    pub table_rows: Option<std::collections::BTreeMap<String, u64>>,
    /// Ps, with tables: rows of each table evicted (`model.tables`
    /// `steps_to_live`, `max_rows`) since the ps started.
    pub rows_evicted: Option<std::collections::BTreeMap<String, u64>>,
    /// Ps, with tables: gradient rows of each table refused since the ps
    /// started (an id not yet admitted, `min_count`; or no room, `max_rows`).
    pub ids_refused: Option<std::collections::BTreeMap<String, u64>>,
    /// Ps: near its cgroup's memory limit, its tables create no rows
    /// (`ps::memory`).
    pub memory_full: Option<bool>,
}

/// One count of each table of a ps that holds tables, by table name.
fn per_table(
    s: Option<&PsState>,
    count: impl Fn(&crate::transport::TableCount) -> u64,
) -> Option<std::collections::BTreeMap<String, u64>> {
    let s = s.filter(|s| !s.tables.is_empty())?;
    Some(
        s.tables
            .iter()
            .map(|t| (t.table.clone(), count(t)))
            .collect(),
    )
}

/// Serializes a 64-bit id as its decimal string (`null` when absent).
fn as_decimal_string<S: serde::Serializer>(id: &Option<u64>, s: S) -> Result<S::Ok, S::Error> {
    match id {
        Some(id) => s.collect_str(id),
        None => s.serialize_none(),
    }
}

/// The newest checkpoint in `checkpoint.dir`, when that is readable from here.
#[derive(Debug, Clone, Serialize)]
pub struct CheckpointStatus {
    /// The model file.
    pub path: PathBuf,
    /// Its global step.
    pub global_step: Option<u64>,
    /// Seconds since it was written.
    pub age_secs: Option<f64>,
}

/// What `dtf status` reports.
#[derive(Debug, Clone, Serialize)]
pub struct Status {
    /// Every ps, then every worker, then the evaluator when one has run.
    pub tasks: Vec<TaskStatus>,
    /// The global step (ps 0's), if it answered.
    pub global_step: Option<u64>,
    /// `train.last_step`.
    pub last_step: u64,
    /// Any ps says the run is complete, or the newest checkpoint is at `last_step`.
    pub complete: bool,
    /// The newest checkpoint, if `checkpoint.dir` is readable here.
    pub checkpoint: Option<CheckpointStatus>,
    /// Why there is no checkpoint to show.
    pub checkpoint_error: Option<String>,
    /// Every ps answered.
    pub all_ps_reachable: bool,
}

/// Why a ps did not answer, said plainly when the two ends disagree about TLS.
async fn explain(addr: &str, credentials: &Credentials, status: tonic::Status) -> String {
    let status = crate::auth::explain_tls_mismatch(status);
    // A TLS ps breaks a plaintext connection in one of several ways; ask it.
    let broken = matches!(
        status.code(),
        Code::Cancelled | Code::Unknown | Code::Internal
    );
    if broken && !credentials.tls() && crate::auth::answers_with_tls(addr).await {
        return format!(
            "{} (the ps answers with TLS, which is not set here; {})",
            crate::transport::proto::explain(&status),
            crate::auth::TLS_ADVICE
        );
    }
    crate::transport::proto::explain(&status)
}

/// Every ps's `State` (or why not) and the transport it was asked over.
async fn ask_all(
    config: &Config,
    credentials: &Credentials,
) -> Vec<(Result<PsState, String>, Option<Link>)> {
    // The placement names each shard's variables, which a shared-memory
    // connection checks; a model that does not build leaves TCP alone.
    let specs = Mlp::new(&config.model.layers)
        .map(|m| m.variables())
        .unwrap_or_default();
    let cluster = match Cluster::with_timeout(config, specs, credentials, TIMEOUT) {
        Ok(c) => c,
        Err(e) => {
            return config
                .cluster
                .ps
                .iter()
                .map(|_| (Err(e.to_string()), None))
                .collect();
        }
    };
    let answers = cluster.each_state().await;
    let via = cluster.links();
    let mut out = Vec::new();
    for ((addr, answer), via) in config.cluster.ps.iter().zip(answers).zip(via) {
        match answer {
            Ok(s) => out.push((Ok(s), Some(via))),
            Err(status) => out.push((Err(explain(addr, credentials, status).await), Some(via))),
        }
    }
    out
}

/// Asks every ps in `config` (with the cluster's `credentials`) and reads the newest checkpoint.
pub async fn query(config: &Config, credentials: &Credentials) -> Status {
    let answers = ask_all(config, credentials).await;
    let mut tasks = Vec::new();
    // What every ps that answered knows of the workers.
    let mut heard: Vec<WorkerContact> = Vec::new();
    for (i, (addr, (answer, via))) in config.cluster.ps.iter().zip(answers).enumerate() {
        let s = answer.as_ref().ok();
        heard.extend(s.iter().flat_map(|s| s.workers.iter().cloned()));
        tasks.push(TaskStatus {
            task: format!("ps:{i}"),
            role: "ps".into(),
            address: addr.clone(),
            reachable: Some(s.is_some()),
            error: answer.as_ref().err().cloned(),
            incarnation: s.map(|s| s.incarnation),
            initialized: s.map(|s| s.initialized),
            global_step: s.map(|s| s.global_step),
            examples_per_sec: s.map(|s| s.examples_per_sec),
            complete: s.map(|s| s.complete),
            transport: via.as_ref().map(|v| v.via.to_string()),
            shm_connections: s.map(|s| s.shm_connections),
            compression: via.as_ref().map(|l| match s {
                Some(s) if l.via == Via::Tcp && s.compression != l.compression => {
                    format!("{} (ps: {})", l.compression, s.compression)
                }
                _ => l.compression.to_owned(),
            }),
            membership_epoch: s.map(|s| s.membership_epoch),
            snapshot_step: s
                .filter(|s| s.snapshot_age_seconds >= 0.0)
                .map(|s| s.snapshot_step),
            snapshot_age_secs: s
                .filter(|s| s.snapshot_age_seconds >= 0.0)
                .map(|s| s.snapshot_age_seconds),
            snapshot_failures: s.map(|s| s.snapshot_failures),
            resharding: s.map(|s| s.resharding),
            fetching: s.map(|s| s.fetching),
            needs_widths: s.map(|s| s.needs_widths),
            parameters: s.map(|s| s.parameters),
            table_rows: per_table(s, |t| t.rows),
            rows_evicted: per_table(s, |t| t.evicted),
            ids_refused: per_table(s, |t| t.refused),
            memory_full: s.map(|s| s.memory_full),
            ..Default::default()
        });
    }
    let listed = config.cluster.worker.len();
    for (i, addr) in config.cluster.worker.iter().enumerate() {
        tasks.push(worker_status(i, addr, listed, &heard));
    }
    // Every worker a ps heard from that is not in this file's list.
    let mut strangers: Vec<usize> = heard
        .iter()
        .map(|c| c.task as usize)
        .filter(|&i| i >= listed)
        .collect();
    strangers.sort_unstable();
    strangers.dedup();
    for i in strangers {
        tasks.push(worker_status(i, "-", listed, &heard));
    }
    tasks.extend(evaluator_status(config));
    let (checkpoint, checkpoint_error) = match newest_checkpoint(config) {
        Ok(c) => (Some(c), None),
        Err(e) => (None, Some(e)),
    };
    let global_step = tasks.first().and_then(|t| t.global_step);
    let all_ps_reachable = tasks
        .iter()
        .filter(|t| t.role == "ps")
        .all(|t| t.reachable == Some(true));
    let complete = tasks.iter().any(|t| t.complete == Some(true))
        || checkpoint
            .as_ref()
            .and_then(|c| c.global_step)
            .is_some_and(|s| s >= config.train.last_step);
    if complete {
        at_the_end(&mut tasks);
    }
    Status {
        tasks,
        global_step,
        last_step: config.train.last_step,
        complete,
        checkpoint,
        checkpoint_error,
        all_ps_reachable,
    }
}

/// After the end of the run nothing trains: a worker the ps tasks heard from has finished
/// (its last push was the run's end, not a sign of life), and every rate is 0 — a ps's
/// window would otherwise go on showing the last seconds' examples/s.
fn at_the_end(tasks: &mut [TaskStatus]) {
    for t in tasks.iter_mut().filter(|t| t.role != "evaluator") {
        if t.examples_per_sec.is_some() {
            t.examples_per_sec = Some(0.0);
        }
        if matches!(t.contact.as_deref(), Some("live" | "stale")) {
            t.contact = Some("finished".into());
        }
    }
}

/// Worker `index` at `addr` (`listed` workers in this file), from what the
/// ps tasks heard: the freshest contact any ps had, and the step and rate
/// it reported; a member when listed here and by every ps that heard it.
fn worker_status(index: usize, addr: &str, listed: usize, heard: &[WorkerContact]) -> TaskStatus {
    let mine = || heard.iter().filter(|c| c.task as usize == index);
    let latest = mine().min_by_key(|c| c.since);
    TaskStatus {
        task: format!("worker:{index}"),
        role: if index == 0 { "chief" } else { "worker" }.into(),
        address: addr.to_owned(),
        contact: Some(
            match latest {
                None => "never seen",
                Some(c) if c.since > STALE_AFTER => "stale",
                Some(_) => "live",
            }
            .into(),
        ),
        last_contact_secs: latest.map(|c| c.since.as_secs_f64()),
        global_step: latest.map(|c| c.step),
        // A worker not heard from lately computes nothing the cluster sees:
        // its last rate would read as if it still trained.
        examples_per_sec: latest.map(|c| {
            if c.since > STALE_AFTER {
                0.0
            } else {
                c.examples_per_sec
            }
        }),
        member: Some(index < listed && mine().all(|c| c.member)),
        refused: Some(mine().map(|c| c.refused).sum()),
        ..Default::default()
    }
}

/// The evaluator, when one has run on `checkpoint.dir` (its ledger in
/// `eval/` exists): the newest step it scored and how long ago. It serves
/// no RPC; what it has done is in its files.
fn evaluator_status(config: &Config) -> Option<TaskStatus> {
    use crate::evaluator::{EVAL_DIR, LEDGER};
    let dir = config.checkpoint.dir.join(EVAL_DIR);
    if !dir.is_dir() {
        return None;
    }
    let ledger = dir.join(LEDGER);
    let (scored, error) = match crate::evaluator::read_ledger(&ledger) {
        Ok(scored) => (scored, None),
        Err(e) => (Default::default(), Some(e.to_string())),
    };
    let ago = std::fs::metadata(&ledger)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| SystemTime::now().duration_since(t).ok())
        .map(|d| d.as_secs_f64());
    let newest = scored.keys().next_back().copied();
    Some(TaskStatus {
        task: "evaluator:0".into(),
        role: "evaluator".into(),
        address: dir.display().to_string(),
        contact: Some(match newest {
            Some(_) => format!("scored {}", scored.len()),
            None => "nothing scored".into(),
        }),
        last_contact_secs: newest.and(ago),
        global_step: newest,
        error,
        ..Default::default()
    })
}

fn newest_checkpoint(config: &Config) -> Result<CheckpointStatus, String> {
    let path = checkpoint::resolve(&config.checkpoint.dir).map_err(|e| e.to_string())?;
    let global_step = path
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(checkpoint::parse_model_name);
    let age_secs = std::fs::metadata(&path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| SystemTime::now().duration_since(t).ok())
        .map(|d| d.as_secs_f64());
    Ok(CheckpointStatus {
        path,
        global_step,
        age_secs,
    })
}

fn opt<T: ToString>(v: &Option<T>) -> String {
    v.as_ref().map_or_else(|| "-".into(), T::to_string)
}

impl Status {
    /// Whether `dtf status` exits 0: every ps answered, or the run is
    /// complete (its ps tasks exit once it is: none answering then is the
    /// normal end, not an alarm).
    pub fn ok(&self) -> bool {
        self.all_ps_reachable || self.complete
    }

    /// The human table.
    pub fn table(&self) -> String {
        let mut rows = vec![
            [
                "TASK",
                "ROLE",
                "ADDRESS",
                "REACHABLE/SEEN",
                "INCARNATION",
                "INIT",
                "STEP",
                "EXAMPLES/S",
                "COMPLETE",
                "TRANSPORT",
                "COMPRESSION",
                "SNAPSHOT",
            ]
            .map(String::from)
            .to_vec(),
        ];
        rows.extend(self.tasks.iter().map(row));
        let mut out = grid(&rows);
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "global step   {} of {}",
            opt(&self.global_step),
            self.last_step
        );
        let _ = writeln!(
            out,
            "run complete  {}",
            if self.complete { "yes" } else { "no" }
        );
        match (&self.checkpoint, &self.checkpoint_error) {
            (Some(c), _) => {
                let age = c
                    .age_secs
                    .map_or_else(|| "?".into(), |a| format!("{a:.0} s ago"));
                let _ = writeln!(
                    out,
                    "checkpoint    {} (step {}, {age})",
                    c.path.display(),
                    opt(&c.global_step)
                );
            }
            (None, Some(e)) => {
                let _ = writeln!(out, "checkpoint    - ({e})");
            }
            (None, None) => {}
        }
        let resharding: Vec<&str> = self
            .tasks
            .iter()
            .filter(|t| t.resharding == Some(true))
            .map(|t| t.task.as_str())
            .collect();
        if !resharding.is_empty() {
            let _ = writeln!(
                out,
                "re-sharding   {} (cluster.ps changed: the chief checkpoints, then every task \
                 starts again under the new list)",
                resharding.join(", ")
            );
        }
        for t in self.tasks.iter().filter(|t| t.error.is_some()) {
            let what = if t.role == "evaluator" {
                "unreadable"
            } else if self.complete {
                "not running (the run is complete)"
            } else {
                "unreachable"
            };
            let _ = writeln!(out, "{} ({}) {what}: {}", t.task, t.address, opt(&t.error));
        }
        out
    }
}

/// One task's row of the table.
fn row(t: &TaskStatus) -> Vec<String> {
    vec![
        t.task.clone(),
        t.role.clone(),
        t.address.clone(),
        {
            let seen = match (t.reachable, &t.contact, t.last_contact_secs) {
                (Some(true), ..) if t.resharding == Some(true) => "yes, RE-SHARDING".into(),
                (Some(true), ..) if t.fetching == Some(true) => {
                    "yes, FETCHING ITS SHARD FROM ITS NEIGHBOUR".into()
                }
                (Some(true), ..) if t.needs_widths == Some(true) => {
                    "yes, WAITING FOR THE CHIEF'S MODEL WIDTHS".into()
                }
                (Some(true), ..) if t.memory_full == Some(true) => {
                    "yes, MEMORY FULL: NO NEW TABLE ROWS".into()
                }
                (Some(true), ..) => "yes".into(),
                (Some(false), ..) => "NO".into(),
                (None, Some(c), Some(ago)) => format!("{c} ({ago:.1} s ago)"),
                (None, Some(c), None) => c.clone(),
                (None, None, _) => "-".into(),
            };
            match (t.member, t.refused) {
                (Some(false), Some(n)) => format!("NOT A MEMBER, {n} pushes refused; {seen}"),
                (Some(false), None) => format!("NOT A MEMBER; {seen}"),
                _ => seen,
            }
        },
        t.incarnation
            .map_or_else(|| "-".into(), |i| format!("{i:016x}")),
        opt(&t.initialized),
        opt(&t.global_step),
        t.examples_per_sec
            .map_or_else(|| "-".into(), |r| format!("{r:.0}")),
        opt(&t.complete),
        match (&t.transport, t.shm_connections) {
            (Some(via), Some(n)) => format!("{via} (ps has {n} shm)"),
            (via, _) => opt(via),
        },
        opt(&t.compression),
        match (t.snapshot_step, t.snapshot_age_secs, t.snapshot_failures) {
            (Some(step), Some(age), f) => {
                let failed = f
                    .filter(|&f| f > 0)
                    .map_or_else(String::new, |f| format!(", {f} failed"));
                format!("step {step}, {age:.1} s ago{failed}")
            }
            (_, _, Some(f)) if f > 0 => format!("none ({f} failed)"),
            (_, _, Some(_)) => "none".into(),
            _ => "-".into(),
        },
    ]
}

/// `rows` as left-aligned columns two spaces apart.
fn grid(rows: &[Vec<String>]) -> String {
    let widths: Vec<usize> = (0..rows[0].len())
        .map(|c| rows.iter().map(|r| r[c].len()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for r in rows {
        let line: Vec<String> = r
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        let _ = writeln!(out, "{}", line.join("  ").trim_end());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn unreachable_ps_and_missing_checkpoints_are_reported_not_errors() {
        let dir = tempfile::tempdir().unwrap();
        let free = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .to_string();
        let mut cfg = Config::default();
        cfg.cluster.ps = vec![free.clone()];
        cfg.cluster.worker = vec!["127.0.0.1:1".into(), "127.0.0.1:2".into()];
        cfg.checkpoint.dir = dir.path().join("none");
        let s = query(&cfg, &Credentials::plaintext("token-0123456789abcdef")).await;
        assert!(!s.all_ps_reachable);
        assert_eq!(s.tasks.len(), 3);
        assert_eq!(s.tasks[1].role, "chief");
        assert!(s.checkpoint.is_none() && s.checkpoint_error.is_some());
        let table = s.table();
        assert!(
            table.contains("ps:0") && table.contains("NO") && table.contains("worker:1"),
            "{table}"
        );
        assert_eq!(s.tasks[1].contact.as_deref(), Some("never seen"));
    }

    #[test]
    fn a_worker_is_live_stale_or_never_seen_by_its_freshest_contact() {
        let contact = |task, step, seconds_ago| WorkerContact {
            task,
            step,
            since: Duration::from_secs_f64(seconds_ago),
            examples_per_sec: 500.0,
            member: true,
            ..Default::default()
        };
        // Two ps tasks heard worker 0; the freshest contact counts.
        let heard = [
            contact(0, 90, 30.0),
            contact(0, 120, 0.2),
            contact(1, 7, 60.0),
        ];
        let w0 = worker_status(0, "h:1", 3, &heard);
        assert_eq!(
            (w0.contact.as_deref(), w0.global_step, w0.role.as_str()),
            (Some("live"), Some(120), "chief")
        );
        let w1 = worker_status(1, "h:2", 3, &heard);
        assert_eq!(
            (w1.contact.as_deref(), w1.global_step, w1.examples_per_sec),
            (Some("stale"), Some(7), Some(0.0))
        );
        assert_eq!(w0.examples_per_sec, Some(500.0));
        let w2 = worker_status(2, "h:3", 3, &heard);
        assert_eq!(
            (w2.contact.as_deref(), w2.global_step),
            (Some("never seen"), None)
        );
        assert_eq!(w2.member, Some(true));
        // Heard from, but not in the list: flagged, with its refusals.
        let stranger = WorkerContact {
            refused: 4,
            member: false,
            ..contact(5, 3, 0.5)
        };
        let w5 = worker_status(5, "-", 3, &[stranger]);
        assert_eq!((w5.member, w5.refused), (Some(false), Some(4)));
        let line = row(&w5).join(" ");
        assert!(line.contains("NOT A MEMBER, 4 pushes refused"), "{line}");
    }

    /// Once the run is complete, workers the ps heard from a moment ago read `finished`, not
    /// `live`, and no task shows a rate (the ps's window still held the last seconds').
    #[test]
    fn after_the_end_workers_are_finished_and_rates_are_zero() {
        let contact = |task, since: f64| WorkerContact {
            task,
            step: 20000,
            since: Duration::from_secs_f64(since),
            examples_per_sec: 9000.0,
            member: true,
            ..Default::default()
        };
        let heard = [contact(0, 1.8), contact(1, 30.0)];
        let mut tasks = vec![
            TaskStatus {
                task: "ps:0".into(),
                role: "ps".into(),
                reachable: Some(true),
                examples_per_sec: Some(19135.0),
                complete: Some(true),
                ..Default::default()
            },
            worker_status(0, "h:1", 3, &heard),
            worker_status(1, "h:2", 3, &heard),
            worker_status(2, "h:3", 3, &heard),
        ];
        assert_eq!(tasks[1].contact.as_deref(), Some("live"));
        at_the_end(&mut tasks);
        let contacts: Vec<_> = tasks.iter().map(|t| t.contact.as_deref()).collect();
        assert_eq!(
            contacts,
            [None, Some("finished"), Some("finished"), Some("never seen")]
        );
        let rates: Vec<_> = tasks.iter().map(|t| t.examples_per_sec).collect();
        assert_eq!(rates, [Some(0.0), Some(0.0), Some(0.0), None]);
        assert!(row(&tasks[1]).join(" ").contains("finished (1.8 s ago)"));
    }
}
