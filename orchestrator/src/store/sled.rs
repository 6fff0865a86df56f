//! The store on sled: one server, everything in one tree (a sled batch is
//! atomic within one tree), each batch applied and flushed before it is
//! acknowledged. Reads go straight to sled; they may see a batch that is
//! being flushed (not yet acknowledged), which is the price of not copying
//! the tree.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use super::{
    decode, log_key, read_counter, Base, Batcher, Change, Published, StoreError, StoreOptions, Visit, KEY_LOG_START,
    KEY_RV,
};

pub(super) struct SledBackend {
    db: sled::Db,
    tree: sled::Tree,
    /// The data dir, named in disk-full errors and checked for free space.
    dir: PathBuf,
    /// Set by the first failed batch; see `StoreError::Broken`.
    broken: std::sync::Mutex<Option<(String, bool)>>,
}

impl SledBackend {
    /// Opens the data under `dir`; returns it with its version and log start.
    pub(super) fn open(dir: &Path, options: &StoreOptions) -> Result<(SledBackend, u64, u64), StoreError> {
        let db = sled::Config::new().path(dir).cache_capacity(options.cache_bytes).open()?;
        let tree = db.open_tree("objects")?;
        let rv = read_counter(tree.get(KEY_RV)?.as_deref());
        let log_start = read_counter(tree.get(KEY_LOG_START)?.as_deref()).max(1);
        let backend = SledBackend { db, tree, dir: dir.to_path_buf(), broken: std::sync::Mutex::new(None) };
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
        let mut batch = sled::Batch::default();
        for (rv, bytes) in std::mem::take(&mut b.log) {
            batch.insert(log_key(rv), bytes);
        }
        for (k, v) in std::mem::take(&mut b.writes) {
            match v {
                Some(v) => batch.insert(k, v),
                None => batch.remove(k),
            }
        }
        batch.insert(KEY_RV, &b.rv.to_be_bytes());
        // Compact the log to its bound in the same batch.
        let start = b.base.log_start;
        let new_start = b.rv.saturating_sub(options.log_keep).max(start);
        if new_start > start {
            for rv in start..new_start {
                batch.remove(log_key(rv));
            }
            batch.insert(KEY_LOG_START, &new_start.to_be_bytes());
        }
        self.tree.apply_batch(batch)?;
        self.db.flush()?;
        Ok(new_start)
    }

    #[cfg(test)]
    pub(super) fn is_broken(&self) -> bool {
        self.broken.lock().map(|b| b.is_some()).unwrap_or(true)
    }
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
