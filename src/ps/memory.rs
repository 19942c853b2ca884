//! The ps's memory bound when its tables have no `model.tables.max_rows`:
//! the memory limit of its cgroup (a systemd unit's `MemoryMax=`, a
//! container's limit). Watched every [`EVERY`]; once the working set (usage
//! less the inactive file cache the kernel reclaims first, as the kubelet
//! counts it) plus a reserve (a quarter of the tables' bytes for their next
//! growth — an eighth more rows, the index doubling —, two pages of rows
//! for a checkpoint's read and its encoding, and with ps snapshots on three
//! times the tables: a snapshot copies them, encodes the copy, and writes it
//! through the page cache) passes [`FULL`] of the
//! limit, the tables create no rows — a
//! push's new ids are refused and counted, a pull reads them as their
//! initial values — until it is back under [`ROOMY`]. Training goes on with
//! the rows there are, rather than the kernel killing the ps.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tracing::{info, warn};

/// How often the working set is read (three small files).
pub const EVERY: Duration = Duration::from_millis(100);

/// The share of the limit past which no row is created.
pub const FULL: f64 = 0.90;

/// The share under which rows are created again.
pub const ROOMY: f64 = 0.85;

/// Whether the tables may create rows: shared by every table of a ps.
#[derive(Debug, Default)]
pub struct Room {
    /// The working set passed [`FULL`] of the limit, and is not yet back
    /// under [`ROOMY`].
    full: AtomicBool,
}

impl Room {
    /// Whether a new row may be made now (one relaxed load).
    pub fn has_room(&self) -> bool {
        !self.full.load(Ordering::Relaxed)
    }

    /// Whether rows are refused now, for metrics and `State`.
    pub fn is_full(&self) -> bool {
        self.full.load(Ordering::Relaxed)
    }

    /// Takes a reading: `used` bytes of `limit`. Returns the new state when
    /// it changed.
    pub fn observe(&self, used: u64, limit: u64) -> Option<bool> {
        let share = used as f64 / limit as f64;
        let was = self.is_full();
        let now = match was {
            false => share >= FULL,
            true => share >= ROOMY,
        };
        (now != was).then(|| {
            self.full.store(now, Ordering::Relaxed);
            now
        })
    }
}

/// Where this process's cgroup keeps its memory figures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cgroup {
    /// Its directory.
    dir: PathBuf,
    /// cgroup v2 (`memory.max`, `memory.current`, `inactive_file`) or v1
    /// (`memory.limit_in_bytes`, `memory.usage_in_bytes`, `total_inactive_file`).
    v2: bool,
}

impl Cgroup {
    /// This process's memory cgroup under `root` (`/sys/fs/cgroup`), from
    /// `proc_cgroup` (the text of `/proc/self/cgroup`): the v1 `memory`
    /// hierarchy when there is one, else the v2 one (at `root`, or at
    /// `root/unified` on a hybrid host). Inside a container whose cgroup
    /// is mounted as the root, the path named may not exist there: the
    /// root is then this process's cgroup. `None` when neither has its
    /// memory files.
    pub fn find(root: &Path, proc_cgroup: &str) -> Option<Self> {
        let mut v1 = None;
        let mut v2 = None;
        for line in proc_cgroup.lines() {
            let mut parts = line.splitn(3, ':');
            let (Some(_), Some(controllers), Some(path)) =
                (parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            let path = path.trim_start_matches('/');
            if controllers.split(',').any(|c| c == "memory") {
                v1 = Some(path.to_owned());
            } else if controllers.is_empty() {
                v2 = Some(path.to_owned());
            }
        }
        let pick = |base: PathBuf, path: &str, v2: bool, file: &str| {
            [base.join(path), base]
                .into_iter()
                .find(|dir| dir.join(file).is_file())
                .map(|dir| Self { dir, v2 })
        };
        if let Some(path) = v1
            && let Some(c) = pick(root.join("memory"), &path, false, "memory.limit_in_bytes")
        {
            return Some(c);
        }
        let path = v2?;
        [root.to_path_buf(), root.join("unified")]
            .into_iter()
            .find_map(|base| pick(base, &path, true, "memory.max"))
    }

    /// The limit in bytes; `None` when there is none (`max`, or v1's
    /// near-2⁶³ "unlimited").
    pub fn limit(&self) -> Option<u64> {
        let file = if self.v2 {
            "memory.max"
        } else {
            "memory.limit_in_bytes"
        };
        let text = std::fs::read_to_string(self.dir.join(file)).ok()?;
        text.trim().parse::<u64>().ok().filter(|&l| l < 1 << 62)
    }

    /// The working set in bytes: usage less the inactive file cache.
    pub fn working_set(&self) -> Option<u64> {
        let (usage, inactive) = match self.v2 {
            true => ("memory.current", "inactive_file"),
            false => ("memory.usage_in_bytes", "total_inactive_file"),
        };
        let used: u64 = std::fs::read_to_string(self.dir.join(usage))
            .ok()?
            .trim()
            .parse()
            .ok()?;
        let stat = std::fs::read_to_string(self.dir.join("memory.stat")).unwrap_or_default();
        Some(used.saturating_sub(stat_value(&stat, inactive).unwrap_or(0)))
    }
}

/// The value of `key` in a `memory.stat`'s text.
fn stat_value(stat: &str, key: &str) -> Option<u64> {
    stat.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok())?
    })
}

/// Watches this process's cgroup until `stop`, keeping `room` up to date
/// (a line at each change): the working set plus `reserve()` bytes against
/// the limit. The cgroup and its limit are read again at every look: a
/// process may be moved, a limit changed live (`systemctl set-property
/// MemoryMax=`). Without a limit, `room` always has room.
pub async fn watch(
    room: Arc<Room>,
    task: usize,
    reserve: impl Fn() -> u64,
    stop: tokio_util::sync::CancellationToken,
) {
    let mut known: Option<(PathBuf, u64)> = None;
    loop {
        let proc_cgroup = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        let cgroup = Cgroup::find(Path::new("/sys/fs/cgroup"), &proc_cgroup);
        let limited = cgroup.and_then(|c| c.limit().map(|l| (c, l)));
        match &limited {
            Some((c, limit)) if known.as_ref() != Some(&(c.dir.clone(), *limit)) => {
                info!(
                    ps = task,
                    limit_bytes = limit,
                    cgroup = %c.dir.display(),
                    full = FULL,
                    "Table rows are bounded by the cgroup's memory limit: none is created past this share of it."
                );
                known = Some((c.dir.clone(), *limit));
            }
            Some(_) => {}
            None => known = None,
        }
        let reading = limited.and_then(|(c, limit)| Some((c.working_set()?, limit)));
        // No limit (any more): room again.
        let (used, limit) = reading.unwrap_or((0, u64::MAX));
        if let Some(full) = room.observe(used.saturating_add(reserve()), limit) {
            match full {
                true => warn!(
                    ps = task,
                    used_bytes = used,
                    limit_bytes = limit,
                    "Memory nearly full (the cgroup's limit): the tables create no new rows; new ids are refused (counted) and read as their initial values. Set model.tables.max_rows, or give the ps more memory."
                ),
                false => info!(
                    ps = task,
                    used_bytes = used,
                    limit_bytes = limit,
                    "Memory below the bound again: the tables create rows again."
                ),
            }
        }
        tokio::select! {
            () = tokio::time::sleep(EVERY) => {}
            () = stop.cancelled() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cgroup tree under a temporary root, with `files` in `dir`.
    fn tree(dir: &str, files: &[(&str, &str)]) -> tempfile::TempDir {
        let root = tempfile::tempdir().unwrap();
        let d = root.path().join(dir);
        std::fs::create_dir_all(&d).unwrap();
        for (name, text) in files {
            std::fs::write(d.join(name), text).unwrap();
        }
        root
    }

    #[test]
    fn v2_limit_and_working_set_less_the_inactive_file_cache() {
        let root = tree(
            "system.slice/dtf-ps@0.service",
            &[
                ("memory.max", "1000000\n"),
                ("memory.current", "700000\n"),
                (
                    "memory.stat",
                    "anon 500000\nfile 200000\ninactive_file 150000\n",
                ),
            ],
        );
        let c = Cgroup::find(root.path(), "0::/system.slice/dtf-ps@0.service\n").unwrap();
        assert_eq!(c.limit(), Some(1_000_000));
        assert_eq!(c.working_set(), Some(550_000));
    }

    #[test]
    fn v1_memory_hierarchy_wins_on_a_hybrid_host() {
        let root = tree(
            "memory/process_api/abc",
            &[
                ("memory.limit_in_bytes", "268435456\n"),
                ("memory.usage_in_bytes", "1000\n"),
                ("memory.stat", "cache 10\ntotal_inactive_file 400\n"),
            ],
        );
        let text = "9:name=systemd:/\n4:memory:/process_api/abc\n0::/\n";
        let c = Cgroup::find(root.path(), text).unwrap();
        assert_eq!(c.limit(), Some(268_435_456));
        assert_eq!(c.working_set(), Some(600));
    }

    #[test]
    fn no_limit_is_none_and_a_container_s_own_root_is_its_cgroup() {
        // The path named is the host's; the container mounts its own at the root.
        let root = tree("", &[("memory.max", "max\n"), ("memory.current", "5\n")]);
        let c = Cgroup::find(root.path(), "0::/kubepods/pod1/ctr\n").unwrap();
        assert_eq!(c.limit(), None);
        let unlimited = tree(
            "memory",
            &[("memory.limit_in_bytes", "9223372036854771712\n")],
        );
        let c = Cgroup::find(unlimited.path(), "4:memory:/\n").unwrap();
        assert_eq!(c.limit(), None);
        assert_eq!(Cgroup::find(root.path(), "garbage"), None);
    }

    #[test]
    fn rows_stop_past_full_and_start_again_under_roomy() {
        let room = Room::default();
        assert!(room.has_room());
        assert_eq!(room.observe(890, 1000), None);
        assert_eq!(room.observe(900, 1000), Some(true));
        assert!(!room.has_room());
        // Between the two: still full (no flapping at the edge).
        assert_eq!(room.observe(870, 1000), None);
        assert_eq!(room.observe(849, 1000), Some(false));
        assert!(room.has_room());
    }
}
