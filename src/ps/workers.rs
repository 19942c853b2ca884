//! The cluster's membership as a ps task holds it, and the workers it has
//! heard from. Workers serve no RPC, so the ps is where membership is
//! enforced and where an operator learns about workers (`dtf status`):
//!
//! - the members are the task indices of the ps's current `cluster.worker`
//!   (a live key: a reload changes them, and the **membership epoch** counts
//!   the changes this ps applied, starting at 1);
//! - each member index is held by one process, its **incarnation** (random
//!   per start, carried by every push): a push from another process for the
//!   same index fences the holder — the newest process wins, so a restarted
//!   worker is never locked out by its dead predecessor, and the older
//!   process's next push is refused, telling it why (it exits 78);
//! - a push from an index that is not a member is refused, naming
//!   `cluster.worker` and the index;
//! - in sync mode without `train.replicas_to_aggregate`, a step aggregates
//!   the *counted* members: those of the start, and a worker added by a
//!   reload once it has pushed (a step never waits for a worker that is
//!   listed but not started yet).
//!
//! Per worker, member or not, the ps keeps the time of its latest push, its
//! step and the examples per second it pushed.

use crate::transport::WorkerContact;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

/// Shortest window an examples/s figure is computed over: shorter ones
/// jump with every push.
const RATE_WINDOW: Duration = Duration::from_secs(2);

/// Non-member indices the table records (a confused or hostile peer cannot
/// grow it further; their pushes are still refused and counted).
const MAX_STRANGERS: usize = 16;

/// Fenced incarnations remembered per index: enough for any restart loop
/// of duplicates an operator can make; the oldest are forgotten first.
const FENCED_KEPT: usize = 8;

/// What a refused worker's message contains, on either transport (the
/// shared-memory transport carries a status's code and message only): the
/// worker tells a refusal for its index from one for its process by these
/// ([`Refusal`]'s messages contain them; the tests below hold them to it).
const NOT_MEMBER_MARK: &str = "is not in cluster.worker";
/// See [`NOT_MEMBER_MARK`].
const FENCED_MARK: &str = "took over task index";

/// One worker's record.
#[derive(Debug)]
struct Seen {
    /// Its latest push.
    last: Instant,
    /// The step of that push.
    step: u64,
    /// The current rate window: start, examples since.
    window: (Instant, u64),
    /// The rate over the last complete window, if any.
    rate: Option<f64>,
    /// Pushes refused.
    refused: u64,
}

/// The process holding a task index, and those it fenced.
#[derive(Debug, Default)]
struct Holder {
    /// The incarnation whose pushes are accepted.
    incarnation: u64,
    /// Earlier holders, newest last: their pushes are refused.
    fenced: VecDeque<u64>,
}

/// Why a push was refused; nothing changed. Both are
/// `FAILED_PRECONDITION`, and the worker exits 78 on either (after a grace
/// for a ps that has not reloaded yet, for [`Refusal::NotMember`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The index is not in the ps's `cluster.worker`.
    #[error(
        "worker {worker} is not in cluster.worker of ps:{ps} (its {members} workers are 0 to \
         {last}): add the worker's address to cluster.worker on every task (a live reload), or \
         start it with the index of its entry",
        last = .members.saturating_sub(1)
    )]
    NotMember {
        /// The refusing ps.
        ps: usize,
        /// The index pushed.
        worker: u32,
        /// The ps's member count.
        members: usize,
    },
    /// Another process holds the index now.
    #[error(
        "worker {worker}: another process (incarnation {holder:x}) took over task index {worker} of \
         cluster.worker from this one (incarnation {incarnation:x}) at ps:{ps}: two processes \
         were started as worker {worker}; this one stops (run dtf-worker@{worker} on one host \
         only, or give the second one its own entry in cluster.worker)"
    )]
    Fenced {
        /// The refusing ps.
        ps: usize,
        /// The index pushed.
        worker: u32,
        /// The refused process.
        incarnation: u64,
        /// The process holding the index.
        holder: u64,
    },
}

impl From<Refusal> for tonic::Status {
    fn from(r: Refusal) -> Self {
        crate::transport::proto::status(tonic::Code::FailedPrecondition, r)
    }
}

/// Which refusal a status from a ps is, if it is one (see [`Refusal`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// [`Refusal::NotMember`].
    NotMember,
    /// [`Refusal::Fenced`].
    Fenced,
}

impl Refused {
    /// The refusal `status` carries, on either transport.
    pub fn of(status: &tonic::Status) -> Option<Refused> {
        if status.code() != tonic::Code::FailedPrecondition {
            return None;
        }
        let m = status.message();
        if m.contains(NOT_MEMBER_MARK) {
            Some(Refused::NotMember)
        } else if m.contains(FENCED_MARK) {
            Some(Refused::Fenced)
        } else {
            None
        }
    }
}

/// A push let in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Admitted {
    /// The incarnation this push's process fenced (it held the index until now).
    pub fenced: Option<u64>,
    /// The worker counts for sync from now on (its first push since it
    /// joined): the sync target grew.
    pub joined: bool,
}

/// A change of the member list, as applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// The epoch it made.
    pub epoch: u64,
    /// Indices that became members.
    pub added: Vec<u32>,
    /// Indices that stopped being members.
    pub removed: Vec<u32>,
}

/// The membership, and every worker a ps has had a push from, by task index.
#[derive(Debug)]
pub struct Membership {
    /// This ps task's index, for messages.
    ps: usize,
    /// Member indices are `0..members` (a live `cluster.worker` keeps every
    /// index it keeps: entries are added and removed at the end).
    members: u32,
    /// Changes applied, from 1.
    epoch: u64,
    /// Sync: the members a step aggregates (without `replicas_to_aggregate`).
    counted: BTreeSet<u32>,
    /// Who holds each index that pushed.
    holders: BTreeMap<u32, Holder>,
    /// By worker index, members and a few others.
    seen: BTreeMap<u32, Seen>,
    /// Pushes refused since start.
    refusals: u64,
}

impl Membership {
    /// The membership of ps task `ps` in a cluster of `members` workers
    /// (all counted: a starting sync run waits for each, as TensorFlow's).
    pub fn new(ps: usize, members: usize) -> Self {
        let members = u32::try_from(members).unwrap_or(u32::MAX);
        Self {
            ps,
            members,
            epoch: 1,
            counted: (0..members).collect(),
            holders: BTreeMap::new(),
            seen: BTreeMap::new(),
            refusals: 0,
        }
    }

    /// The membership epoch.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// How many workers are members.
    pub fn members(&self) -> usize {
        self.members as usize
    }

    /// Pushes refused since start.
    pub fn refusals(&self) -> u64 {
        self.refusals
    }

    /// Sync without `replicas_to_aggregate`: the gradients a step waits for.
    pub fn sync_target(&self) -> usize {
        self.counted.len().max(1)
    }

    /// `cluster.worker` now has `members` entries: the change, with a new
    /// epoch, or `None` when there is none. Removed indices stop counting
    /// at once (no step waits for them); added ones count from their first
    /// push.
    pub fn set_members(&mut self, members: usize) -> Option<Change> {
        let members = u32::try_from(members).unwrap_or(u32::MAX);
        if members == self.members {
            return None;
        }
        let (old, new) = (self.members, members);
        self.members = new;
        self.epoch += 1;
        self.counted.retain(|&w| w < new);
        Some(Change {
            epoch: self.epoch,
            added: (old..new).collect(),
            removed: (new..old).collect(),
        })
    }

    /// A push from `worker`'s process `incarnation` (0: anonymous, never
    /// fenced) computed at `step`, carrying `examples`, at `now`: recorded,
    /// then let in or refused.
    ///
    /// Errors: [`Refusal::NotMember`] for an index outside `cluster.worker`,
    /// [`Refusal::Fenced`] for a process another one took the index from.
    pub fn admit(
        &mut self,
        worker: u32,
        incarnation: u64,
        step: u64,
        examples: u64,
        now: Instant,
    ) -> Result<Admitted, Refusal> {
        let refusal = if worker >= self.members {
            Some(Refusal::NotMember {
                ps: self.ps,
                worker,
                members: self.members as usize,
            })
        } else {
            self.holder_refusal(worker, incarnation)
        };
        self.heard(
            worker,
            step,
            if refusal.is_some() { 0 } else { examples },
            refusal.is_some(),
            now,
        );
        if let Some(r) = refusal {
            self.refusals += 1;
            return Err(r);
        }
        let mut admitted = Admitted {
            joined: self.counted.insert(worker),
            ..Admitted::default()
        };
        if incarnation != 0 {
            let h = self.holders.entry(worker).or_default();
            if h.incarnation != incarnation {
                if h.incarnation != 0 {
                    if h.fenced.len() == FENCED_KEPT {
                        h.fenced.pop_front();
                    }
                    h.fenced.push_back(h.incarnation);
                    admitted.fenced = Some(h.incarnation);
                }
                h.incarnation = incarnation;
            }
        }
        Ok(admitted)
    }

    /// [`Refusal::Fenced`] when `incarnation` was fenced off `worker`.
    fn holder_refusal(&self, worker: u32, incarnation: u64) -> Option<Refusal> {
        let h = self.holders.get(&worker)?;
        (incarnation != 0 && h.fenced.contains(&incarnation)).then_some(Refusal::Fenced {
            ps: self.ps,
            worker,
            incarnation,
            holder: h.incarnation,
        })
    }

    /// Records a push from `worker` (refused or not).
    fn heard(&mut self, worker: u32, step: u64, examples: u64, refused: bool, now: Instant) {
        let strangers = self.seen.keys().filter(|&&w| w >= self.members).count();
        if worker >= self.members && !self.seen.contains_key(&worker) && strangers >= MAX_STRANGERS
        {
            return;
        }
        let seen = self.seen.entry(worker).or_insert(Seen {
            last: now,
            step,
            window: (now, 0),
            rate: None,
            refused: 0,
        });
        seen.last = now;
        seen.step = step;
        seen.refused += u64::from(refused);
        seen.window.1 += examples;
        let elapsed = now.saturating_duration_since(seen.window.0);
        if elapsed >= RATE_WINDOW {
            seen.rate = Some(seen.window.1 as f64 / elapsed.as_secs_f64());
            seen.window = (now, 0);
        }
    }

    /// Every worker heard from, in index order, as of `now`.
    pub fn report(&self, now: Instant) -> Vec<WorkerContact> {
        self.seen
            .iter()
            .map(|(&worker, s)| {
                let open = now.saturating_duration_since(s.window.0).as_secs_f64();
                // Before a window completes, the open one is the best figure.
                let rate = s.rate.unwrap_or(if open > 0.0 {
                    s.window.1 as f64 / open
                } else {
                    0.0
                });
                WorkerContact {
                    task: worker,
                    step: s.step,
                    since: now.saturating_duration_since(s.last),
                    examples_per_sec: rate,
                    member: worker < self.members,
                    incarnation: self.holders.get(&worker).map_or(0, |h| h.incarnation),
                    refused: s.refused,
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_each_workers_latest_push_and_rate() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut w = Membership::new(0, 2);
        assert!(w.report(t0).is_empty(), "never seen: not listed");
        // Worker 1 pushes 100 examples every 100 ms for 2 s: 1000 examples/s.
        for k in 0..=20 {
            w.admit(1, 5, 10 + k, 100, at(100 * k)).unwrap();
        }
        // Outside the cluster: refused, but listed as not a member.
        let refused = w.admit(7, 9, 1, 100, at(2000)).unwrap_err();
        assert_eq!(
            refused,
            Refusal::NotMember {
                ps: 0,
                worker: 7,
                members: 2
            }
        );
        let text = refused.to_string();
        assert!(
            text.contains("worker 7") && text.contains("cluster.worker"),
            "{text}"
        );
        let r = w.report(at(2500));
        assert_eq!(r.len(), 2, "{r:?}");
        assert_eq!((r[0].task, r[0].step, r[0].member), (1, 30, true));
        assert_eq!(r[0].since, Duration::from_millis(500));
        assert_eq!(r[0].incarnation, 5);
        assert!(
            (r[0].examples_per_sec - 1050.0).abs() < 1.0,
            "2100 examples over 2 s: {r:?}"
        );
        assert_eq!((r[1].task, r[1].member, r[1].refused), (7, false, 1));
        assert_eq!(r[1].examples_per_sec, 0.0, "refused pushes trained nothing");
        assert_eq!(w.refusals(), 1);
        w.admit(0, 4, 3, 100, at(2600)).unwrap();
        let r = w.report(at(2600));
        assert_eq!(r.iter().map(|c| c.task).collect::<Vec<_>>(), [0, 1, 7]);
        assert_eq!(r[0].since, Duration::ZERO);
    }

    #[test]
    fn a_second_process_fences_the_first_which_stays_refused() {
        let now = Instant::now();
        let mut w = Membership::new(1, 2);
        assert_eq!(w.admit(1, 10, 0, 1, now).unwrap().fenced, None);
        // A restart (or a duplicate) takes the index over...
        assert_eq!(w.admit(1, 11, 1, 1, now).unwrap().fenced, Some(10));
        // ...and the older process is refused from then on, saying why.
        let e = w.admit(1, 10, 2, 1, now).unwrap_err();
        assert_eq!(
            e,
            Refusal::Fenced {
                ps: 1,
                worker: 1,
                incarnation: 10,
                holder: 11
            }
        );
        assert_eq!(Refused::of(&e.clone().into()), Some(Refused::Fenced), "{e}");
        assert!(w.admit(1, 11, 3, 1, now).is_ok());
        // Anonymous pushes (no incarnation) are never fenced.
        assert!(w.admit(1, 0, 3, 1, now).is_ok());
        assert_eq!(w.report(now)[0].incarnation, 11);
    }

    #[test]
    fn members_change_with_the_epoch_and_joiners_count_from_their_first_push() {
        let now = Instant::now();
        let mut w = Membership::new(0, 2);
        assert_eq!((w.epoch(), w.sync_target()), (1, 2));
        assert_eq!(w.set_members(2), None, "no change, no epoch");
        let grown = w.set_members(3).unwrap();
        assert_eq!(
            grown,
            Change {
                epoch: 2,
                added: vec![2],
                removed: vec![]
            }
        );
        assert_eq!(w.sync_target(), 2, "not started yet: not waited for");
        assert!(w.admit(2, 7, 0, 1, now).unwrap().joined);
        assert_eq!(w.sync_target(), 3);
        assert!(!w.admit(2, 7, 1, 1, now).unwrap().joined);
        let shrunk = w.set_members(1).unwrap();
        assert_eq!(shrunk.removed, [1, 2]);
        assert_eq!((shrunk.epoch, w.sync_target()), (3, 1));
        assert_eq!(
            Refused::of(&w.admit(2, 7, 2, 1, now).unwrap_err().into()),
            Some(Refused::NotMember)
        );
        assert!(!w.report(now)[0].member, "worker 2 is listed, not a member");
    }
}
