//! Seeing a container's first output byte land in its log file without a
//! sleep-and-poll loop (which adds up to one sleep to every figure): inotify
//! on the log's folder (`IN_MODIFY`, raised by every write into a file there)
//! and `poll(2)` until the file is non-empty. The file's size is checked after
//! every wake-up, so a write before the watch existed is not missed either.

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};

pub struct LogWatch {
    inotify: Inotify,
    log: PathBuf,
}

impl LogWatch {
    /// Watches for writes to `log`; creates its folder when missing. Set it up
    /// before whatever writes the log starts.
    pub fn new(log: &Path) -> anyhow::Result<LogWatch> {
        let dir = log.parent().context("a log file has a folder")?;
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC).context("inotify_init")?;
        inotify
            .add_watch(dir, AddWatchFlags::IN_MODIFY | AddWatchFlags::IN_CLOSE_WRITE)
            .with_context(|| format!("watching {}", dir.display()))?;
        Ok(LogWatch { inotify, log: log.to_path_buf() })
    }

    /// Blocks until the log holds at least one byte; returns when that was
    /// seen. Fails at `deadline`.
    pub fn wait_first_byte(&self, deadline: Instant) -> anyhow::Result<Instant> {
        loop {
            if std::fs::metadata(&self.log).is_ok_and(|m| m.len() > 0) {
                return Ok(Instant::now());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                bail!("{}: still empty", self.log.display());
            }
            let ms = PollTimeout::try_from(left.as_millis().clamp(1, 10_000) as i32).unwrap_or(PollTimeout::MAX);
            let mut fds = [PollFd::new(self.inotify.as_fd(), PollFlags::POLLIN)];
            match poll(&mut fds, ms) {
                Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                Err(e) => bail!("poll on inotify: {e}"),
            }
            // Drain; the size check above decides.
            while self.inotify.read_events().is_ok_and(|ev| !ev.is_empty()) {}
        }
    }
}
