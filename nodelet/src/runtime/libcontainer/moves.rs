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
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

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
    /// The warmer of this host: moves into the agent's own cgroup on the
    /// unified hierarchy, or none when a hierarchy is already mounted
    /// `favordynmods` or the agent has no such cgroup (a v1-only host).
    pub fn for_host() -> Warmer {
        let host = crate::host::RealHost;
        if std::fs::read_to_string("/proc/self/mountinfo").is_ok_and(|m| favors_dynmods(&m)) {
            tracing::debug!("a cgroup hierarchy is mounted favordynmods: no warming of cgroup moves");
            return Warmer::default();
        }
        if super::cgroups::own_procs(&host).is_none() {
            return Warmer::default();
        }
        let mut open: Option<File> = None;
        Warmer::with(move |first| {
            // Found again at each burst: the agent may have moved itself since.
            if first || open.is_none() {
                let procs = super::cgroups::own_procs(&host)
                    .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "this process's cgroup"))?;
                open = Some(std::fs::OpenOptions::new().write(true).open(procs)?);
            }
            // "0" is the writer itself: the agent, into where it already is.
            open.as_mut().map_or(Ok(()), |f| f.write_all(b"0"))
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
/// one hierarchy is enough). Reads mountinfo's super options, after " - ".
fn favors_dynmods(mountinfo: &str) -> bool {
    mountinfo.lines().filter_map(|l| l.split_once(" - ")).any(|(_, fs)| {
        let mut f = fs.split(' ');
        let (kind, options) = (f.next(), f.nth(1));
        matches!(kind, Some("cgroup" | "cgroup2")) && options.is_some_and(|o| o.split(',').any(|o| o == "favordynmods"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Instant;

    #[test]
    fn favordynmods_is_read_from_a_cgroup_mounts_super_options() {
        let mountinfo = |line: &str| format!("25 30 0:22 / /sys rw,nosuid - sysfs sysfs rw\n{line}\n");
        let cases = [
            ("34 33 0:29 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate,favordynmods", true),
            ("37 33 0:32 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids,favordynmods", true),
            ("34 33 0:29 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate", false),
            // Another file system's option of that name, or the word in a mount point.
            ("40 1 0:40 / /mnt rw - tmpfs tmpfs rw,favordynmods", false),
            ("41 1 0:41 / /favordynmods rw - cgroup2 cgroup2 rw", false),
        ];
        for (line, expected) in cases {
            assert_eq!(favors_dynmods(&mountinfo(line)), expected, "{line}");
        }
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
