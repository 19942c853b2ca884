//! One seed's run: a real cluster (`util::Cluster`, processes on
//! 127.0.0.1, or each on a host of its own: `hosts::Hosts`, network
//! namespaces on a bridge) with its checkpoint directory on a small tmpfs, the plan's
//! faults injected on schedule, a stand-in for systemd restarting what
//! fails (`Restart=on-failure`, `RestartSec=1`, never after 78), a poller
//! recording `dtf status --json` and every task's `/metrics`, and at the
//! end the checkpoints verified, leftovers looked for, and the final EMA
//! accuracy compared with a fault-free run of the same steps.

use super::checker::{self, Expect, Violation};
use super::history::{Event, Recorder, What};
use super::nemesis::{Bound, Edit, Nemesis, Task};
use super::schedule::{Plan, When};
use crate::hardening::Tmpfs;
use crate::hosts::{Host, Hosts};
use crate::util::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The checkpoint directory's tmpfs: room for the tiny model's checkpoints,
/// the evaluator's events and `best/`, filled in a moment.
const DISK_BYTES: usize = 8 << 20;

/// systemd's `RestartSec=` in the shipped units.
const RESTART_SEC: Duration = Duration::from_secs(1);

/// How often the poller asks `dtf status` and scrapes `/metrics`.
const POLL: Duration = Duration::from_millis(400);

/// What a seed's run gives back.
pub struct Outcome {
    /// The history recorded.
    pub events: Vec<Event>,
    /// What the checker found wrong.
    pub violations: Vec<Violation>,
    /// Faults injected, by kind.
    pub injected: BTreeMap<&'static str, usize>,
    /// Faults not injected: their victim not running then (exited at the
    /// end of the run, or already down), or a far `last_step` edit after
    /// the harness set the end.
    pub skipped: usize,
    /// How long the seed took, reference run included.
    pub wall: Duration,
}

impl Outcome {
    /// How many times the chief restored shards from a checkpoint.
    pub fn restores(&self) -> usize {
        self.events
            .iter()
            .filter(|e| matches!(e.what, What::Restored { .. }))
            .count()
    }

    /// `train.last_step` at the end.
    pub fn last_step(&self) -> u64 {
        self.events
            .iter()
            .find_map(|e| match e.what {
                What::Done { last_step, .. } => Some(last_step),
                _ => None,
            })
            .unwrap_or(0)
    }

    /// The violations with the history around each, and the replay command.
    pub fn report(&self, plan: &Plan) -> String {
        format!(
            "{plan}{}",
            checker::report(&self.events, &self.violations, &replay(plan))
        )
    }
}

/// The command that runs `plan`'s seed again.
pub fn replay(plan: &Plan) -> String {
    format!(
        "scripts/chaos.sh --seed {} --seconds {}",
        plan.seed, plan.seconds
    )
}

/// Why a task's process ended, as far as the harness knows.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Cause {
    /// SIGKILL; started again by a queued action.
    Killed,
    /// SIGTERM of a restart; started again once it exited.
    Terminated,
}

/// The harness's view of one task.
#[derive(Debug, Default)]
struct TaskState {
    /// A process is running (or stopped).
    running: bool,
    /// Counts starts, so an action queued for one process skips the next.
    generation: u64,
    /// The harness signalled it and expects it to exit.
    cause: Option<Cause>,
    /// SIGSTOPped (when) and not yet continued.
    paused: Option<Instant>,
    /// It exited 0 (or 78): systemd would not start it again.
    finished: bool,
    /// A start is queued.
    start_queued: bool,
}

/// Something the harness does later.
#[derive(Debug, Clone)]
enum Action {
    /// Start the task (unless it is running).
    Start(Task),
    /// SIGCONT, if the same process is still there.
    Cont(Task, u64),
    /// Delete the filler: the disk has room again.
    FreeDisk(PathBuf),
    /// Write the valid config back.
    RestoreConfig,
    /// Bring a host's link back up.
    Reconnect(usize),
    /// Take a host's link back to full speed.
    Unshape(usize),
    /// The kill of a fault on a ps's state that was prepared earlier
    /// ([`Nemesis::StaleState`], [`Nemesis::Drift`]); what it prepared is
    /// undone or completed (a `Tamper`) once the process is reaped.
    Strike(Nemesis),
    /// Something done to a killed ps's state directory once its process
    /// has been reaped, before it starts again.
    Tamper(Tamper),
}

/// What is done to a killed ps's state directory while it is down.
#[derive(Debug, Clone)]
enum Tamper {
    /// The directory replaced by this older copy of it.
    Replace(usize, PathBuf),
    /// The older snapshot file renamed past the newest, in the directory
    /// and in each `replica-ps-*` in it.
    Rename(usize),
    /// The directory writable again.
    Writable(usize),
}

/// A plan's hosts: each task on its own, and one more the harness observes
/// from (`dtf status`), never cut off.
struct Net {
    hosts: Hosts,
    /// Each task's host.
    of: BTreeMap<Task, usize>,
}

impl Net {
    fn observer(&self) -> &Host {
        self.hosts.hosts.last().expect("the observer's host")
    }
}

struct Driver {
    c: Cluster,
    /// The tmpfs over `checkpoint.dir` (unmounted on drop, after the processes are gone).
    disk: Option<Tmpfs>,
    /// The hosts, when the plan runs on hosts (deleted on drop, after the processes).
    net: Option<Arc<Net>>,
    rec: Recorder,
    /// Each task's `/metrics` address.
    metrics: BTreeMap<Task, String>,
    tasks: BTreeMap<Task, TaskState>,
    /// Queued actions and when they are due.
    queue: Vec<(Instant, Action)>,
    /// An invalid config is in place (no task may start meanwhile).
    invalid: bool,
    /// The harness has set the run's end (`train.last_step` just ahead).
    ended: bool,
    injected: BTreeMap<&'static str, usize>,
    skipped: usize,
    /// The ps whose state directory is immutable (a `drift`'s window), and
    /// since when: their snapshots fail (cleared on drop, or the run's
    /// directory could not be deleted).
    writes_fail: BTreeMap<usize, Instant>,
    /// Counts the state directories copied aside, for their names.
    copies: usize,
    /// Each ps's state directory copied aside by a `stale-state` to come.
    aside: BTreeMap<usize, PathBuf>,
}

impl Drop for Driver {
    fn drop(&mut self) {
        for ps in std::mem::take(&mut self.writes_fail).into_keys() {
            let _ = set_immutable(&self.state_dir(ps), false);
        }
        for (_, child) in &mut self.c.procs {
            // SIGCONT first: a stopped process dies of SIGKILL anyway, but be plain.
            // SAFETY: a pid this harness spawned and has not reaped.
            unsafe { libc::kill(child.id() as i32, libc::SIGCONT) };
            let _ = child.kill();
            let _ = child.wait();
        }
        self.disk.take();
    }
}

impl Driver {
    fn name(task: Task) -> String {
        task.to_string()
    }

    fn start(&mut self, task: Task) {
        let (role, index) = task.role_index();
        let addr = self.metrics[&task].clone();
        let env = [("DTF_METRICS__LISTEN", addr.as_str())];
        match &self.net {
            Some(net) => {
                let host = net.hosts.host(net.of[&task]);
                self.c.start_on(host, role, index, &env);
            }
            None => {
                self.c.start_env(role, index, &env);
            }
        }
        let st = self.tasks.entry(task).or_default();
        st.running = true;
        st.generation += 1;
        st.cause = None;
        st.paused = None;
        st.start_queued = false;
        self.rec.record(What::Start { task });
    }

    fn queue_start(&mut self, task: Task, after: Duration) {
        let st = self.tasks.entry(task).or_default();
        st.start_queued = true;
        self.queue
            .push((Instant::now() + after, Action::Start(task)));
    }

    fn signal(&mut self, task: Task, sig: i32) {
        self.c.signal(&Self::name(task), sig);
    }

    /// Records every exit and does what systemd would.
    fn reap(&mut self) {
        let tasks: Vec<Task> = self.tasks.keys().copied().collect();
        for task in tasks {
            if !self.tasks[&task].running {
                continue;
            }
            let Some(status) = self.c.child(&Self::name(task)).try_wait().unwrap() else {
                continue;
            };
            use std::os::unix::process::ExitStatusExt;
            let st = self.tasks.get_mut(&task).unwrap();
            st.running = false;
            st.paused = None;
            let cause = st.cause.take();
            self.rec.record(What::Exit {
                task,
                code: status.code(),
                signal: status.signal(),
                by_harness: cause.is_some(),
            });
            match cause {
                // Its start is already queued.
                Some(Cause::Killed) => {}
                Some(Cause::Terminated) => self.queue_start(task, Duration::ZERO),
                None => match status.code() {
                    Some(0) | Some(78) => self.tasks.get_mut(&task).unwrap().finished = true,
                    _ => self.queue_start(task, RESTART_SEC),
                },
            }
        }
    }

    /// Injects `nemesis`; false if its victim was not there to hit.
    fn inject(&mut self, nemesis: Nemesis) -> bool {
        let running = |d: &Self, t: Task| d.tasks.get(&t).is_some_and(|s| s.running);
        match nemesis {
            Nemesis::Kill { task, down } => {
                if !running(self, task) {
                    return false;
                }
                self.fault(nemesis);
                self.tasks.get_mut(&task).unwrap().cause = Some(Cause::Killed);
                self.signal(task, libc::SIGKILL);
                self.queue_start(task, down);
            }
            Nemesis::Pause { task, duration } => {
                let st = self.tasks.get(&task);
                if !st.is_some_and(|s| s.running && s.paused.is_none()) {
                    return false;
                }
                self.fault(nemesis);
                self.signal(task, libc::SIGSTOP);
                let st = self.tasks.get_mut(&task).unwrap();
                st.paused = Some(Instant::now());
                let g = st.generation;
                self.queue
                    .push((Instant::now() + duration, Action::Cont(task, g)));
            }
            Nemesis::Restart { task } => {
                if !running(self, task) || self.tasks[&task].cause.is_some() {
                    return false;
                }
                self.fault(nemesis);
                self.tasks.get_mut(&task).unwrap().cause = Some(Cause::Terminated);
                self.signal(task, libc::SIGTERM);
            }
            Nemesis::DiskFull { duration } => {
                let Some(disk) = &self.disk else { return false };
                if self
                    .queue
                    .iter()
                    .any(|(_, a)| matches!(a, Action::FreeDisk(_)))
                {
                    return false;
                }
                let filler = disk.fill();
                self.fault(nemesis);
                self.queue
                    .push((Instant::now() + duration, Action::FreeDisk(filler)));
            }
            Nemesis::Edit(edit) => {
                // Moving last_step far ahead after the harness set the end
                // would undo the end: the run would rightly never finish.
                let undoes_end = self.ended && matches!(edit, Edit::LastStepFarAhead(_));
                if self.invalid || undoes_end {
                    return false;
                }
                self.fault(nemesis);
                let cfg = &mut self.c.cfg;
                match edit {
                    Edit::LearningRate(lr) => cfg.train.learning_rate = lr,
                    Edit::SaveSecs(n) => {
                        cfg.checkpoint.save_secs = Some(n);
                        cfg.checkpoint.save_steps = 0;
                    }
                    Edit::SaveSteps(n) => {
                        cfg.checkpoint.save_secs = None;
                        cfg.checkpoint.save_steps = n;
                    }
                    Edit::LastStepFarAhead(n) => cfg.train.last_step = FAR + n,
                    Edit::Invalid { duration } => {
                        let bad: String = cfg
                            .to_toml()
                            .lines()
                            .map(|l| match l.starts_with("learning_rate = ") {
                                true => "learning_rate = -1.0\n".to_string(),
                                false => format!("{l}\n"),
                            })
                            .collect();
                        assert!(
                            bad.contains("learning_rate = -1.0"),
                            "no learning_rate in\n{bad}"
                        );
                        write_by_rename(&self.c.config_path, &bad);
                        self.invalid = true;
                        self.queue
                            .push((Instant::now() + duration, Action::RestoreConfig));
                        return true;
                    }
                }
                self.c.write_config_by_rename();
            }
            Nemesis::Partition { task, duration } | Nemesis::SlowLink { task, duration, .. } => {
                let Some(net) = self.net.clone() else {
                    panic!("{nemesis}: a network fault in a plan not on hosts")
                };
                let host = net.of[&task];
                // One network fault per host at a time.
                if self.network_fault_on(host) {
                    return false;
                }
                self.fault(nemesis);
                let heal = match nemesis {
                    Nemesis::SlowLink { kbit, .. } => {
                        net.hosts.set_rate(host, &format!("{kbit}kbit"));
                        Action::Unshape(host)
                    }
                    _ => {
                        net.hosts.cut(host);
                        Action::Reconnect(host)
                    }
                };
                self.queue.push((Instant::now() + duration, heal));
            }
            Nemesis::StaleState { ps, after, .. } => {
                let task = Task::Ps(ps);
                if !self.can_kill(task) || self.striking(ps) {
                    return false;
                }
                let dir = self.state_dir(ps);
                self.copies += 1;
                let aside = self
                    .c
                    .dir
                    .path()
                    .join(format!("stale-ps-{ps}-{}", self.copies));
                if let Err(e) = copy_tree(&dir, &aside) {
                    eprintln!(
                        "chaos: {nemesis} skipped: cannot copy {}: {e}",
                        dir.display()
                    );
                    let _ = std::fs::remove_dir_all(&aside);
                    return false;
                }
                self.rec.record(What::Prepare {
                    text: format!(
                        "{task}'s state directory copied aside: {}",
                        describe_state(&aside)
                    ),
                });
                self.aside.insert(ps, aside);
                self.queue
                    .push((Instant::now() + after, Action::Strike(nemesis)));
            }
            Nemesis::RenamedSnapshot { ps, down } => {
                let task = Task::Ps(ps);
                if !self.can_kill(task) || self.striking(ps) {
                    return false;
                }
                self.kill_for(nemesis, Tamper::Rename(ps), down);
            }
            Nemesis::Drift { ps, window, .. } => {
                let task = Task::Ps(ps);
                if !self.can_kill(task) || self.striking(ps) {
                    return false;
                }
                let dir = self.state_dir(ps);
                if let Err(e) = set_immutable(&dir, true) {
                    eprintln!(
                        "chaos: {nemesis} skipped: cannot make {} immutable: {e}",
                        dir.display()
                    );
                    return false;
                }
                self.writes_fail.insert(ps, Instant::now());
                self.rec.record(What::Prepare {
                    text: format!(
                        "{task}'s state directory immutable (chattr +i): its snapshot writes fail for {:.1}s",
                        window.as_secs_f64()
                    ),
                });
                self.queue
                    .push((Instant::now() + window, Action::Strike(nemesis)));
            }
        }
        true
    }

    /// `task` runs, and no signal of the harness is on its way to it.
    fn can_kill(&self, task: Task) -> bool {
        self.tasks
            .get(&task)
            .is_some_and(|s| s.running && s.cause.is_none() && !s.start_queued)
    }

    /// A fault on ps `ps`'s state is prepared or under way.
    fn striking(&self, ps: usize) -> bool {
        self.queue.iter().any(|(_, a)| match a {
            Action::Strike(n) => n.kills() == Some(Task::Ps(ps)),
            Action::Tamper(Tamper::Replace(p, _) | Tamper::Rename(p) | Tamper::Writable(p)) => {
                *p == ps
            }
            _ => false,
        })
    }

    /// `<ps.snapshot_dir>/ps-<ps>`.
    fn state_dir(&self, ps: usize) -> PathBuf {
        Path::new(&self.c.cfg.ps.snapshot_dir).join(format!("ps-{ps}"))
    }

    /// SIGKILLs the task of `nemesis` (recording the fault), `tamper` done
    /// to its state once it is reaped, and starts it `down` later.
    fn kill_for(&mut self, nemesis: Nemesis, tamper: Tamper, down: Duration) {
        let task = nemesis.kills().expect("a fault that kills");
        self.fault(nemesis);
        self.tasks.get_mut(&task).unwrap().cause = Some(Cause::Killed);
        self.signal(task, libc::SIGKILL);
        self.queue.push((Instant::now(), Action::Tamper(tamper)));
        self.queue_start(task, down);
    }

    /// The kill of a fault prepared earlier, and what it prepared put in
    /// place or undone once the process is reaped (the copy put back, the
    /// directory writable again). If the ps is not there to kill (it exited
    /// at the end of the run, or another fault has it down), the fault is
    /// skipped and its preparation undone at once. (A `drift`'s kill can
    /// come after its window, late after an invalid config: its bound is
    /// counted from when its writes began to fail, [`Driver::fault`].)
    fn strike(&mut self, nemesis: Nemesis) {
        let (ps, down, tamper) = match nemesis {
            Nemesis::StaleState { ps, down, .. } => {
                let aside = self.aside.remove(&ps).expect("the copy set aside");
                (ps, down, Tamper::Replace(ps, aside))
            }
            Nemesis::Drift { ps, down, .. } => (ps, down, Tamper::Writable(ps)),
            _ => unreachable!("{nemesis} is not struck later"),
        };
        let task = Task::Ps(ps);
        if self.can_kill(task) {
            self.kill_for(nemesis, tamper, down);
            return;
        }
        self.skipped += 1;
        match tamper {
            Tamper::Replace(_, aside) => {
                let _ = std::fs::remove_dir_all(aside);
            }
            Tamper::Writable(ps) => self.writable(ps),
            Tamper::Rename(_) => {}
        }
        self.rec.record(What::Heal {
            text: format!("{task} not running: \"{nemesis}\" skipped, its preparation undone"),
        });
    }

    /// Clears the immutable flag of ps `ps`'s state directory.
    fn writable(&mut self, ps: usize) {
        let dir = self.state_dir(ps);
        set_immutable(&dir, false).unwrap_or_else(|e| panic!("chattr -i {}: {e}", dir.display()));
        self.writes_fail.remove(&ps);
    }

    /// Does `tamper` to a killed ps's state directory (its process reaped).
    fn tamper(&mut self, tamper: Tamper) {
        let text = match tamper {
            Tamper::Writable(ps) => {
                self.writable(ps);
                format!("ps:{ps}'s state directory writable again")
            }
            Tamper::Replace(ps, aside) => {
                let dir = self.state_dir(ps);
                let was = describe_state(&dir);
                std::fs::remove_dir_all(&dir)
                    .unwrap_or_else(|e| panic!("rm -r {}: {e}", dir.display()));
                std::fs::rename(&aside, &dir)
                    .unwrap_or_else(|e| panic!("mv {} {}: {e}", aside.display(), dir.display()));
                format!(
                    "ps:{ps}'s state directory ({was}) replaced by the older copy: {}",
                    describe_state(&dir)
                )
            }
            Tamper::Rename(ps) => {
                let dir = self.state_dir(ps);
                let mut done = Vec::new();
                let mut dirs = vec![dir.clone()];
                dirs.extend(replica_dirs(&dir));
                for d in dirs {
                    if let Some((from, to)) = rename_older_past_newest(&d) {
                        let name = d.strip_prefix(dir.parent().unwrap()).unwrap().display();
                        done.push(format!("{name}/shard-{from} -> shard-{to}"));
                    }
                }
                if done.is_empty() {
                    format!("ps:{ps}: fewer than two snapshots, nothing renamed")
                } else {
                    format!("ps:{ps}'s snapshots renamed: {}", done.join(", "))
                }
            }
        };
        self.rec.record(What::Heal { text });
    }

    /// A cut or a slow link of `host` is still to be healed.
    fn network_fault_on(&self, host: usize) -> bool {
        self.queue
            .iter()
            .any(|(_, a)| matches!(a, Action::Reconnect(h) | Action::Unshape(h) if *h == host))
    }

    fn fault(&mut self, nemesis: Nemesis) {
        // The steps just before a fault that may cost some, so that the
        // step going back is seen however fast it climbs again.
        let mut bound = nemesis.bound(&self.c.cfg);
        if bound != Bound::Nothing {
            self.rec.observe(|| {
                status(
                    &self.c.config_path,
                    &self.c.cfg.checkpoint.dir,
                    self.c.cfg.cluster.ps.len(),
                    self.net.as_deref(),
                )
            });
        }
        // A ps stopped (SIGSTOP) when it dies took no snapshot while stopped,
        // nor one whose writes fail (a `drift`'s window, whatever fault
        // kills it, however late): its promise counts from when it stopped,
        // or its writes began to fail, whichever came first. (Measured now,
        // after the status above, which may have waited seconds on the
        // stopped ps: the fault's time in the history is now.)
        if let (Bound::Seconds(secs), Some(task)) = (&mut bound, nemesis.kills()) {
            let paused = self.tasks.get(&task).and_then(|t| t.paused);
            let failing = match task {
                Task::Ps(ps) => self.writes_fail.get(&ps).copied(),
                _ => None,
            };
            if let Some(since) = paused.into_iter().chain(failing).min() {
                let snapshot = self.c.cfg.ps.snapshot_secs as f64 + 1.0;
                *secs = secs.max(snapshot + since.elapsed().as_secs_f64());
            }
        }
        *self.injected.entry(nemesis.kind()).or_default() += 1;
        self.rec.record(What::Fault {
            kind: nemesis.kind(),
            text: nemesis.to_string(),
            bound,
        });
    }

    /// Runs the queued actions that are due. A start (and the kill of a
    /// fault on a ps's state) waits while the config is invalid, and a start
    /// (and what is done to a killed ps's state) while the process it
    /// replaces has not been reaped: a
    /// SIGKILLed process can take longer than its `down` time to exit on a
    /// loaded machine, and a start dropped then was never made (seed 52).
    fn act(&mut self) {
        let now = Instant::now();
        let unreaped = |task: &Task| {
            self.tasks
                .get(task)
                .is_some_and(|s| s.running && s.cause == Some(Cause::Killed))
        };
        let waits = |a: &Action| match a {
            Action::Start(task) => self.invalid || unreaped(task),
            // Its status sample needs a valid config (`dtf status` refuses
            // an invalid one): without it the step just before the kill
            // is not seen.
            Action::Strike(..) => self.invalid,
            // Queued before the task's start, so done before it.
            Action::Tamper(Tamper::Replace(ps, _) | Tamper::Rename(ps) | Tamper::Writable(ps)) => {
                unreaped(&Task::Ps(*ps))
            }
            _ => false,
        };
        let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.queue)
            .into_iter()
            .partition(|(at, a)| *at <= now && !waits(a));
        self.queue = later;
        for (_, action) in due {
            match action {
                Action::Start(task) => {
                    if !self.tasks[&task].running {
                        self.start(task);
                    }
                }
                Action::Cont(task, g) => {
                    let st = &self.tasks[&task];
                    if st.running && st.generation == g && st.paused.is_some() {
                        self.signal(task, libc::SIGCONT);
                        self.tasks.get_mut(&task).unwrap().paused = None;
                        self.rec.record(What::Heal {
                            text: format!("SIGCONT {task}"),
                        });
                    }
                }
                Action::FreeDisk(filler) => {
                    std::fs::remove_file(&filler).unwrap();
                    self.rec.record(What::Heal {
                        text: "checkpoint.dir has room again".into(),
                    });
                }
                Action::RestoreConfig => {
                    self.invalid = false;
                    self.c.write_config_by_rename();
                    self.rec.record(What::Heal {
                        text: "dtf.toml valid again".into(),
                    });
                }
                Action::Reconnect(host) => {
                    let net = self.net.as_ref().expect("a plan on hosts");
                    net.hosts.heal(host);
                    self.rec.record(What::Heal {
                        text: format!("host {host}'s link up again"),
                    });
                }
                Action::Unshape(host) => {
                    let net = self.net.as_ref().expect("a plan on hosts");
                    net.hosts.unshape(host);
                    self.rec.record(What::Heal {
                        text: format!("host {host}'s link at full speed again"),
                    });
                }
                Action::Strike(nemesis) => self.strike(nemesis),
                Action::Tamper(tamper) => self.tamper(tamper),
            }
        }
    }

    /// No fault is left to heal and no start is queued: every task either
    /// runs or has finished.
    fn settled(&self) -> bool {
        self.queue.is_empty() && self.tasks.values().all(|s| !s.start_queued)
    }

    fn all_finished(&self) -> bool {
        self.settled() && self.tasks.values().all(|s| s.finished && !s.running)
    }
}

/// `FS_IMMUTABLE_FL` (linux/fs.h; `chattr +i`).
const FS_IMMUTABLE_FL: libc::c_int = 0x10;

/// Sets or clears `dir`'s immutable flag (`chattr +i`/`-i`): while it is
/// set nothing may create, rename or delete an entry in it, root included,
/// so a ps's `snapshot::write` there fails at its temp file (`create`),
/// while files in its subdirectories (the ring copies it keeps) are still
/// written. ext4, xfs, btrfs and (Linux 6.0 on) tmpfs have the flag.
fn set_immutable(dir: &Path, on: bool) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(dir)?;
    let mut flags: libc::c_int = 0;
    // SAFETY: an open descriptor, and an int for the kernel to fill or read
    // (the ioctls take an int, whatever their encoding says).
    if unsafe { libc::ioctl(f.as_raw_fd(), libc::FS_IOC_GETFLAGS, &mut flags) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    flags = if on {
        flags | FS_IMMUTABLE_FL
    } else {
        flags & !FS_IMMUTABLE_FL
    };
    // SAFETY: as above.
    if unsafe { libc::ioctl(f.as_raw_fd(), libc::FS_IOC_SETFLAGS, &flags) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Copies the directory tree `from` to `to` (a state directory: regular
/// files and directories). A file that disappears meanwhile (a ps deletes
/// its older snapshot once it wrote a newer one) is left out, as a copy of
/// a live disk would; a snapshot's temp file is copied like any other (the
/// ps deletes those when it starts).
fn copy_tree(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        let copied = match entry.file_type()? {
            t if t.is_dir() => copy_tree(&entry.path(), &target),
            _ => std::fs::copy(entry.path(), &target).map(|_| ()),
        };
        match copied {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            other => other?,
        }
    }
    Ok(())
}

/// The `replica-ps-*` directories in a ps's state directory.
fn replica_dirs(dir: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("replica-ps-"))
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    found.sort();
    found
}

/// The steps of the snapshot files (`shard-<step>.safetensors`) in `dir`, ascending.
fn snapshot_steps(dir: &Path) -> Vec<u64> {
    let mut steps: Vec<u64> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            name.strip_prefix("shard-")?
                .strip_suffix(".safetensors")?
                .parse()
                .ok()
        })
        .collect();
    steps.sort();
    steps
}

/// A state directory's snapshots, and those of each ring copy in it, for the history.
fn describe_state(dir: &Path) -> String {
    let mut parts = vec![format!("snapshots {:?}", snapshot_steps(dir))];
    for d in replica_dirs(dir) {
        let name = d.file_name().unwrap().to_string_lossy().into_owned();
        parts.push(format!("{name} {:?}", snapshot_steps(&d)));
    }
    parts.join(", ")
}

/// Renames the oldest snapshot in `dir` `shard-<newest + 1>.safetensors`,
/// when there are two or more: its steps, from and to.
fn rename_older_past_newest(dir: &Path) -> Option<(u64, u64)> {
    let steps = snapshot_steps(dir);
    let (&oldest, &newest) = (steps.first()?, steps.last()?);
    if oldest == newest {
        return None;
    }
    let name = |s: u64| dir.join(format!("shard-{s}.safetensors"));
    std::fs::rename(name(oldest), name(newest + 1))
        .unwrap_or_else(|e| panic!("rename in {}: {e}", dir.display()));
    Some((oldest, newest + 1))
}

/// `last_step` while the faults run: the harness alone ends the run.
const FAR: u64 = 100_000_000;

fn write_by_rename(path: &Path, text: &str) {
    let tmp = path.with_extension("toml.new");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// One `dtf status --json` (from the observer's host, on hosts): each ps's
/// step, completeness, and the newest checkpoint file in `ckpt` (read after
/// the status: a checkpoint named here existed by the time the event is
/// recorded).
fn status(config: &Path, ckpt: &Path, ps: usize, net: Option<&Net>) -> Option<What> {
    let mut cmd = std::process::Command::new(bin("dtf"));
    cmd.args(["status", "--json", "--config"])
        .arg(config)
        .env_remove("TF_CONFIG")
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    // `dtf status` bounds each ps's answer at 3 s.
    let out = match net {
        Some(net) => net.observer().run(&mut cmd, Duration::from_secs(30)),
        None => cmd.output().ok()?,
    };
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    let steps = (0..ps)
        .map(|i| {
            let t = &v["tasks"][i];
            (t["initialized"].as_bool() == Some(true))
                .then(|| t["global_step"].as_u64())
                .flatten()
        })
        .collect();
    Some(What::Status {
        steps,
        complete: v["complete"].as_bool().unwrap_or(false),
        checkpoint: checkpoint_steps(ckpt).last().copied(),
    })
}

/// Polls `dtf status --json` and every task's `/metrics` until `stop`.
fn poll(
    config: PathBuf,
    ckpt: PathBuf,
    ps: usize,
    metrics: BTreeMap<Task, String>,
    rec: Recorder,
    stop: Arc<AtomicBool>,
    net: Option<Arc<Net>>,
) {
    while !stop.load(Ordering::Relaxed) {
        rec.observe(|| status(&config, &ckpt, ps, net.as_deref()));
        for (task, addr) in &metrics {
            // On hosts a task's metrics listen on its host's loopback.
            let scraped = match &net {
                Some(net) => net
                    .hosts
                    .host(net.of[task])
                    .enter(|| http_get(addr, "/metrics")),
                None => http_get(addr, "/metrics"),
            };
            if let Some(text) = scraped {
                let gauge = |name: &str| {
                    text.lines()
                        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
                };
                rec.record(What::Metrics {
                    task: *task,
                    global_step: gauge("dtf_global_step"),
                    checkpoint_failures: gauge("dtf_checkpoint_failures_total"),
                });
            }
        }
        std::thread::sleep(POLL);
    }
}

/// The chief's restores in the lines of its log after `offset` (moved past
/// them): shards seeded from a checkpoint and ps snapshots adopted
/// ([`restore_in`]).
fn restores(log: &Path, offset: &mut u64) -> Vec<What> {
    use std::io::{Read, Seek};
    let Ok(mut f) = std::fs::File::open(log) else {
        return Vec::new();
    };
    let mut text = String::new();
    if f.seek(std::io::SeekFrom::Start(*offset)).is_err() || f.read_to_string(&mut text).is_err() {
        return Vec::new();
    }
    // Whole lines only: a partly written one is read next time.
    let Some(end) = text.rfind('\n') else {
        return Vec::new();
    };
    *offset += end as u64 + 1;
    text[..end].lines().filter_map(restore_in).collect()
}

/// The restore a line of the chief's log tells of: shards seeded from the
/// checkpoint at `step` (`Restored the model`), or a ps's own snapshot
/// adopted, its shard resuming at `resumed_at` (`restored its shard from
/// its own snapshot`, at INFO or WARN). The adoption is a step the shard
/// held: without it, a ps killed again before its first snapshot after a
/// restart seemed to go back below anything it held (seed 22).
fn restore_in(line: &str) -> Option<What> {
    let field = |k: &str| line.split_once(&format!(" {k}="))?.1.split(' ').next();
    if line.contains("Restored the model") {
        let step = field("step")?.parse().ok()?;
        // `ps=[0, 1]`: a list with spaces in it.
        let ps = line
            .split_once(" ps=[")?
            .1
            .split_once(']')?
            .0
            .split(',')
            .filter_map(|n| n.trim().parse().ok())
            .collect();
        Some(What::Restored { ps, step })
    } else if line.contains("restored its shard from its own snapshot") {
        Some(What::Adopted {
            ps: field("ps")?.parse().ok()?,
            step: field("resumed_at")?.parse().ok()?,
        })
    } else {
        None
    }
}

/// A new cluster for `plan`, its config written.
fn cluster(plan: &Plan, last_step: u64) -> Cluster {
    let mut c = Cluster::new(plan.ps, plan.workers, last_step, plan.mode);
    if plan.sparse {
        // Few ids: a checkpoint of the tables (~0.5 MB) leaves the 8 MiB
        // tmpfs room for `max_to_keep` of them, as the MLP's do.
        crate::util::wide_deep_on_synth(&mut c, 2_000);
        // Chains of a whole snapshot and deltas, short ones, under the
        // faults (a table this small otherwise gets whole ones only).
        c.cfg.ps.snapshot_delta_min_bytes = 0;
        c.cfg.ps.snapshot_full_every = 4;
    }
    c.cfg.cluster.transport = plan.transport;
    c.cfg.train.log_step_count_steps = 1000;
    c.cfg.checkpoint.save_secs = Some(plan.save_secs());
    c.write_config();
    c
}

/// The newest step seen by the status poller, and the steps per second:
/// the fastest seen over a second or more of samples. (The rate of the last
/// few seconds alone is near 0 after a ps went back to a checkpoint, and a
/// `last_step` set from it could be passed before the edit lands: the run
/// would then end past it.)
fn step_and_rate(events: &[Event]) -> Option<(u64, f64)> {
    let samples: Vec<(f64, u64)> = events
        .iter()
        .filter_map(|e| match &e.what {
            What::Status { steps, .. } => steps.first().copied().flatten().map(|s| (e.t, s)),
            _ => None,
        })
        .collect();
    let &(_, newest) = samples.last()?;
    let rate = samples
        .iter()
        .enumerate()
        .filter_map(|(i, &(t0, s0))| {
            let &(t1, s1) = samples[i..].iter().find(|(t, _)| *t >= t0 + 1.0)?;
            (s1 >= s0).then(|| (s1 - s0) as f64 / (t1 - t0))
        })
        .fold(0.0, f64::max);
    Some((newest, rate))
}

/// Runs `plan` and checks its history against `expect`; with `reference`,
/// also a fault-free run of the same steps for the accuracy band.
pub fn run(plan: &Plan, expect: &Expect, reference: bool) -> Outcome {
    let began = Instant::now();
    let mut c = cluster(plan, FAR);
    let disk = Tmpfs::mount(&c.cfg.checkpoint.dir, DISK_BYTES);
    let ckpt = c.cfg.checkpoint.dir.clone();
    let addrs = free_addrs(plan.tasks().len());
    let metrics: BTreeMap<Task, String> = plan.tasks().into_iter().zip(addrs).collect();
    let net = plan.hosts.then(|| {
        let tasks = plan.tasks();
        let hosts = Hosts::new(tasks.len() + 1, c.dir.path());
        let of: BTreeMap<Task, usize> = tasks.iter().enumerate().map(|(i, &t)| (t, i)).collect();
        let ps: Vec<usize> = (0..plan.ps).map(|i| of[&Task::Ps(i)]).collect();
        let workers: Vec<usize> = (0..plan.workers).map(|i| of[&Task::Worker(i)]).collect();
        c.place(&hosts, &ps, &workers);
        Arc::new(Net { hosts, of })
    });
    let config_path = c.config_path.clone();
    let mut d = Driver {
        c,
        disk: Some(disk),
        net: net.clone(),
        rec: Recorder::new(),
        metrics: metrics.clone(),
        tasks: BTreeMap::new(),
        queue: Vec::new(),
        invalid: false,
        ended: false,
        injected: BTreeMap::new(),
        skipped: 0,
        writes_fail: BTreeMap::new(),
        copies: 0,
        aside: BTreeMap::new(),
    };
    for task in plan.tasks() {
        d.start(task);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let poller = {
        let (rec, stop, ckpt) = (d.rec.clone(), stop.clone(), ckpt.clone());
        let ps = plan.ps;
        std::thread::spawn(move || poll(config_path, ckpt, ps, metrics, rec, stop, net))
    };

    let start = Instant::now();
    // Faults not yet fired, and for those at a checkpoint the newest step when they armed.
    let mut pending: Vec<(super::schedule::Fault, Option<Option<u64>>)> =
        plan.faults.iter().cloned().map(|f| (f, None)).collect();
    let mut end: Option<Instant> = None;
    let mut last_activity = Instant::now();
    let chief_log = d.c.log_path("worker:0");
    let mut chief_offset = 0;
    let done = loop {
        for what in restores(&chief_log, &mut chief_offset) {
            d.rec.record(what);
        }
        d.reap();
        d.act();
        let now = Instant::now();
        let elapsed = now - start;
        let newest = checkpoint_steps(&ckpt).last().copied();
        let mut fired = Vec::new();
        for (i, (fault, armed)) in pending.iter_mut().enumerate() {
            let due = match fault.when {
                When::At(at) => elapsed >= at,
                When::AtCheckpoint(at) => {
                    if elapsed < at {
                        false
                    } else if let Some(base) = *armed {
                        // A new checkpoint, or 10 s without one.
                        newest > base || elapsed >= at + Duration::from_secs(10)
                    } else {
                        *armed = Some(newest);
                        false
                    }
                }
                When::AtEnd(after) => end.is_some_and(|e| now >= e + after),
            };
            // An edit waits for the invalid file to be put right (an
            // operator's next edit would start from the good one).
            let blocked = d.invalid && matches!(fault.nemesis, Nemesis::Edit(_));
            if due && !blocked {
                fired.push(i);
            }
        }
        for i in fired.into_iter().rev() {
            let (fault, _) = pending.remove(i);
            if d.inject(fault.nemesis) {
                last_activity = Instant::now();
            } else {
                d.skipped += 1;
            }
        }
        // The end of the run: once the faults' time is over and nothing is
        // broken, `last_step` a few seconds of steps ahead.
        if end.is_none()
            && elapsed >= Duration::from_secs(plan.seconds)
            && !d.invalid
            && pending
                .iter()
                .all(|(f, _)| matches!(f.when, When::AtEnd(_)))
            && let Some((step, rate)) = step_and_rate(&d.rec.events())
        {
            d.c.cfg.train.last_step = step + 2000 + (rate * 4.0) as u64;
            d.rec.record(What::Heal {
                text: format!(
                    "end of the run: train.last_step = {}",
                    d.c.cfg.train.last_step
                ),
            });
            d.c.write_config_by_rename();
            end = Some(Instant::now());
            d.ended = true;
        }
        if !d.queue.is_empty() {
            last_activity = Instant::now();
        }
        if end.is_some() && pending.is_empty() && d.all_finished() {
            break true;
        }
        let hard = Duration::from_secs(plan.seconds) + Duration::from_secs(300);
        if (end.is_some()
            && now.duration_since(last_activity) > Duration::from_secs_f64(expect.complete_within))
            || elapsed > hard
        {
            break false;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    stop.store(true, Ordering::Relaxed);
    poller.join().unwrap();

    let last_step = d.c.cfg.train.last_step;
    let final_file = ckpt.join(format!("model.ckpt-{last_step}.safetensors"));
    let complete = done && final_file.is_file();
    verify_all(&d.c, &d.rec);
    d.rec.record(What::Done {
        last_step,
        complete,
    });
    // Every process of this run exits: the harness's children, and anything
    // else naming its config.
    let mut left = Vec::new();
    for (name, child) in &mut d.c.procs {
        if child.try_wait().unwrap().is_none() {
            left.push(format!("{name} (pid {})", child.id()));
        }
    }
    let ours: Vec<String> = d.c.procs.iter().map(|(_, c)| c.id().to_string()).collect();
    left.extend(
        others_naming(&d.c.config_path)
            .into_iter()
            .filter(|(pid, _)| !ours.contains(pid))
            .map(|(pid, cmd)| format!("pid {pid}: {cmd}")),
    );
    for text in left {
        d.rec.record(What::Leftover { text });
    }
    if complete && reference {
        let ema = score(&final_file, &d.c);
        let reference = fault_free(plan, last_step);
        d.rec.record(What::Accuracy { ema, reference });
    }
    let events = d.rec.events();
    let violations = checker::check(&events, expect);
    if !violations.is_empty() {
        keep_logs(&d.c, plan.seed);
    }
    Outcome {
        events,
        violations,
        injected: std::mem::take(&mut d.injected),
        skipped: d.skipped,
        wall: began.elapsed(),
    }
}

/// Copies the tasks' logs and config of a failing seed to
/// `$TMPDIR/dtf-chaos-seed-<seed>` (the run's own directory is deleted).
fn keep_logs(c: &Cluster, seed: u64) {
    let kept = std::env::temp_dir().join(format!("dtf-chaos-seed-{seed}"));
    let _ = std::fs::remove_dir_all(&kept);
    std::fs::create_dir_all(&kept).unwrap();
    for entry in std::fs::read_dir(c.dir.path()).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.ends_with(".log") || name == "dtf.toml" {
            let _ = std::fs::copy(entry.path(), kept.join(&name));
        }
    }
    eprintln!(
        "chaos seed {seed}: the tasks' logs are kept in {}",
        kept.display()
    );
}

/// Verifies every checkpoint in `checkpoint.dir` and `best/`, recording each.
fn verify_all(c: &Cluster, rec: &Recorder) {
    let specs = dtf::model::Mlp::new(&c.cfg.model.layers)
        .unwrap()
        .variables();
    let dir = &c.cfg.checkpoint.dir;
    for sub in [dir.clone(), dir.join(dtf::checkpoint::best::DIR)] {
        let Ok(rd) = std::fs::read_dir(&sub) else {
            continue;
        };
        let mut files: Vec<PathBuf> = rd
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                let n = p.file_name().unwrap().to_string_lossy();
                n.ends_with(".safetensors")
                    && !n.ends_with(".ema.safetensors")
                    && !n.starts_with('.')
            })
            .collect();
        files.sort();
        for path in files {
            let result = dtf::checkpoint::load(&path, Some(&specs))
                .map(|c| c.global_step)
                .map_err(|e| e.to_string());
            let file = path.strip_prefix(dir).unwrap().display().to_string();
            rec.record(What::Verified { file, result });
        }
    }
}

/// Processes other than this one whose command line names `config`: pid, command line.
fn others_naming(config: &Path) -> Vec<(String, String)> {
    let needle = config.as_os_str().as_encoded_bytes();
    let me = std::process::id().to_string();
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name == me || !name.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        if let Ok(cmd) = std::fs::read(entry.path().join("cmdline"))
            && cmd.windows(needle.len()).any(|w| w == needle)
        {
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            out.push((name, cmd));
        }
    }
    out
}

/// The final score ([`score`]) of a fault-free run of `plan`'s cluster to `last_step`.
fn fault_free(plan: &Plan, last_step: u64) -> f32 {
    let mut c = cluster(plan, last_step);
    c.start_all();
    c.wait_all_success(Duration::from_secs(300));
    let file = c
        .cfg
        .checkpoint
        .dir
        .join(format!("model.ckpt-{last_step}.safetensors"));
    score(&file, &c)
}

/// The final checkpoint's score: its EMA test accuracy, or for wide & deep
/// its EMA test AUC (what `eval.metric` ranks it by).
fn score(file: &Path, c: &Cluster) -> f32 {
    let ev = dtf::eval::evaluate_on(file, &c.cfg.data).unwrap();
    ev.binary.map_or(ev.ema_accuracy, |b| b.ema_auc)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The chief's lines of seed 22's failing run (2026-12-05), and one
    /// of a checkpoint restore: each restore becomes an entry, nothing else
    /// does.
    #[test]
    fn the_chief_s_restores_and_adoptions_are_read_from_its_log() {
        let lines = [
            "2026-12-05T12:25:16.325873Z  WARN Checkpoint skipped: could not read the variables. error=ps:0: unavailable",
            "2026-12-05T12:25:16.657689Z  INFO The ps restarted and restored its shard from its own snapshot. ps=0 restored_step=254529 before=311465 steps_lost=56936 resumed_at=254529",
            "2026-12-05T12:25:19.855402Z  WARN The ps restarted and restored its shard from its own snapshot, further behind than ps.snapshot_secs allows: neither its state directory nor its ring neighbour held newer state (put back from an older copy, or its snapshot writes failed). ps=1 restored_step=900 before=5000 steps_lost=4100 bound_steps=2000 resumed_at=1200 checkpoint_shard_step=0",
            "2026-12-05T12:25:20.000000Z  INFO Restored the model from the newest valid checkpoint. ps=[0, 1] step=175143 checkpoint=/tmp/ckpt/model.ckpt-175143.safetensors",
        ];
        let found: Vec<What> = lines.into_iter().filter_map(restore_in).collect();
        assert_eq!(
            found,
            [
                What::Adopted {
                    ps: 0,
                    step: 254529
                },
                What::Adopted { ps: 1, step: 1200 },
                What::Restored {
                    ps: vec![0, 1],
                    step: 175143
                },
            ]
        );
    }
}
