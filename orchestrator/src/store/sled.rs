//! The store on sled: one server, everything in one tree (a sled batch is
//! atomic within one tree), each batch applied and flushed before it is
//! acknowledged. Reads go straight to sled; they may see a batch that is
//! being flushed (not yet acknowledged), which is the price of not copying
//! the tree.
//!
//! The change log is trimmed in the same batch that grows it, to
//! `StoreOptions::log_keep` versions and `log_keep_bytes` bytes: every entry
//! holds a whole object (a deletion the object as it was), so a count alone
//! let churn of big objects keep gigabytes of history, which sled then
//! amplifies (a leaf of up to 16 such entries is rewritten whole as one blob).

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Mutex;

use super::{
    decode, log_key, read_counter, Base, Batcher, Change, Published, StoreError, StoreOptions, Visit, KEY_LOG_START,
    KEY_RV, LOG_PREFIX,
};

pub(super) struct SledBackend {
    db: sled::Db,
    tree: sled::Tree,
    /// The data dir, named in disk-full errors and checked for free space.
    dir: PathBuf,
    /// Set by the first failed batch; see `StoreError::Broken`.
    broken: Mutex<Option<(String, bool)>>,
    /// The change log's entries as stored, oldest first: what the byte bound
    /// trims. Changed only by the committer, after its batch is durable.
    log: Mutex<LogSizes>,
}

/// Each change-log entry's version and size (key and value), and their sum.
#[derive(Debug, Default)]
struct LogSizes {
    entries: VecDeque<(u64, u64)>,
    bytes: u64,
}

/// What one batch does to the change log.
#[derive(Debug, PartialEq, Eq)]
struct Trim {
    /// The new entries to write (a batch bigger than the bound may lose its oldest ones at once).
    keep_new: usize,
    /// How many of the stored entries to remove, oldest first.
    drop_old: usize,
    /// The log's start after the batch.
    start: u64,
}

impl LogSizes {
    /// The entries dropped so that at most `keep` versions and `keep_bytes`
    /// bytes remain once `new` (the batch's entries, oldest first) is added;
    /// the newest entry always stays, whatever its size, so a watch from just
    /// before it still resumes. `rv` is the batch's last version.
    fn trim(&self, new: &[(u64, u64)], rv: u64, start: u64, keep: u64, keep_bytes: u64) -> Trim {
        let by_count = rv.saturating_sub(keep);
        let mut bytes = self.bytes + new.iter().map(|(_, b)| b).sum::<u64>();
        let mut left = self.entries.len() + new.len();
        let mut start = start.max(by_count);
        let mut dropped = 0usize;
        for &(entry_rv, size) in self.entries.iter().chain(new) {
            let too_big = bytes > keep_bytes && left > 1;
            if !too_big && entry_rv >= start {
                break;
            }
            bytes -= size;
            left -= 1;
            dropped += 1;
            start = start.max(entry_rv + 1);
        }
        let drop_old = dropped.min(self.entries.len());
        Trim { keep_new: new.len() - (dropped - drop_old), drop_old, start }
    }
}

impl SledBackend {
    /// Opens the data under `dir`; returns it with its version and log start.
    pub(super) fn open(dir: &Path, options: &StoreOptions) -> Result<(SledBackend, u64, u64), StoreError> {
        let db =
            sled::Config::new().path(dir).cache_capacity(options.cache_bytes).segment_size(segment_size(dir)).open()?;
        let tree = db.open_tree("objects")?;
        let rv = read_counter(tree.get(KEY_RV)?.as_deref());
        let log_start = read_counter(tree.get(KEY_LOG_START)?.as_deref()).max(1);
        // Reads every entry once (sled has no key-only scan); the bound keeps
        // that small, except on the first open of a store written before it.
        let mut log = LogSizes::default();
        for kv in tree.scan_prefix(LOG_PREFIX) {
            let (k, v) = kv?;
            let size = (k.len() + v.len()) as u64;
            log.entries.push_back((read_counter(Some(&k[LOG_PREFIX.len()..])), size));
            log.bytes += size;
        }
        let backend = SledBackend { db, tree, dir: dir.to_path_buf(), broken: Mutex::new(None), log: Mutex::new(log) };
        Ok((backend, rv, log_start))
    }

    pub(super) fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.tree.get(key)?.map(|v| v.to_vec()))
    }

    pub(super) fn scan(&self, prefix: &[u8], f: &mut Visit<'_>) -> Result<(), StoreError> {
        for kv in self.tree.scan_prefix(prefix) {
            let (k, v) = kv?;
            f(&k, &v)?;
        }
        Ok(())
    }

    /// One server, one committer: what it published is the whole truth.
    pub(super) fn base(&self, published: &Published) -> Base {
        Base {
            rv: published.rv.load(Ordering::Acquire),
            revision: 0,
            log_start: published.log_start.load(Ordering::Acquire),
        }
    }

    pub(super) fn log_range(&self, from: u64, to: u64) -> Result<Vec<Change>, StoreError> {
        let mut out = Vec::new();
        for kv in self.tree.range(log_key(from)..=log_key(to)) {
            let (k, v) = kv?;
            out.push(decode(&k, &v)?);
        }
        Ok(out)
    }

    pub(super) async fn flush(&self) -> Result<(), StoreError> {
        self.db.flush_async().await?;
        Ok(())
    }

    pub(super) fn final_flush(&self) {
        if let Err(e) = self.db.flush() {
            tracing::error!(error = %e, "final store flush failed");
        }
    }

    /// Applies the batch as one sled batch, flushes, then publishes it.
    pub(super) fn commit(
        &self,
        b: &mut Batcher,
        published: &Published,
        options: StoreOptions,
    ) -> Result<(), StoreError> {
        let result = self.apply(b, options);
        if let Err(e @ StoreError::Sled(_)) = &result {
            let mut broken = self.broken.lock().unwrap_or_else(|p| p.into_inner());
            broken.get_or_insert_with(|| (e.to_string(), e.is_disk_full()));
        }
        let log_start = result?;
        published.publish(b.rv, log_start, std::mem::take(&mut b.changes));
        Ok(())
    }

    fn apply(&self, b: &mut Batcher, options: StoreOptions) -> Result<u64, StoreError> {
        if let Some((cause, disk_full)) = self.broken.lock().unwrap_or_else(|p| p.into_inner()).clone() {
            return Err(StoreError::Broken { dir: self.dir.clone(), cause, disk_full });
        }
        let size: usize = b.writes.iter().map(|(k, v)| k.len() + v.as_ref().map_or(0, Vec::len)).sum::<usize>()
            + b.log.iter().map(|(_, v)| v.len()).sum::<usize>();
        check_space(&self.dir, options.min_free_bytes.saturating_add(2 * size as u64))?;
        let mut log = self.log.lock().unwrap_or_else(|p| p.into_inner());
        let new: Vec<(u64, u64)> = b.log.iter().map(|(rv, v)| (*rv, (log_key(*rv).len() + v.len()) as u64)).collect();
        let trim = log.trim(&new, b.rv, b.base.log_start, options.log_keep, options.log_keep_bytes);
        let mut batch = sled::Batch::default();
        let skip = new.len() - trim.keep_new;
        for (rv, bytes) in std::mem::take(&mut b.log).into_iter().skip(skip) {
            batch.insert(log_key(rv), bytes);
        }
        for &(rv, _) in log.entries.iter().take(trim.drop_old) {
            batch.remove(log_key(rv));
        }
        if trim.start > b.base.log_start {
            batch.insert(KEY_LOG_START, &trim.start.to_be_bytes());
        }
        for (k, v) in std::mem::take(&mut b.writes) {
            match v {
                Some(v) => batch.insert(k, v),
                None => batch.remove(k),
            }
        }
        batch.insert(KEY_RV, &b.rv.to_be_bytes());
        self.tree.apply_batch(batch)?;
        self.db.flush()?;
        for _ in 0..trim.drop_old {
            if let Some((_, size)) = log.entries.pop_front() {
                log.bytes -= size;
            }
        }
        for &(rv, size) in &new[skip..] {
            log.entries.push_back((rv, size));
            log.bytes += size;
        }
        Ok(trim.start.max(b.base.log_start))
    }

    /// The change log's entry count and bytes as stored, read from sled.
    #[cfg(test)]
    pub(super) fn log_stored(&self) -> Result<(usize, u64), StoreError> {
        let mut count = 0;
        let mut bytes = 0;
        for kv in self.tree.scan_prefix(LOG_PREFIX) {
            let (k, v) = kv?;
            count += 1;
            bytes += (k.len() + v.len()) as u64;
        }
        Ok((count, bytes))
    }

    #[cfg(test)]
    pub(super) fn is_broken(&self) -> bool {
        self.broken.lock().map(|b| b.is_some()).unwrap_or(true)
    }
}

/// sled's segment for a new store: 16 MiB, its largest. sled writes a page
/// bigger than a quarter segment (128 KiB at its default of 512 KiB) to a
/// blob file of its own, and in 0.34 those are not reclaimed as the page is
/// rewritten: churning 400 pods of 200 KB (a leaf holds up to 16 values, so
/// pages of megabytes) grew `blobs/` by about 0.7 GB a round with the log
/// bounded. At 16 MiB such a page stays in the log, whose segments sled
/// cleans. A store made before keeps its own size (sled refuses another),
/// read from sled's `conf` file.
const SEGMENT_BYTES: usize = 16 << 20;

fn segment_size(dir: &Path) -> usize {
    let Ok(conf) = std::fs::read_to_string(dir.join("conf")) else { return SEGMENT_BYTES };
    conf.lines()
        .find_map(|l| l.strip_prefix("segment_size: "))
        .and_then(|v| v.trim().parse().ok())
        // Unreadable: sled's own default, and sled's own error if that is wrong too.
        .unwrap_or(512 << 10)
}

/// Refuses a batch when the data dir's file system has less than `needed`
/// bytes free for this process (`f_bavail`: what root keeps back is not ours).
fn check_space(dir: &Path, needed: u64) -> Result<(), StoreError> {
    let available = match nix::sys::statvfs::statvfs(dir) {
        Ok(st) => st.blocks_available().saturating_mul(st.fragment_size()),
        Err(e) => {
            // Not knowing is no reason to refuse: sled's own error still stops a failed write.
            tracing::warn!(dir = %dir.display(), error = %e, "cannot read the free space of the data dir");
            return Ok(());
        }
    };
    if available < needed {
        return Err(StoreError::DiskFull { dir: dir.to_path_buf(), available, needed });
    }
    Ok(())
}

#[cfg(test)]
mod trim_tests {
    use super::{LogSizes, Trim};

    /// `stored` and `new` as `(version, bytes)`; the batch's version is the newest one.
    fn check(stored: &[(u64, u64)], new: &[(u64, u64)], start: u64, keep: u64, keep_bytes: u64, expected: Trim) {
        let log = LogSizes { entries: stored.iter().copied().collect(), bytes: stored.iter().map(|(_, b)| b).sum() };
        let rv = new.last().or(stored.last()).map_or(0, |(rv, _)| *rv);
        assert_eq!(log.trim(new, rv, start, keep, keep_bytes), expected, "{stored:?} + {new:?}");
    }

    #[test]
    fn trims_the_oldest_entries_by_count_or_bytes_and_keeps_the_newest() {
        let stored = [(1, 100), (2, 100), (3, 100)];
        // Within both bounds: nothing goes.
        check(&stored, &[(4, 100)], 1, 10, 1000, Trim { keep_new: 1, drop_old: 0, start: 1 });
        // Bytes: the two oldest go, the start moves past them.
        check(&stored, &[(4, 100)], 1, 10, 250, Trim { keep_new: 1, drop_old: 2, start: 3 });
        // Versions: those from `rv - keep` on (events take versions without entries).
        check(&stored, &[(6, 100)], 1, 3, 1000, Trim { keep_new: 1, drop_old: 2, start: 3 });
        // One entry bigger than the bound: it stays alone.
        check(&stored, &[(4, 5000)], 1, 10, 250, Trim { keep_new: 1, drop_old: 3, start: 4 });
        // A batch bigger than the bound loses its own oldest entries.
        check(&[], &[(1, 100), (2, 100), (3, 100)], 1, 10, 150, Trim { keep_new: 1, drop_old: 0, start: 3 });
        // The start never moves back.
        check(&[(9, 10)], &[(10, 10)], 9, 10, 1000, Trim { keep_new: 1, drop_old: 0, start: 9 });
    }
}
