//! Keeps the kernel's cgroup-move lock on its fast path while containers
//! start.
//!
//! Every move of a process into a cgroup (a write to `cgroup.procs`, which
//! libcontainer makes for each new container) takes the kernel's one global
//! `cgroup_threadgroup_rwsem` for writing. Unless a cgroup hierarchy is
//! mounted with `favordynmods`, taking it from idle first waits for an RCU
//! grace period: 6-27 ms on this project's build host, on every container's
//! start path (`BENCHMARKS.md`). Once taken, the lock stays on its writers'
//! fast path for about one more grace period. So while a start is in flight
//! a thread of the agent moves the agent into the cgroup it is already in
//! (for the kernel a move of nobody) every few milliseconds: the first move
//! waits out the grace period beside the start's other steps, and the
//! container's own move finds the lock ready. The warming starts when a pod
//! arrives (`Runtime::expect_start`), before its checkpoint, and goes on for
//! `AFTER` past the last start (or `pinion exec`; not an exec probe, which
//! waits on nobody): the next start of an array, a queue or a script's loop
//! finds the lock ready, and an idle node does nothing.
//!
//! What it costs is what `favordynmods` costs a host all the time: meanwhile
//! forks and exits take the lock's slower read path, and the agent's thread
//! moves 500 times a second on the reserved CPUs. Here only around starts; a
//! host mounted `favordynmods` needs none of it.

use std::fs::File;
use std::io;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::host::unescape_mountinfo;

/// How often the lock is taken while a start is in flight: well within the
/// grace period it stays ready for after each.
const EVERY: Duration = Duration::from_millis(2);

/// How long the warming goes on after a start, or after a pod arrived.
const AFTER: Duration = Duration::from_secs(1);

/// Starts in flight, and whether the warming still works here.
#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Default)]
struct State {
    starts: u32,
    /// Warm until then even with no start in flight.
    until: Option<Instant>,
    /// A move failed once (no such file, refused): not tried again.
    off: bool,
}

impl State {
    fn wanted(&self, now: Instant) -> bool {
        !self.off && (self.starts > 0 || self.until.is_some_and(|u| now < u))
    }
}

/// The warming thread's handle; cloned by each runtime that starts
/// containers. Without a thread (none could be made, or nothing to warm) every
/// `hold` is a no-op.
#[derive(Clone, Default)]
pub struct Warmer {
    shared: Option<Arc<Shared>>,
}

/// A start in flight: the lock is kept warm until every hold is dropped.
pub struct Hold {
    shared: Option<Arc<Shared>>,
}

impl Warmer {
    /// The warmer of this host: moves into the agent's own cgroup, or none
    /// when a hierarchy is already mounted `favordynmods` or no cgroup of
    /// this process can be found.
    pub fn for_host() -> Warmer {
        let (Ok(mountinfo), Ok(cgroup)) =
            (std::fs::read_to_string("/proc/self/mountinfo"), std::fs::read_to_string("/proc/self/cgroup"))
        else {
            return Warmer::default();
        };
        if favors_dynmods(&mountinfo) {
            tracing::debug!("a cgroup hierarchy is mounted favordynmods: no warming of cgroup moves");
            return Warmer::default();
        }
        if own_procs(&mountinfo, &cgroup).is_none() {
            return Warmer::default();
        }
        let mut open: Option<File> = None;
        Warmer::with(move |first| {
            // Found again at each burst: the agent may have moved itself since.
            if first || open.is_none() {
                let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")?;
                let cgroup = std::fs::read_to_string("/proc/self/cgroup")?;
                let procs = own_procs(&mountinfo, &cgroup)
                    .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "this process's cgroup"))?;
                open = Some(std::fs::OpenOptions::new().write(true).open(procs)?);
            }
            // "0" is the writer itself: the agent, into where it already is.
            match &mut open {
                Some(f) => f.write_all(b"0"),
                None => Ok(()),
            }
        })
    }

    /// A warmer whose move is `mv`, told whether it starts a burst (tests
    /// count them).
    pub(crate) fn with(mv: impl FnMut(bool) -> io::Result<()> + Send + 'static) -> Warmer {
        let shared = Arc::new(Shared::default());
        let theirs = shared.clone();
        let spawned = std::thread::Builder::new().name("cgroup-moves".into()).spawn(move || warm(&theirs, mv));
        match spawned {
            Ok(_) => Warmer { shared: Some(shared) },
            Err(e) => {
                tracing::debug!(error = %e, "no thread to warm cgroup moves");
                Warmer::default()
            }
        }
    }

    /// Keeps the lock warm until the hold is dropped, and `AFTER` past it.
    pub fn hold(&self) -> Hold {
        if let Some(s) = &self.shared {
            let mut st = s.state.lock().unwrap_or_else(|p| p.into_inner());
            st.starts += 1;
            s.changed.notify_all();
        }
        Hold { shared: self.shared.clone() }
    }

    /// A start may come: warm for `AFTER` from now.
    pub fn expect(&self) {
        if let Some(s) = &self.shared {
            let mut st = s.state.lock().unwrap_or_else(|p| p.into_inner());
            st.until = st.until.max(Some(Instant::now() + AFTER));
            s.changed.notify_all();
        }
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        if let Some(s) = &self.shared {
            let mut st = s.state.lock().unwrap_or_else(|p| p.into_inner());
            st.starts = st.starts.saturating_sub(1);
            st.until = st.until.max(Some(Instant::now() + AFTER));
        }
    }
}

/// The thread: idle until warming is wanted, then a move every `EVERY`
/// until it is not. Ends when every warmer and hold is gone.
fn warm(shared: &Arc<Shared>, mut mv: impl FnMut(bool) -> io::Result<()>) {
    let mut first = true;
    loop {
        {
            let mut st = shared.state.lock().unwrap_or_else(|p| p.into_inner());
            while !st.wanted(Instant::now()) {
                first = true;
                // Only this thread's own reference left: nobody can hold again.
                if Arc::strong_count(shared) == 1 {
                    return;
                }
                let wait = match st.until {
                    Some(u) if !st.off && u > Instant::now() => u - Instant::now(),
                    _ => Duration::from_secs(1),
                };
                let (next, _) = shared.changed.wait_timeout(st, wait).unwrap_or_else(|p| p.into_inner());
                st = next;
            }
        }
        if let Err(e) = mv(std::mem::replace(&mut first, false)) {
            tracing::debug!(error = %e, "cannot warm cgroup moves here; starts take the kernel's wait");
            shared.state.lock().unwrap_or_else(|p| p.into_inner()).off = true;
            continue;
        }
        std::thread::sleep(EVERY);
    }
}

/// Whether a cgroup hierarchy is mounted with `favordynmods`: the kernel then
/// keeps the move lock's fast path open itself (the flag is the lock's, so
/// one hierarchy is enough).
fn favors_dynmods(mountinfo: &str) -> bool {
    mountinfo.lines().filter_map(cgroup_mount).any(|m| m.super_options.split(',').any(|o| o == "favordynmods"))
}

struct CgroupMount<'a> {
    /// The hierarchy's path at this mount's root.
    root: String,
    mount_point: String,
    v2: bool,
    super_options: &'a str,
}

/// A mountinfo line of a cgroup (v1 or v2) mount.
fn cgroup_mount(line: &str) -> Option<CgroupMount<'_>> {
    let (before, after) = line.split_once(" - ")?;
    let fields: Vec<&str> = before.split(' ').collect();
    let mut after = after.split(' ');
    let fstype = after.next()?;
    let _source = after.next()?;
    let super_options = after.next().unwrap_or("");
    let v2 = match fstype {
        "cgroup2" => true,
        "cgroup" => false,
        _ => return None,
    };
    Some(CgroupMount {
        root: unescape_mountinfo(fields.get(3)?),
        mount_point: unescape_mountinfo(fields.get(4)?),
        v2,
        super_options,
    })
}

/// The `cgroup.procs` of this process's own cgroup in a mounted hierarchy:
/// the v2 one when mounted, else a v1 one (any will do: the lock is shared).
fn own_procs(mountinfo: &str, proc_self_cgroup: &str) -> Option<PathBuf> {
    let mounts: Vec<CgroupMount<'_>> = mountinfo.lines().filter_map(cgroup_mount).collect();
    let mut found = None;
    for line in proc_self_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next()) else { continue };
        let mount = mounts.iter().find(|m| {
            if id == "0" && controllers.is_empty() {
                m.v2
            } else {
                // A named hierarchy (`name=systemd`) has no controller to move with; skip it.
                !m.v2
                    && !controllers.is_empty()
                    && !controllers.starts_with("name=")
                    && controllers.split(',').all(|c| m.super_options.split(',').any(|o| o == c))
            }
        });
        let Some(m) = mount else { continue };
        // The cgroup as seen from this mount's root (a mount of a subtree).
        let Ok(inside) = Path::new(path).strip_prefix(&m.root) else { continue };
        let procs = Path::new(&m.mount_point).join(inside).join("cgroup.procs");
        if m.v2 {
            return Some(procs);
        }
        found.get_or_insert(procs);
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Instant;

    const HYBRID: &str = "\
25 30 0:22 / /sys rw,nosuid - sysfs sysfs rw
33 25 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw,mode=755
34 33 0:29 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw,nsdelegate
35 33 0:30 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,xattr,name=systemd
36 33 0:31 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct
37 33 0:32 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids
";

    #[test]
    fn the_own_cgroup_is_found_in_v2_first_then_v1() {
        let cases: &[(&str, &str, Option<&str>)] = &[
            // Hybrid: the unified hierarchy wins.
            (
                HYBRID,
                "2:pids:/user.slice\n1:name=systemd:/user.slice\n0::/user.slice/a\n",
                Some("/sys/fs/cgroup/unified/user.slice/a/cgroup.procs"),
            ),
            // v1 only: a controller's hierarchy, never the named one; joint controllers match their mount.
            (
                &HYBRID.replace("cgroup2 cgroup2", "tmpfs tmpfs"),
                "3:cpu,cpuacct:/x\n1:name=systemd:/y\n0::/\n",
                Some("/sys/fs/cgroup/cpu,cpuacct/x/cgroup.procs"),
            ),
            // A mount of a subtree: the path is taken from its root.
            (
                "40 1 0:33 /pinion /mnt/cg rw - cgroup2 cgroup2 rw\n",
                "0::/pinion/supervisor\n",
                Some("/mnt/cg/supervisor/cgroup.procs"),
            ),
            // Outside the mounted subtree, or no cgroup mount at all: none.
            ("40 1 0:33 /pinion /mnt/cg rw - cgroup2 cgroup2 rw\n", "0::/other\n", None),
            ("25 30 0:22 / /sys rw - sysfs sysfs rw\n", "0::/\n", None),
        ];
        for (mountinfo, cgroup, expected) in cases {
            assert_eq!(own_procs(mountinfo, cgroup), expected.map(PathBuf::from), "{cgroup:?}");
        }
        assert!(!favors_dynmods(HYBRID));
        assert!(favors_dynmods(&HYBRID.replace("rw,nsdelegate", "rw,nsdelegate,favordynmods")));
    }

    /// Waits until `f` holds, within a generous bound.
    fn eventually(what: &str, f: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !f() {
            assert!(Instant::now() < deadline, "{what}: not within 10 s");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn moves_run_while_a_start_is_held_and_stop_after() {
        let moves = Arc::new(AtomicU32::new(0));
        let bursts = Arc::new(AtomicU32::new(0));
        let (counted, burst) = (moves.clone(), bursts.clone());
        let warmer = Warmer::with(move |first| {
            counted.fetch_add(1, Ordering::SeqCst);
            burst.fetch_add(u32::from(first), Ordering::SeqCst);
            Ok(())
        });
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(moves.load(Ordering::SeqCst), 0, "nothing moves while no start is in flight");
        let (a, b) = (warmer.hold(), warmer.hold());
        eventually("moves while held", || moves.load(Ordering::SeqCst) >= 3);
        drop(a);
        let seen = moves.load(Ordering::SeqCst);
        eventually("moves while the second hold lasts", || moves.load(Ordering::SeqCst) >= seen + 3);
        drop(b);
        let seen = moves.load(Ordering::SeqCst);
        eventually("moves for a while after the last hold", || moves.load(Ordering::SeqCst) >= seen + 3);
        eventually("no move once that while is over", || {
            let before = moves.load(Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(50));
            moves.load(Ordering::SeqCst) == before
        });
        assert_eq!(bursts.load(Ordering::SeqCst), 1, "one burst: the cgroup is looked up once");
        // A pod's arrival warms without a hold, then stops by itself.
        warmer.expect();
        eventually("moves after an arrival", || bursts.load(Ordering::SeqCst) == 2);
        eventually("no move once that while is over", || {
            let before = moves.load(Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(50));
            moves.load(Ordering::SeqCst) == before
        });
    }

    #[test]
    fn a_move_that_fails_is_not_tried_again() {
        let tries = Arc::new(AtomicU32::new(0));
        let counted = tries.clone();
        let warmer = Warmer::with(move |_| {
            counted.fetch_add(1, Ordering::SeqCst);
            Err(io::Error::from(io::ErrorKind::PermissionDenied))
        });
        let _held = warmer.hold();
        eventually("the first try", || tries.load(Ordering::SeqCst) == 1);
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(tries.load(Ordering::SeqCst), 1);
        warmer.expect();
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(tries.load(Ordering::SeqCst), 1, "nor after an arrival");
        // Without a thread every call is a no-op.
        Warmer::default().expect();
        drop(Warmer::default().hold());
    }
}
