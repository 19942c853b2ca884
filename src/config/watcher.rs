//! The config file's watcher: a reload when what `dtf.toml` resolves to
//! changes — an editor's save (a new file renamed over the old), an edit of
//! a link's target, a Kubernetes ConfigMap's `..data` swap. The daemons'
//! control loop turns each into a reload (the watcher only calls back).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tracing::warn;

/// A running watcher: dropping it stops the watching.
pub type Watcher = Arc<std::sync::Mutex<notify::RecommendedWatcher>>;

/// What the config file is now: the file its path resolves to (through
/// any symbolic links) and that file's identity and last change. A reload
/// is sent when it differs from the last one seen.
type ConfigSignature = Option<(PathBuf, u64, u64, std::time::SystemTime, u64)>;

fn config_signature(path: &Path) -> ConfigSignature {
    use std::os::unix::fs::MetadataExt;
    let target = std::fs::canonicalize(path).ok()?;
    let m = std::fs::metadata(&target).ok()?;
    Some((target, m.dev(), m.ino(), m.modified().ok()?, m.len()))
}

/// Adds `dir` to what `watcher` watches.
fn watch_dir(
    watcher: &std::sync::Mutex<notify::RecommendedWatcher>,
    dir: &Path,
) -> notify::Result<()> {
    use notify::{RecursiveMode, Watcher};
    let mut w = watcher.lock().unwrap_or_else(|e| e.into_inner());
    w.watch(dir, RecursiveMode::NonRecursive)
}

/// Watches the directory of the file `sig` resolves to (unless it is the
/// config's own directory `dir`) instead of `target_dir`, the one before.
fn follow_target(
    watcher: &std::sync::Mutex<notify::RecommendedWatcher>,
    dir: &Path,
    target_dir: &mut Option<PathBuf>,
    sig: &ConfigSignature,
) {
    use notify::Watcher;
    let d = sig
        .as_ref()
        .and_then(|s| s.0.parent())
        .map(Path::to_path_buf);
    if d.is_none() || d == *target_dir || d.as_deref() == Some(dir) {
        return;
    }
    if let Some(old) = target_dir.take() {
        let _ = watcher
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .unwatch(&old);
    }
    if let Some(d) = &d
        && let Err(e) = watch_dir(watcher, d)
    {
        warn!(dir = %d.display(), error = %e, "Cannot watch the directory the config links to; reload with SIGHUP after editing it.");
    }
    *target_dir = d;
}

/// `path`, every link on the way to the file it resolves to (and the
/// directories those links name: a ConfigMap's `..data`), and that file.
fn link_chain(path: &Path) -> std::collections::HashSet<PathBuf> {
    let mut out = std::collections::HashSet::from([path.to_path_buf()]);
    let mut at = path.to_path_buf();
    // As the kernel's own bound on links followed.
    for _ in 0..40 {
        let Ok(target) = std::fs::read_link(&at) else {
            break;
        };
        let target = match at.parent() {
            Some(dir) if target.is_relative() => dir.join(target),
            _ => target,
        };
        out.extend(target.ancestors().map(Path::to_path_buf));
        at = target;
    }
    if let Ok(resolved) = std::fs::canonicalize(path) {
        out.insert(resolved);
    }
    out
}

/// Watches the config file's directory (editors replace files rather than
/// write them in place) and, when the config is a symbolic link, the
/// directory of the file it resolves to (an edit of the target), and sends
/// `changed()` when what the path resolves to changed: its
/// target, or the target's contents. A Kubernetes ConfigMap mount is
/// `dtf.toml -> ..data/dtf.toml` with `..data` swapped for a new
/// directory: that is an event in the config's directory, under another
/// name, and a new target, whose directory is then watched too.
///
/// Returns the watcher, to keep for as long as the file is to be watched;
/// `None` (logged, reload with SIGHUP) when it cannot watch. Stops when
/// `changed` returns false (nobody listens any more).
pub fn watch(path: &Path, changed: impl Fn() -> bool + Send + 'static) -> Option<Watcher> {
    use notify::EventKind;
    let path = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let dir = path.parent()?.to_path_buf();
    let (ev_tx, mut ev_rx) = mpsc::unbounded_channel::<()>();
    // The paths whose events matter (a busy directory's other files do
    // not, and would keep the debounce below from ever settling).
    let names = Arc::new(std::sync::Mutex::new(link_chain(&path)));
    let seen_names = names.clone();
    let watcher = notify::recommended_watcher(move |ev: notify::Result<notify::Event>| {
        if let Ok(ev) = ev
            && matches!(
                ev.kind,
                EventKind::Create(_) | EventKind::Modify(_) | EventKind::Remove(_)
            )
        {
            let names = seen_names.lock().unwrap_or_else(|e| e.into_inner());
            if ev.paths.iter().any(|p| names.contains(p)) {
                let _ = ev_tx.send(());
            }
        }
    })
    .map_err(|e| warn!(error = %e, "Config file watcher unavailable; reload with SIGHUP."))
    .ok()?;
    let watcher = Arc::new(std::sync::Mutex::new(watcher));
    if let Err(e) = watch_dir(&watcher, &dir) {
        warn!(dir = %dir.display(), error = %e, "Cannot watch the config directory; reload with SIGHUP.");
        return None;
    }
    let mut seen = config_signature(&path);
    // The directory of the file a link resolves to: watched as well.
    let mut target_dir = None;
    follow_target(&watcher, &dir, &mut target_dir, &seen);
    let shared = watcher.clone();
    // Debounce: an editor's save is several events; reload once they settle.
    tokio::spawn(async move {
        while ev_rx.recv().await.is_some() {
            while let Ok(Some(())) =
                tokio::time::timeout(Duration::from_millis(200), ev_rx.recv()).await
            {}
            let now = config_signature(&path);
            if now == seen {
                continue;
            }
            *names.lock().unwrap_or_else(|e| e.into_inner()) = link_chain(&path);
            follow_target(&shared, &dir, &mut target_dir, &now);
            // A path that resolves to nothing (mid-swap, or removed) is not
            // a change to act on: the next event that brings it back is.
            let gone = now.is_none();
            seen = now;
            if !gone && !changed() {
                return;
            }
        }
    });
    Some(watcher)
}
