//! Container log files: the shim copies the container's stdout+stderr into
//! `log_path`, rotating it when it reaches `max_bytes` (`log_path.1` is the
//! newest old file; at most `keep` old files stay).

use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

pub(crate) const DEFAULT_MAX_BYTES: u64 = 10 << 20;
pub(crate) const DEFAULT_KEEP: usize = 2;

pub(crate) struct RotatingLog {
    path: PathBuf,
    max_bytes: u64,
    keep: usize,
    file: File,
    size: u64,
}

fn rotated(path: &Path, n: usize) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(format!(".{n}"));
    PathBuf::from(s)
}

impl RotatingLog {
    /// Opens (appends to) `path`, creating its parent directory; both are
    /// private (0700, 0600): a log holds whatever the container printed.
    pub(crate) fn open(path: &Path, max_bytes: u64, keep: usize) -> io::Result<Self> {
        if let Some(parent) = path.parent() {
            crate::fsutil::private_dir(parent)?;
        }
        let file = crate::fsutil::create_private(path, true)?;
        let size = file.metadata()?.len();
        Ok(Self { path: path.to_path_buf(), max_bytes: max_bytes.max(1), keep, file, size })
    }

    fn rotate(&mut self) -> io::Result<()> {
        if self.keep == 0 {
            self.file.set_len(0)?;
        } else {
            for n in (1..self.keep).rev() {
                let from = rotated(&self.path, n);
                if from.exists() {
                    std::fs::rename(&from, rotated(&self.path, n + 1))?;
                }
            }
            std::fs::rename(&self.path, rotated(&self.path, 1))?;
            self.file = crate::fsutil::create_private(&self.path, true)?;
        }
        self.size = 0;
        Ok(())
    }

    /// Appends `buf`, splitting it across files so no file exceeds `max_bytes`.
    pub(crate) fn write_all(&mut self, mut buf: &[u8]) -> io::Result<()> {
        while !buf.is_empty() {
            if self.size >= self.max_bytes {
                self.rotate()?;
            }
            let room = (self.max_bytes - self.size) as usize;
            let n = room.min(buf.len());
            self.file.write_all(&buf[..n])?;
            self.size += n as u64;
            buf = &buf[n..];
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotates_and_keeps_a_bounded_number_of_files() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("c.log");
        let mut log = RotatingLog::open(&path, 10, 2)?;
        log.write_all(b"0123456789abcdefghij")?;
        log.write_all(b"KLMNOPQRSTuvw")?;
        let read = |p: PathBuf| std::fs::read_to_string(p).unwrap_or_default();
        assert_eq!(read(path.clone()), "uvw");
        assert_eq!(read(rotated(&path, 1)), "KLMNOPQRST");
        assert_eq!(read(rotated(&path, 2)), "abcdefghij");
        assert!(!rotated(&path, 3).exists());
        // Reopening appends and counts what is already there.
        let mut log = RotatingLog::open(&path, 10, 2)?;
        log.write_all(b"1234567xy")?;
        assert_eq!(read(path.clone()), "xy");
        assert_eq!(read(rotated(&path, 1)), "uvw1234567");
        Ok(())
    }
}
