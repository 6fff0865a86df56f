//! The durable object store: pods, nodes and events in sled, one monotonic
//! resource version for the whole store, and a change log that watchers replay.
//!
//! Writes go through one committer thread. Each write is a closure that reads
//! the current state and stages puts and deletes (a read-modify-write, never
//! racing another write); the committer takes every queued write, applies them
//! as ONE sled batch (atomic: objects, change-log entries and the version counter
//! together), calls `flush()` once (group commit), and only then answers the
//! callers and publishes the changes to watchers, in version order. So a caller
//! that got an answer holds a durable write, and a watcher never sees a change
//! that a crash could take back.
//!
//! Everything lives in one sled tree under key prefixes (`pod/`, `node/`,
//! `event/`, `log/`, `meta/`, `claim/`) because a sled batch is atomic within one tree.
//! Reads go straight to sled; they may see a batch that is being flushed (not
//! yet acknowledged), which is the price of not copying the tree.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use specs::api::{Event, Node, WatchEventType};
use specs::pod::ObjectMeta;
use specs::Pod;
use tokio::sync::{broadcast, mpsc, oneshot, watch};

/// How many change-log entries are kept for watch resumption.
pub const DEFAULT_LOG_KEEP: u64 = 50_000;
/// How many events are kept per object (oldest dropped first).
const EVENTS_PER_OBJECT: usize = 32;
/// Most writes folded into one batch and one flush.
const MAX_BATCH: usize = 1024;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("sled: {0}")]
    Sled(#[from] sled::Error),
    #[error("stored {key}: cannot decode: {source}")]
    Decode { key: String, source: serde_json::Error },
    #[error("cannot encode {key}: {source}")]
    Encode { key: String, source: serde_json::Error },
    #[error("the write was not stored: {0}")]
    Failed(Arc<StoreError>),
    /// Checked before every batch, so that sled never meets ENOSPC (it
    /// poisons itself on a write error until it is opened again).
    #[error("the data dir {} is full: {available} bytes free, writes need {needed}; free space there and writes resume", dir.display())]
    DiskFull { dir: PathBuf, available: u64, needed: u64 },
    /// A batch failed inside sled: sled keeps refusing after a write error,
    /// and a batch it applied in memory may show in reads without being
    /// durable, so every later write is refused until the server restarts.
    #[error("the store under {} refuses writes since a write failed ({cause}); restart the server{}", dir.display(), if *disk_full { " once the data dir has free space (it is full)" } else { "" })]
    Broken { dir: PathBuf, cause: String, disk_full: bool },
    #[error("the store is closed")]
    Closed,
    #[error("resource version {requested} is too old: changes before {oldest} were compacted; list again and watch from the list's version")]
    Gone { requested: u64, oldest: u64 },
    #[error("resourceVersion {requested} is newer than the store's current version {current}; list again and watch from the list's version")]
    Future { requested: u64, current: u64 },
}

impl StoreError {
    /// Whether the data dir's file system is full (the API's 507).
    pub fn is_disk_full(&self) -> bool {
        match self {
            StoreError::DiskFull { .. } => true,
            StoreError::Broken { disk_full, .. } => *disk_full,
            StoreError::Failed(inner) => inner.is_disk_full(),
            StoreError::Sled(sled::Error::Io(e)) => e.kind() == std::io::ErrorKind::StorageFull,
            _ => false,
        }
    }
}

/// The kinds of objects stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Kind {
    Pod,
    Node,
    Event,
}

impl Kind {
    fn prefix(self) -> &'static str {
        match self {
            Kind::Pod => "pod/",
            Kind::Node => "node/",
            Kind::Event => "event/",
        }
    }
}

/// A stored object type: its kind and its metadata.
pub trait Object: Serialize + DeserializeOwned + Send + 'static {
    const KIND: Kind;
    fn meta(&self) -> &ObjectMeta;
    fn meta_mut(&mut self) -> &mut ObjectMeta;
    /// For pods: the node it is bound to (watch filters by it).
    fn node_name(&self) -> Option<&str> {
        None
    }
}

impl Object for Pod {
    const KIND: Kind = Kind::Pod;
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
    fn node_name(&self) -> Option<&str> {
        self.spec.node_name.as_deref()
    }
}

impl Object for Node {
    const KIND: Kind = Kind::Node;
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl Object for Event {
    const KIND: Kind = Kind::Event;
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// One committed change, as kept in the log and sent to watchers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Change {
    pub rv: u64,
    pub kind: Kind,
    pub name: String,
    #[serde(rename = "type")]
    pub event_type: WatchEventType,
    /// The object's JSON after the change (before it, for a deletion).
    pub object: String,
    /// For pods: the node the pod is bound to after the change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    /// For pods: the node it was bound to before (so a node's watch sees a pod leave).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prev_node_name: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

const KEY_RV: &[u8] = b"meta/rv";
const KEY_LOG_START: &[u8] = b"meta/log_start";
const LOG_PREFIX: &str = "log/";

fn object_key(kind: Kind, name: &str) -> Vec<u8> {
    format!("{}{name}", kind.prefix()).into_bytes()
}

fn log_key(rv: u64) -> Vec<u8> {
    let mut k = LOG_PREFIX.as_bytes().to_vec();
    k.extend_from_slice(&rv.to_be_bytes());
    k
}

/// What `Txn::claim` found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// The name was free; it is this holder's now.
    New,
    /// This holder had it already (a retry).
    Again,
    /// Another holder has it.
    Taken,
}

fn claim_key(space: &str, name: &str) -> Vec<u8> {
    format!("claim/{space}/{name}").into_bytes()
}

fn event_prefix(kind: Kind, name: &str) -> String {
    format!("event/{kind:?}/{name}/")
}

fn read_u64(tree: &sled::Tree, key: &[u8]) -> Result<u64, StoreError> {
    Ok(match tree.get(key)? {
        Some(v) if v.len() == 8 => {
            let mut b = [0u8; 8];
            b.copy_from_slice(&v);
            u64::from_be_bytes(b)
        }
        _ => 0,
    })
}

fn decode<T: DeserializeOwned>(key: &[u8], bytes: &[u8]) -> Result<T, StoreError> {
    serde_json::from_slice(bytes)
        .map_err(|source| StoreError::Decode { key: String::from_utf8_lossy(key).into_owned(), source })
}

/// A write in progress: reads see the store plus this batch's earlier writes.
pub struct Txn<'a> {
    batch: &'a Batcher,
    writes: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    changes: Vec<Change>,
    rv: u64,
}

impl Txn<'_> {
    fn read_raw(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        if let Some(v) = self.writes.get(key) {
            return Ok(v.clone());
        }
        if let Some(v) = self.batch.overlay.get(key) {
            return Ok(v.clone());
        }
        Ok(self.batch.tree.get(key)?.map(|v| v.to_vec()))
    }

    pub fn get<T: Object>(&self, name: &str) -> Result<Option<T>, StoreError> {
        let key = object_key(T::KIND, name);
        match self.read_raw(&key)? {
            Some(v) => Ok(Some(decode(&key, &v)?)),
            None => Ok(None),
        }
    }

    fn next_rv(&mut self) -> u64 {
        self.rv += 1;
        self.rv
    }

    /// Stores the object under its name with a new resource version (set on `obj`).
    pub fn put<T: Object>(&mut self, obj: &mut T) -> Result<u64, StoreError> {
        let name = obj.meta().name.clone();
        let key = object_key(T::KIND, &name);
        let prev: Option<T> = match self.read_raw(&key)? {
            Some(v) => Some(decode(&key, &v)?),
            None => None,
        };
        let rv = self.next_rv();
        obj.meta_mut().resource_version = Some(rv);
        let bytes = serde_json::to_vec(obj)
            .map_err(|source| StoreError::Encode { key: String::from_utf8_lossy(&key).into_owned(), source })?;
        let change = Change {
            rv,
            kind: T::KIND,
            name,
            event_type: if prev.is_some() { WatchEventType::Modified } else { WatchEventType::Added },
            object: String::from_utf8_lossy(&bytes).into_owned(),
            node_name: obj.node_name().map(str::to_string),
            prev_node_name: prev.as_ref().and_then(|p| p.node_name()).map(str::to_string),
            labels: obj.meta().labels.clone(),
        };
        self.writes.insert(key, Some(bytes));
        self.changes.push(change);
        Ok(rv)
    }

    /// Removes the object (and, for pods and nodes, its events); returns it as it was.
    pub fn delete<T: Object>(&mut self, name: &str) -> Result<Option<T>, StoreError> {
        let key = object_key(T::KIND, name);
        let Some(raw) = self.read_raw(&key)? else { return Ok(None) };
        let mut prev: T = decode(&key, &raw)?;
        let rv = self.next_rv();
        prev.meta_mut().resource_version = Some(rv);
        let object = serde_json::to_string(&prev)
            .map_err(|source| StoreError::Encode { key: String::from_utf8_lossy(&key).into_owned(), source })?;
        self.changes.push(Change {
            rv,
            kind: T::KIND,
            name: name.to_string(),
            event_type: WatchEventType::Deleted,
            object,
            node_name: None,
            prev_node_name: prev.node_name().map(str::to_string),
            labels: prev.meta().labels.clone(),
        });
        self.writes.insert(key, None);
        self.remove_events(T::KIND, name);
        Ok(Some(prev))
    }

    /// Removes a record of `kind` that does not decode, and its events, as
    /// `delete` would; with no change-log entry, since no watcher could have
    /// read it. The way out of a record that `list` skips. Returns whether
    /// there was such a record (a readable one is left alone).
    pub fn purge_unreadable<T: Object>(&mut self, name: &str) -> Result<bool, StoreError> {
        let key = object_key(T::KIND, name);
        let Some(raw) = self.read_raw(&key)? else { return Ok(false) };
        if let Err(e) = decode::<T>(&key, &raw) {
            tracing::warn!(key = %String::from_utf8_lossy(&key), reason = %e, "removing a stored record that cannot be decoded");
            self.writes.insert(key, None);
            self.remove_events(T::KIND, name);
            return Ok(true);
        }
        Ok(false)
    }

    /// An object's events go with it.
    fn remove_events(&mut self, kind: Kind, name: &str) {
        for (k, _) in self.batch.tree.scan_prefix(event_prefix(kind, name)).flatten() {
            self.writes.insert(k.to_vec(), None);
        }
    }

    /// Takes `name` in `space` for `holder` for good (a node name at its join).
    /// A claim is no object: it has no version and no watcher sees it; being
    /// in the same batch as the check, two claims never both succeed.
    pub fn claim(&mut self, space: &str, name: &str, holder: &[u8]) -> Result<Claim, StoreError> {
        let key = claim_key(space, name);
        if let Some(held) = self.read_raw(&key)? {
            let again = !holder.is_empty() && held.as_slice() == holder;
            return Ok(if again { Claim::Again } else { Claim::Taken });
        }
        self.writes.insert(key, Some(holder.to_vec()));
        Ok(Claim::New)
    }

    /// Frees a claimed name; returns whether it was claimed.
    pub fn release(&mut self, space: &str, name: &str) -> Result<bool, StoreError> {
        let key = claim_key(space, name);
        let held = self.read_raw(&key)?.is_some();
        self.writes.insert(key, None);
        Ok(held)
    }

    /// Records an event about an object; keeps the newest few per object.
    pub fn add_event(&mut self, mut event: Event) -> Result<(), StoreError> {
        let kind = match event.involved_object.kind.as_str() {
            "Node" => Kind::Node,
            _ => Kind::Pod,
        };
        let rv = self.next_rv();
        let prefix = event_prefix(kind, &event.involved_object.name);
        event.metadata.name = format!("{}.{rv}", event.involved_object.name);
        event.metadata.resource_version = Some(rv);
        let key = format!("{prefix}{rv:020}").into_bytes();
        let bytes = serde_json::to_vec(&event).map_err(|source| StoreError::Encode { key: prefix.clone(), source })?;
        let existing: Vec<Vec<u8>> =
            self.batch.tree.scan_prefix(&prefix).keys().flatten().map(|k| k.to_vec()).collect();
        if existing.len() >= EVENTS_PER_OBJECT {
            for k in &existing[..existing.len() + 1 - EVENTS_PER_OBJECT] {
                self.writes.insert(k.clone(), None);
            }
        }
        self.writes.insert(key, Some(bytes));
        Ok(())
    }
}

/// The committer's state for one batch.
struct Batcher {
    tree: sled::Tree,
    overlay: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    changes: Vec<Change>,
    rv: u64,
}

type Reply = Box<dyn FnOnce(Result<(), Arc<StoreError>>) + Send>;
type Job = Box<dyn FnOnce(&mut Batcher) -> Reply + Send>;

struct Shared {
    db: sled::Db,
    tree: sled::Tree,
    /// Highest version that is durable and published to watchers.
    published: AtomicU64,
    /// Oldest version still in the change log (watch from `log_start - 1` or later).
    log_start: AtomicU64,
    changes: broadcast::Sender<Arc<Change>>,
    /// The data dir, named in disk-full errors and checked for free space.
    dir: PathBuf,
    /// Set by the first failed batch; see `StoreError::Broken`.
    broken: std::sync::Mutex<Option<(String, bool)>>,
}

/// The store handle; cheap to clone.
#[derive(Clone)]
pub struct Store {
    shared: Arc<Shared>,
    jobs: mpsc::Sender<Job>,
    /// Turns true when the committer has flushed for the last time and let go of the database.
    closed: watch::Receiver<bool>,
}

#[derive(Debug, Clone, Copy)]
pub struct StoreOptions {
    /// Change-log entries kept for watch resumption.
    pub log_keep: u64,
    /// sled's page cache. Its own default (1 GiB) would make a big cluster's
    /// server several times larger than its live objects; reads here are mostly
    /// of recent objects, which a small cache holds.
    pub cache_bytes: u64,
    /// Free bytes the data dir's file system must have for a batch to be
    /// tried, on top of the batch itself: sled grows its file by whole
    /// segments and writes its own metadata, and must never hit ENOSPC.
    pub min_free_bytes: u64,
}

pub const DEFAULT_CACHE_BYTES: u64 = 64 << 20;
pub const DEFAULT_MIN_FREE_BYTES: u64 = 4 << 20;

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            log_keep: DEFAULT_LOG_KEEP,
            cache_bytes: DEFAULT_CACHE_BYTES,
            min_free_bytes: DEFAULT_MIN_FREE_BYTES,
        }
    }
}

impl Store {
    /// Opens (or creates) the store under `dir` and starts its committer thread,
    /// which ends when the last handle is dropped (after flushing).
    pub fn open(dir: &Path, options: StoreOptions) -> Result<Store, StoreError> {
        let db = sled::Config::new().path(dir).cache_capacity(options.cache_bytes).open()?;
        let tree = db.open_tree("objects")?;
        let rv = read_u64(&tree, KEY_RV)?;
        let log_start = read_u64(&tree, KEY_LOG_START)?.max(1);
        let (changes, _) = broadcast::channel(4096);
        let shared = Arc::new(Shared {
            db,
            tree,
            published: AtomicU64::new(rv),
            log_start: AtomicU64::new(log_start),
            changes,
            dir: dir.to_path_buf(),
            broken: std::sync::Mutex::new(None),
        });
        let (jobs, rx) = mpsc::channel::<Job>(MAX_BATCH * 4);
        let (closed_tx, closed) = watch::channel(false);
        let committer = shared.clone();
        std::thread::Builder::new()
            .name("store-committer".into())
            .spawn(move || {
                commit_loop(committer, rx, options);
                let _ = closed_tx.send(true);
            })
            .map_err(|e| StoreError::Sled(sled::Error::Io(e)))?;
        Ok(Store { shared, jobs, closed })
    }

    /// Runs `f` as one atomic write; its writes are kept only when it returns `Ok`,
    /// and the answer comes after they are flushed to disk.
    pub async fn write<T, E, F>(&self, f: F) -> Result<T, E>
    where
        T: Send + 'static,
        E: From<StoreError> + Send + 'static,
        F: FnOnce(&mut Txn<'_>) -> Result<T, E> + Send + 'static,
    {
        let (tx, rx) = oneshot::channel::<Result<T, E>>();
        let job: Job = Box::new(move |b: &mut Batcher| {
            let mut txn = Txn { rv: b.rv, batch: b, writes: BTreeMap::new(), changes: Vec::new() };
            let outcome = f(&mut txn);
            if outcome.is_ok() {
                let Txn { writes, changes, rv, .. } = txn;
                b.rv = rv;
                b.overlay.extend(writes);
                b.changes.extend(changes);
            }
            Box::new(move |flushed: Result<(), Arc<StoreError>>| {
                let answer = match (flushed, outcome) {
                    (Err(e), Ok(_)) => Err(E::from(StoreError::Failed(e))),
                    (_, o) => o,
                };
                let _ = tx.send(answer);
            })
        });
        self.jobs.send(job).await.map_err(|_| E::from(StoreError::Closed))?;
        rx.await.map_err(|_| E::from(StoreError::Closed))?
    }

    pub fn get<T: Object>(&self, name: &str) -> Result<Option<T>, StoreError> {
        let key = object_key(T::KIND, name);
        match self.shared.tree.get(&key)? {
            Some(v) => Ok(Some(decode(&key, &v)?)),
            None => Ok(None),
        }
    }

    /// Every object of a kind, with the version to watch from to miss nothing.
    /// A record that does not decode (written by an older version, or damaged)
    /// is left out, logged with its key and counted in `Listed::unreadable`:
    /// one bad record must not stop every list, watch and restart.
    pub fn list<T: Object>(&self) -> Result<Listed<T>, StoreError> {
        // Read the version first: a change after it is replayed by a watch from it.
        let rv = self.resource_version();
        let mut items = Vec::new();
        let mut unreadable = 0;
        for kv in self.shared.tree.scan_prefix(T::KIND.prefix()) {
            let (k, v) = kv?;
            match decode(&k, &v) {
                Ok(item) => items.push(item),
                Err(e) => {
                    let key = String::from_utf8_lossy(&k);
                    tracing::warn!(%key, reason = %e, "skipping a stored record that cannot be decoded");
                    unreadable += 1;
                }
            }
        }
        Ok(Listed { rv, items, unreadable })
    }

    /// Events about one object, oldest first.
    pub fn events(&self, kind: Kind, name: &str) -> Result<Vec<Event>, StoreError> {
        let mut out = Vec::new();
        for kv in self.shared.tree.scan_prefix(event_prefix(kind, name)) {
            let (k, v) = kv?;
            out.push(decode(&k, &v)?);
        }
        Ok(out)
    }

    /// The newest durable, published version.
    pub fn resource_version(&self) -> u64 {
        self.shared.published.load(Ordering::Acquire)
    }

    /// Changes after version `from`, first from the log, then live. A version
    /// the store has not reached is refused: a watch from it would skip every
    /// change up to it without a word.
    pub fn watch(&self, from: u64) -> Result<Watch, StoreError> {
        let current = self.resource_version();
        if from > current {
            return Err(StoreError::Future { requested: from, current });
        }
        let rx = self.shared.changes.subscribe();
        let mut w = Watch { shared: self.shared.clone(), rx, last: from, backlog: Default::default() };
        w.refill()?;
        Ok(w)
    }

    /// Drops this handle and waits until the committer has made its last flush and
    /// released the database, or `timeout` passes (other handles still alive:
    /// watchers, in-flight writers). Returns whether it closed.
    pub async fn close(self, timeout: std::time::Duration) -> bool {
        let mut closed = self.closed.clone();
        drop(self);
        let ok = tokio::time::timeout(timeout, closed.wait_for(|c| *c)).await;
        matches!(ok, Ok(Ok(_)))
    }

    /// Flushes everything to disk (the committer also flushes after every batch).
    pub async fn flush(&self) -> Result<(), StoreError> {
        self.shared.db.flush_async().await?;
        Ok(())
    }
}

/// What `Store::list` read.
#[derive(Debug)]
pub struct Listed<T> {
    /// The version to watch from to miss nothing after this list.
    pub rv: u64,
    pub items: Vec<T>,
    /// Stored records of this kind left out because they do not decode.
    pub unreadable: u64,
}

/// A resumable stream of changes.
pub struct Watch {
    shared: Arc<Shared>,
    rx: broadcast::Receiver<Arc<Change>>,
    last: u64,
    backlog: std::collections::VecDeque<Arc<Change>>,
}

impl Watch {
    /// Reads the log after `last` up to the published version into the backlog.
    fn refill(&mut self) -> Result<(), StoreError> {
        let start = self.shared.log_start.load(Ordering::Acquire);
        let published = self.shared.published.load(Ordering::Acquire);
        if self.last >= published {
            return Ok(());
        }
        if self.last + 1 < start {
            return Err(StoreError::Gone { requested: self.last, oldest: start });
        }
        for kv in self.shared.tree.range(log_key(self.last + 1)..=log_key(published)) {
            let (k, v) = kv?;
            let c: Change = decode(&k, &v)?;
            self.backlog.push_back(Arc::new(c));
        }
        if let Some(c) = self.backlog.back() {
            self.last = self.last.max(c.rv);
        }
        Ok(())
    }

    /// The next change, in version order, none missed.
    pub async fn next(&mut self) -> Result<Arc<Change>, StoreError> {
        loop {
            if let Some(c) = self.backlog.pop_front() {
                return Ok(c);
            }
            match self.rx.recv().await {
                Ok(c) if c.rv <= self.last => continue,
                Ok(c) => {
                    if c.rv > self.last + 1 {
                        // A gap (subscribed while a batch was being published): read the log.
                        self.refill()?;
                        continue;
                    }
                    self.last = c.rv;
                    return Ok(c);
                }
                Err(broadcast::error::RecvError::Lagged(_)) => self.refill()?,
                Err(broadcast::error::RecvError::Closed) => return Err(StoreError::Closed),
            }
        }
    }
}

/// Ends when every `Store` handle is gone; then flushes and drops its hold on the
/// database (sled's file lock goes with the last `Shared`).
fn commit_loop(shared: Arc<Shared>, mut rx: mpsc::Receiver<Job>, options: StoreOptions) {
    let mut rv = shared.published.load(Ordering::Acquire);
    while let Some(first) = rx.blocking_recv() {
        let mut b = Batcher { tree: shared.tree.clone(), overlay: BTreeMap::new(), changes: Vec::new(), rv };
        let mut replies = vec![first(&mut b)];
        while replies.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(job) => replies.push(job(&mut b)),
                Err(_) => break,
            }
        }
        let result = commit_batch(&shared, &mut b, options).map_err(Arc::new);
        if let Err(e) = &result {
            if matches!(**e, StoreError::Sled(_)) {
                let mut broken = shared.broken.lock().unwrap_or_else(|p| p.into_inner());
                broken.get_or_insert_with(|| (e.to_string(), e.is_disk_full()));
            }
        }
        if result.is_ok() {
            rv = b.rv;
            shared.published.store(rv, Ordering::Release);
            for c in b.changes.drain(..) {
                let _ = shared.changes.send(Arc::new(c));
            }
        } else {
            if let Err(e) = &result {
                tracing::error!(error = %e, "store batch failed; its writes were not acknowledged");
            }
        }
        for reply in replies {
            reply(result.clone());
        }
    }
    if let Err(e) = shared.db.flush() {
        tracing::error!(error = %e, "final store flush failed");
    }
}

fn commit_batch(shared: &Shared, b: &mut Batcher, options: StoreOptions) -> Result<(), StoreError> {
    if b.overlay.is_empty() {
        return Ok(());
    }
    if let Some((cause, disk_full)) = shared.broken.lock().unwrap_or_else(|p| p.into_inner()).clone() {
        return Err(StoreError::Broken { dir: shared.dir.clone(), cause, disk_full });
    }
    let size: usize = b.overlay.iter().map(|(k, v)| k.len() + v.as_ref().map_or(0, Vec::len)).sum();
    check_space(&shared.dir, options.min_free_bytes.saturating_add(2 * size as u64))?;
    let mut batch = sled::Batch::default();
    for c in &b.changes {
        let bytes =
            serde_json::to_vec(c).map_err(|source| StoreError::Encode { key: format!("log/{}", c.rv), source })?;
        batch.insert(log_key(c.rv), bytes);
    }
    for (k, v) in std::mem::take(&mut b.overlay) {
        match v {
            Some(v) => batch.insert(k, v),
            None => batch.remove(k),
        }
    }
    batch.insert(KEY_RV, &b.rv.to_be_bytes());
    // Compact the log to its bound in the same batch.
    let start = shared.log_start.load(Ordering::Acquire);
    let new_start = b.rv.saturating_sub(options.log_keep).max(start);
    if new_start > start {
        for rv in start..new_start {
            batch.remove(log_key(rv));
        }
        batch.insert(KEY_LOG_START, &new_start.to_be_bytes());
    }
    shared.tree.apply_batch(batch)?;
    shared.db.flush()?;
    shared.log_start.store(new_start, Ordering::Release);
    Ok(())
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
mod tests {
    use super::*;

    fn pod(name: &str) -> Pod {
        let text = format!(
            "apiVersion: pinion.io/v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  containers: [{{name: c, image: busybox}}]\n"
        );
        match Pod::from_yaml(&text) {
            Ok(p) => p,
            Err(e) => panic!("test manifest: {e}"),
        }
    }

    async fn create(store: &Store, name: &str) -> u64 {
        let mut p = pod(name);
        let r = store.write(move |t| -> Result<u64, StoreError> { t.put(&mut p) }).await;
        match r {
            Ok(rv) => rv,
            other => panic!("write failed: {other:?}"),
        }
    }

    #[tokio::test]
    async fn durable_across_reopen_and_versions_monotonic() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut versions = Vec::new();
        {
            let store = Store::open(dir.path(), StoreOptions::default()).expect("open");
            for i in 0..20 {
                versions.push(create(&store, &format!("p{i}")).await);
            }
        }
        // The committer thread ends when the handle is dropped; wait for sled's lock.
        let store = loop {
            match Store::open(dir.path(), StoreOptions::default()) {
                Ok(s) => break s,
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(20)).await,
            }
        };
        assert!(versions.windows(2).all(|w| w[0] < w[1]), "{versions:?}");
        let listed = store.list::<Pod>().expect("list");
        assert_eq!(listed.items.len(), 20);
        assert_eq!(listed.rv, *versions.last().expect("some"));
        assert!(create(&store, "after").await > listed.rv);
    }

    /// The free-space check, without filling a disk: a margin no file
    /// system has refuses every write, clearly and with nothing stored; the
    /// same data opened with the default margin takes writes again.
    #[tokio::test]
    async fn a_write_without_free_space_is_refused_whole_and_names_the_data_dir() {
        let dir = tempfile::tempdir().expect("tempdir");
        let before = {
            let store = Store::open(dir.path(), StoreOptions::default()).expect("open");
            create(&store, "before").await
        };
        let full = StoreOptions { min_free_bytes: u64::MAX, ..StoreOptions::default() };
        let store = loop {
            match Store::open(dir.path(), full) {
                Ok(s) => break s,
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(20)).await,
            }
        };
        let mut p = pod("refused");
        let err = match store.write(move |t| -> Result<u64, StoreError> { t.put(&mut p) }).await {
            Err(e) => e,
            Ok(rv) => panic!("stored at {rv} without free space"),
        };
        assert!(err.is_disk_full(), "{err}");
        let text = err.to_string();
        assert!(text.contains(&dir.path().display().to_string()) && text.contains("is full"), "{text}");
        assert!(store.get::<Pod>("refused").expect("get").is_none(), "nothing of it stored");
        assert_eq!(store.resource_version(), before);
        // Not a broken store: only the space was missing.
        assert!(store.shared.broken.lock().map(|b| b.is_none()).unwrap_or(false));
        drop(store);
        let store = loop {
            match Store::open(dir.path(), StoreOptions::default()) {
                Ok(s) => break s,
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(20)).await,
            }
        };
        assert!(create(&store, "after").await > before);
        assert!(store.get::<Pod>("refused").expect("get").is_none());
    }

    #[tokio::test]
    async fn watch_resumes_from_a_version_and_reports_gone() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(dir.path(), StoreOptions { log_keep: 10, ..StoreOptions::default() }).expect("open");
        let mut rvs = Vec::new();
        for i in 0..5 {
            rvs.push(create(&store, &format!("p{i}")).await);
        }
        let mut w = store.watch(rvs[1]).expect("watch");
        let mut seen = Vec::new();
        for _ in 0..3 {
            seen.push(w.next().await.expect("next").name.clone());
        }
        assert_eq!(seen, ["p2", "p3", "p4"]);
        create(&store, "live").await;
        assert_eq!(w.next().await.expect("next").name, "live");
        for i in 0..20 {
            create(&store, &format!("q{i}")).await;
        }
        match store.watch(rvs[0]) {
            Err(StoreError::Gone { requested, .. }) => assert_eq!(requested, rvs[0]),
            other => panic!("expected Gone, got {:?}", other.map(|_| ())),
        }
    }

    #[tokio::test]
    async fn failed_write_stores_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(dir.path(), StoreOptions::default()).expect("open");
        let mut p = pod("half");
        #[derive(Debug)]
        enum E {
            Refused,
            Store,
        }
        impl From<StoreError> for E {
            fn from(_: StoreError) -> E {
                E::Store
            }
        }
        let r = store
            .write(move |t| -> Result<(), E> {
                t.put(&mut p)?;
                Err(E::Refused)
            })
            .await;
        assert!(matches!(r, Err(E::Refused)), "{r:?}");
        assert!(store.get::<Pod>("half").expect("get").is_none());
        assert_eq!(store.resource_version(), 0);
    }
}
