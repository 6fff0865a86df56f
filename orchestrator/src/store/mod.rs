//! The durable object store: pods, nodes and events, one monotonic resource
//! version for the whole store, and a change log that watchers replay; on
//! sled (one server, `sled.rs`) or on etcd (several servers, `etcd.rs`).
//!
//! Writes go through one committer thread. Each write is a closure that reads
//! the current state and stages puts and deletes (a read-modify-write, never
//! racing another write); the committer takes every queued write and commits
//! them as ONE atomic batch (objects, change-log entries `log/<rv>` and the
//! version counter `meta/rv` together): a flushed sled batch, or an etcd
//! transaction that a quorum has on disk. Only then does it answer the callers
//! and publish the changes to watchers, in version order. So a caller that got
//! an answer holds a durable write, and a watcher never sees a change that a
//! crash could take back.
//!
//! The key space is the same on both backends (`pod/`, `node/`, `event/`,
//! `log/`, `meta/`, `claim/`; on etcd under a prefix). The resource version is
//! Pinion's own counter, one per change, not etcd's revision: several changes
//! share one etcd revision, and a watch resumes after an exact change.
//!
//! On etcd another server may commit between this one's read and its write:
//! the transaction then fails its compare, and the batch's closures run again
//! on the newer state (so they are `FnMut`). A write marked `Txn::as_leader`
//! commits only while this server's `LeaderGuard` holds the leader key.

use std::collections::BTreeMap;
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use specs::api::{Event, Node, WatchEventType};
use specs::pod::ObjectMeta;
use specs::Pod;
use tokio::sync::{broadcast, mpsc, oneshot, watch};

/// How many change-log entries are kept for watch resumption.
pub const DEFAULT_LOG_KEEP: u64 = 50_000;
/// How many bytes of change-log entries sled keeps: every entry holds a whole
/// object, so at 200 KB pods 50,000 entries were 10 GB before sled's own
/// amplification. 64 MiB is still more than the 50,000 entries of ~1 KB pods.
pub const DEFAULT_LOG_KEEP_BYTES: u64 = 64 << 20;
/// How many events are kept per object (oldest dropped first).
const EVENTS_PER_OBJECT: usize = 32;
/// Most writes folded into one batch and one flush.
const MAX_BATCH: usize = 1024;
/// Compare failures in a row (other servers writing first) before a batch is
/// refused: each one means another server committed, so this bounds only the
/// wait of an unlucky batch, not progress.
const MAX_CONFLICTS: u32 = 64;

pub mod etcd;
mod sled;
#[cfg(test)]
mod tests;

pub use etcd::{connect, EtcdConfig, EtcdOptions};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("sled: {0}")]
    Sled(#[from] ::sled::Error),
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
    /// etcd refused a request or could not be reached; nothing was stored.
    #[error("etcd: {0}")]
    Etcd(String),
    /// A write was sent to etcd but no answer came (a timeout, a broken
    /// connection): it may have been stored. Never acknowledged as stored.
    #[error("etcd did not confirm the write ({0}); it may or may not be stored: read it back before writing again")]
    Unconfirmed(String),
    /// One write alone is more than one etcd transaction may hold.
    #[error("the write needs {ops} operations and {bytes} bytes in one etcd transaction; etcd allows {max_ops} operations (its --max-txn-ops, EtcdOptions::max_txn_ops) and {max_bytes} bytes (its --max-request-bytes, EtcdOptions::max_request_bytes)")]
    TooLarge { ops: usize, bytes: usize, max_ops: usize, max_bytes: usize },
    /// A write marked `Txn::as_leader` while this server is not the leader
    /// (no guard set, or another lease holds the leader key).
    #[error("this server is not the leader; only the leader may make this write")]
    NotLeader,
}

impl StoreError {
    /// Whether the data dir's file system is full (the API's 507).
    pub fn is_disk_full(&self) -> bool {
        match self {
            StoreError::DiskFull { .. } => true,
            StoreError::Broken { disk_full, .. } => *disk_full,
            StoreError::Failed(inner) => inner.is_disk_full(),
            StoreError::Sled(::sled::Error::Io(e)) => e.kind() == std::io::ErrorKind::StorageFull,
            _ => false,
        }
    }

    /// What a caller of `Store::write` gets when its batch was not committed:
    /// a refusal of the write itself as is, anything else as `Failed`.
    fn for_caller(e: Arc<StoreError>) -> StoreError {
        match &*e {
            StoreError::NotLeader => StoreError::NotLeader,
            StoreError::TooLarge { ops, bytes, max_ops, max_bytes } => {
                StoreError::TooLarge { ops: *ops, bytes: *bytes, max_ops: *max_ops, max_bytes: *max_bytes }
            }
            _ => StoreError::Failed(e),
        }
    }
}

/// The kinds of objects stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Kind {
    Pod,
    Node,
    Event,
    Job,
    User,
    Token,
    Deployment,
    DaemonSet,
    Partition,
    Usage,
    AcctRecord,
}

impl Kind {
    fn prefix(self) -> &'static str {
        match self {
            Kind::Pod => "pod/",
            Kind::Node => "node/",
            Kind::Event => "event/",
            Kind::Job => "job/",
            Kind::User => "user/",
            Kind::Token => "token/",
            Kind::Deployment => "deployment/",
            Kind::DaemonSet => "daemonset/",
            Kind::Partition => "partition/",
            Kind::Usage => "usage/",
            Kind::AcctRecord => "acct/",
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
    /// Whether going from `prev` to `self` changed only the status, so a
    /// watch that is sent objects without it has nothing to learn.
    fn only_status_changed(&self, _prev: &Self) -> bool {
        false
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
    // Every status report writes its node; the nodes' own watch of their
    // peers reads no status, and a thousand of them each sent every other
    // node's reports is a million events a rollout.
    fn only_status_changed(&self, prev: &Self) -> bool {
        self.spec == prev.spec
            && self.api_version == prev.api_version
            && ObjectMeta { resource_version: prev.metadata.resource_version, ..self.metadata.clone() } == prev.metadata
    }
}

impl Object for specs::job::Job {
    const KIND: Kind = Kind::Job;
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl Object for specs::deployment::Deployment {
    const KIND: Kind = Kind::Deployment;
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl Object for specs::daemonset::DaemonSet {
    const KIND: Kind = Kind::DaemonSet;
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl Object for specs::partition::Partition {
    const KIND: Kind = Kind::Partition;
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl Object for specs::fairshare::Usage {
    const KIND: Kind = Kind::Usage;
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl Object for specs::acct::Record {
    const KIND: Kind = Kind::AcctRecord;
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl Object for specs::api::User {
    const KIND: Kind = Kind::User;
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl Object for specs::api::Token {
    const KIND: Kind = Kind::Token;
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
    /// Who created the object (`metadata.owner`): a user's watch sees only theirs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// A MODIFIED that changed only the status (`Object::only_status_changed`):
    /// a watch sent objects without it skips the change.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub status_only: bool,
}

const KEY_RV: &[u8] = b"meta/rv";
const KEY_LOG_START: &[u8] = b"meta/log_start";
const LOG_PREFIX: &str = "log/";

/// A change as its log entry stores it. Slim (etcd, where `Batcher::admit`
/// allows it): the object is left out, since the entry's own transaction
/// writes it under `object_key`, so etcd's history holds it at the entry's
/// revision. An empty `object` marks the slim entry: an object's JSON is
/// never empty. This halves what every etcd member writes per change.
fn log_entry(c: &Change, slim: bool) -> Result<Vec<u8>, serde_json::Error> {
    if !slim {
        return serde_json::to_vec(c);
    }
    serde_json::to_vec(&Change {
        rv: c.rv,
        kind: c.kind,
        name: c.name.clone(),
        event_type: c.event_type,
        object: String::new(),
        node_name: c.node_name.clone(),
        prev_node_name: c.prev_node_name.clone(),
        labels: c.labels.clone(),
        owner: c.owner.clone(),
        status_only: c.status_only,
    })
}

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

fn decode<T: DeserializeOwned>(key: &[u8], bytes: &[u8]) -> Result<T, StoreError> {
    serde_json::from_slice(bytes)
        .map_err(|source| StoreError::Decode { key: String::from_utf8_lossy(key).into_owned(), source })
}

/// An 8-byte big-endian counter (`meta/rv`, `meta/log_start`); 0 when absent.
fn read_counter(v: Option<&[u8]>) -> u64 {
    match v {
        Some(v) if v.len() == 8 => {
            let mut b = [0u8; 8];
            b.copy_from_slice(v);
            u64::from_be_bytes(b)
        }
        _ => 0,
    }
}

/// A write in progress: reads see the store plus this batch's earlier writes.
pub struct Txn<'a> {
    batch: &'a Batcher,
    writes: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    changes: Vec<Change>,
    rv: u64,
    leader: bool,
}

impl Txn<'_> {
    fn read_raw(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        if let Some(v) = self.writes.get(key) {
            return Ok(v.clone());
        }
        if let Some(v) = self.batch.writes.get(key) {
            return Ok(v.clone());
        }
        for layer in self.batch.below.iter().rev() {
            if let Some(v) = layer.get(key) {
                return Ok(v.clone());
            }
        }
        self.batch.shared.backend.get(key)
    }

    /// Keys under `prefix` in the store and in the batches still in flight
    /// below this one (not this batch's own writes).
    fn stored_keys(&self, prefix: &str) -> Result<Vec<Vec<u8>>, StoreError> {
        let mut keys = std::collections::BTreeSet::new();
        self.batch.shared.backend.scan(prefix.as_bytes(), &mut |k, _| {
            keys.insert(k.to_vec());
            Ok(())
        })?;
        for layer in &self.batch.below {
            for (k, v) in
                layer.range(prefix.as_bytes().to_vec()..).take_while(|(k, _)| k.starts_with(prefix.as_bytes()))
            {
                match v {
                    Some(_) => keys.insert(k.clone()),
                    None => keys.remove(k),
                };
            }
        }
        Ok(keys.into_iter().collect())
    }

    /// Marks this write as one only the leader may make (a binding): on etcd
    /// it commits only while this server's `LeaderGuard` holds the leader
    /// key, else it fails with `StoreError::NotLeader`. On sled (one server)
    /// it always passes.
    pub fn as_leader(&mut self) {
        self.leader = true;
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
            owner: obj.meta().owner.clone(),
            status_only: prev.as_ref().is_some_and(|p| obj.only_status_changed(p)),
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
            owner: prev.meta().owner.clone(),
            status_only: false,
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
        // A key that cannot be read now is left: an event without its object
        // is harmless, and the delete itself must not fail for it.
        for k in self.stored_keys(&event_prefix(kind, name)).unwrap_or_default() {
            self.writes.insert(k, None);
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

    /// Who holds `name` in `space`, as this write sees it.
    pub fn claim_holder(&self, space: &str, name: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.read_raw(&claim_key(space, name))
    }

    /// Every name claimed in `space` with its holder, as this write sees it
    /// (the store, the batches in flight, this batch's earlier writes and
    /// this one's), by name.
    pub fn claims(&self, space: &str) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        let prefix = format!("claim/{space}/");
        let mut out = Vec::new();
        for k in self.keys_under(&prefix)? {
            if let Some(held) = self.read_raw(&k)? {
                out.push((String::from_utf8_lossy(&k[prefix.len()..]).into_owned(), held));
            }
        }
        Ok(out)
    }

    /// Every object of a kind as this write sees it, by name. A record that
    /// does not decode is left out, logged, as `Store::list` does.
    pub fn list<T: Object>(&self) -> Result<Vec<T>, StoreError> {
        let mut out = Vec::new();
        for k in self.keys_under(T::KIND.prefix())? {
            if let Some(v) = self.read_raw(&k)? {
                match decode(&k, &v) {
                    Ok(item) => out.push(item),
                    Err(e) => {
                        let key = String::from_utf8_lossy(&k);
                        tracing::warn!(%key, reason = %e, "skipping a stored record that cannot be decoded");
                    }
                }
            }
        }
        Ok(out)
    }

    /// How many objects of a kind this write sees, without decoding any.
    pub fn count<T: Object>(&self) -> Result<usize, StoreError> {
        Ok(self.keys_under(T::KIND.prefix())?.len())
    }

    /// The keys under `prefix` as this write sees them: the store, the
    /// batches in flight, this batch's earlier writes and this one's.
    fn keys_under(&self, prefix: &str) -> Result<std::collections::BTreeSet<Vec<u8>>, StoreError> {
        let mut keys: std::collections::BTreeSet<Vec<u8>> = self.stored_keys(prefix)?.into_iter().collect();
        for layer in [&self.batch.writes, &self.writes] {
            let under = layer.range(prefix.as_bytes().to_vec()..).take_while(|(k, _)| k.starts_with(prefix.as_bytes()));
            for (k, v) in under {
                match v {
                    Some(_) => keys.insert(k.clone()),
                    None => keys.remove(k),
                };
            }
        }
        Ok(keys)
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
            "Job" => Kind::Job,
            "Deployment" => Kind::Deployment,
            "DaemonSet" => Kind::DaemonSet,
            _ => Kind::Pod,
        };
        let rv = self.next_rv();
        let prefix = event_prefix(kind, &event.involved_object.name);
        event.metadata.name = format!("{}.{rv}", event.involved_object.name);
        event.metadata.resource_version = Some(rv);
        let key = format!("{prefix}{rv:020}").into_bytes();
        let bytes = serde_json::to_vec(&event).map_err(|source| StoreError::Encode { key: prefix.clone(), source })?;
        let existing = self.stored_keys(&prefix)?;
        if existing.len() >= EVENTS_PER_OBJECT {
            for k in &existing[..existing.len() + 1 - EVENTS_PER_OBJECT] {
                self.writes.insert(k.clone(), None);
            }
        }
        self.writes.insert(key, Some(bytes));
        Ok(())
    }
}

/// What one successful closure staged.
struct Staged {
    writes: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    changes: Vec<Change>,
    rv: u64,
    leader: bool,
}

impl Txn<'_> {
    fn staged(self) -> Staged {
        Staged { writes: self.writes, changes: self.changes, rv: self.rv, leader: self.leader }
    }
}

/// What a batch was built on: the version, and (on etcd) the revision of
/// `meta/rv` that the transaction compares, so that it commits only if no
/// other server wrote since.
#[derive(Debug, Clone, Copy, Default)]
struct Base {
    rv: u64,
    revision: i64,
    /// The oldest change-log entry kept.
    log_start: u64,
}

/// How much one backend transaction may hold (etcd's request limits).
#[derive(Debug, Clone, Copy)]
struct Limits {
    max_ops: usize,
    max_bytes: usize,
    /// Bytes every key takes besides its own (etcd's prefix).
    key_prefix: usize,
    /// The log entry of a put leaves the object out: the same transaction
    /// writes it under its key, where etcd's history keeps it (`log_entry`).
    slim_log: bool,
}

/// Operations and bytes every transaction spends besides the writes: the
/// version counter, the log start, the log's compaction and the compares.
const FIXED_OPS: usize = 3;
const FIXED_BYTES: usize = 4096;
/// A generous bound on a protobuf operation's framing.
const OP_BYTES: usize = 64;

/// A batch's puts (`Some`) and deletes (`None`).
type Writes = BTreeMap<Vec<u8>, Option<Vec<u8>>>;

/// The committer's state for one batch.
struct Batcher {
    shared: Arc<Shared>,
    base: Base,
    /// On etcd, for a batch built while others are in flight: the commit
    /// token the last of them writes to `meta/commit`, which this batch's
    /// transaction compares instead of `meta/rv`'s revision.
    chain: Option<Arc<[u8]>>,
    /// The writes of the batches in flight below this one, oldest first:
    /// this batch's closures read them before the store.
    below: Vec<Arc<Writes>>,
    rv: u64,
    writes: Writes,
    /// The change-log entries, encoded: `(rv, json)`.
    log: Vec<(u64, Vec<u8>)>,
    /// Per entry of `log`: slim (`log_entry`), its object to be read under its key.
    slim: Vec<bool>,
    changes: Vec<Change>,
    /// Whether this batch holds leader writes: its transaction then checks
    /// the leader's lease. Leader writes (bindings) and others (a user's
    /// create) share a batch: on the leader they arrive interleaved, and a
    /// batch of one kind at a time held three or four writes on a busy
    /// cluster, each transaction a raft round and an fsync on every member.
    leader: bool,
    ops: usize,
    bytes: usize,
}

enum Admit {
    Merged,
    /// Not in this batch (its limits): the write goes first in the next.
    Full,
    /// Never fits, or cannot be encoded.
    Refused(StoreError),
}

impl Batcher {
    fn new(shared: Arc<Shared>, on: Option<(Base, Arc<[u8]>)>, below: Vec<Arc<Writes>>) -> Batcher {
        let (base, chain) = match on {
            Some((base, token)) => (base, Some(token)),
            None => (shared.backend.base(&shared.published), None),
        };
        Batcher {
            shared,
            base,
            chain,
            below,
            rv: base.rv,
            writes: BTreeMap::new(),
            log: Vec::new(),
            slim: Vec::new(),
            changes: Vec::new(),
            leader: false,
            ops: 0,
            bytes: 0,
        }
    }

    fn is_empty(&self) -> bool {
        self.writes.is_empty() && self.changes.is_empty()
    }

    fn admit(&mut self, s: Staged, limits: Limits) -> Admit {
        if s.writes.is_empty() && s.changes.is_empty() {
            return Admit::Merged;
        }
        let encode = |c: &Change, slim: bool| {
            log_entry(c, slim)
                .map_err(|source| Admit::Refused(StoreError::Encode { key: format!("log/{}", c.rv), source }))
        };
        // A slim entry's object is read back under its key at the batch's
        // revision, so only a put that is its key's last change in the batch
        // may be slim: a deletion (its key is gone) and a change whose key is
        // written again (by this write, or by a later one in the batch) keep
        // their object in the entry.
        let written_again = |c: &Change, later: &[Change]| later.iter().any(|l| l.kind == c.kind && l.name == c.name);
        let mut log = Vec::with_capacity(s.changes.len());
        let mut slim = Vec::with_capacity(s.changes.len());
        for (i, c) in s.changes.iter().enumerate() {
            let thin =
                limits.slim_log && c.event_type != WatchEventType::Deleted && !written_again(c, &s.changes[i + 1..]);
            match encode(c, thin) {
                Ok(bytes) => log.push((c.rv, bytes)),
                Err(refused) => return refused,
            }
            slim.push(thin);
        }
        let mut fattened = Vec::new();
        for (i, c) in self.changes.iter().enumerate() {
            if self.slim[i] && s.writes.contains_key(&object_key(c.kind, &c.name)) {
                match encode(c, false) {
                    Ok(bytes) => fattened.push((i, bytes)),
                    Err(refused) => return refused,
                }
            }
        }
        let op_bytes = OP_BYTES + limits.key_prefix;
        let ops = s.writes.len() + log.len();
        let bytes = s.writes.iter().map(|(k, v)| k.len() + v.as_ref().map_or(0, Vec::len) + op_bytes).sum::<usize>()
            + log.iter().map(|(_, v)| v.len() + 12 + op_bytes).sum::<usize>()
            + fattened.iter().map(|(i, v)| v.len().saturating_sub(self.log[*i].1.len())).sum::<usize>();
        let fits =
            |ops: usize, bytes: usize| ops + FIXED_OPS <= limits.max_ops && bytes + FIXED_BYTES <= limits.max_bytes;
        if self.is_empty() {
            if !fits(ops, bytes) {
                return Admit::Refused(StoreError::TooLarge {
                    ops: ops + FIXED_OPS,
                    bytes: bytes + FIXED_BYTES,
                    max_ops: limits.max_ops,
                    max_bytes: limits.max_bytes,
                });
            }
        } else if !fits(self.ops + ops, self.bytes + bytes) {
            return Admit::Full;
        }
        self.ops += ops;
        self.bytes += bytes;
        self.rv = s.rv;
        self.leader |= s.leader;
        self.writes.extend(s.writes);
        for (i, bytes) in fattened {
            self.log[i].1 = bytes;
            self.slim[i] = false;
        }
        self.log.extend(log);
        self.slim.extend(slim);
        self.changes.extend(s.changes);
        Admit::Merged
    }
}

/// One step of a queued write: run its closure against a batch (again after
/// a conflict), or answer its caller with the batch's fate.
enum Step<'a> {
    Run(&'a Batcher),
    Answer(Result<(), Arc<StoreError>>),
}

/// `Run` returns what the closure staged (`None` when it failed).
type Job = Box<dyn FnMut(Step<'_>) -> Option<Staged> + Send>;

/// A batch handed to its backend.
enum Sending {
    /// Its outcome is known already (sled; a refusal before sending).
    Done(Result<Committed, StoreError>),
    Etcd(etcd::Sent),
}

impl Sending {
    /// What a batch built while this one is in flight chains on: the base
    /// this one leaves, its commit token and its writes.
    fn chain(&self) -> Option<(Base, Arc<[u8]>, Arc<Writes>)> {
        match self {
            Sending::Done(_) => None,
            Sending::Etcd(s) => Some(s.chain()),
        }
    }

    /// Waits for the outcome. With `apply` (every batch before this one
    /// committed) a committed batch goes into the reads and is published;
    /// without, nothing is applied whatever etcd answered.
    fn finish(self, b: &mut Batcher, published: &Published, apply: bool) -> Result<Committed, StoreError> {
        match self {
            Sending::Done(r) => r,
            Sending::Etcd(s) => s.finish(b, published, apply),
        }
    }
}

/// What a backend's commit did.
enum Committed {
    Done,
    /// Another server wrote first; this server's view has caught up since,
    /// so the batch can run again.
    Conflict,
}

/// What `Backend::scan` calls with each key and value.
type Visit<'a> = dyn FnMut(&[u8], &[u8]) -> Result<(), StoreError> + 'a;

/// The two backends. An enum, not a trait: there are two, and the
/// committer, `Txn` and `Watch` call each through one match.
enum Backend {
    Sled(sled::SledBackend),
    Etcd(etcd::EtcdBackend),
}

impl Backend {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        match self {
            Backend::Sled(b) => b.get(key),
            Backend::Etcd(b) => Ok(b.get(key)),
        }
    }

    /// Calls `f` with every stored key under `prefix` and its value, in key order.
    fn scan(&self, prefix: &[u8], f: &mut Visit<'_>) -> Result<(), StoreError> {
        match self {
            Backend::Sled(b) => b.scan(prefix, f),
            Backend::Etcd(b) => b.scan(prefix, f),
        }
    }

    fn base(&self, published: &Published) -> Base {
        match self {
            Backend::Sled(b) => b.base(published),
            Backend::Etcd(b) => b.base(),
        }
    }

    fn limits(&self) -> Limits {
        match self {
            Backend::Sled(_) => {
                Limits { max_ops: usize::MAX / 4, max_bytes: usize::MAX / 4, key_prefix: 0, slim_log: false }
            }
            Backend::Etcd(b) => b.limits(),
        }
    }

    /// Most batches in flight at once: sled commits one at a time, etcd
    /// `EtcdOptions::pipeline_depth`.
    fn pipeline_depth(&self) -> usize {
        match self {
            Backend::Sled(_) => 1,
            Backend::Etcd(b) => b.pipeline_depth(),
        }
    }

    /// Commits the batch (sled) or sends it (etcd; `Sending::finish` waits for it).
    fn send(
        &self,
        b: &mut Batcher,
        published: &Published,
        guard: Option<LeaderGuard>,
        options: StoreOptions,
    ) -> Sending {
        match self {
            Backend::Sled(s) => Sending::Done(s.commit(b, published, options).map(|()| Committed::Done)),
            Backend::Etcd(e) => match e.send(b, guard, options) {
                Ok(sent) => Sending::Etcd(sent),
                Err(err) => Sending::Done(Err(err)),
            },
        }
    }

    /// The change-log entries from `from` to `to`, both included, oldest first.
    async fn log_range(&self, from: u64, to: u64) -> Result<Vec<Change>, StoreError> {
        match self {
            Backend::Sled(b) => b.log_range(from, to),
            Backend::Etcd(b) => b.log_range(from, to).await,
        }
    }
}

/// The leader's hold on the leader key: a write marked `Txn::as_leader`
/// commits on etcd only while `key` is held by `lease`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderGuard {
    /// The leader key, whole (with any prefix): what the election wrote.
    pub key: Vec<u8>,
    /// The etcd lease the key was written with.
    pub lease: i64,
}

/// What watchers see: the newest published version, the log's start and the
/// feed of changes. Written only by one publisher at a time (the sled
/// committer; on etcd, whoever holds the mirror's lock).
struct Published {
    rv: AtomicU64,
    /// Oldest version still in the change log (watch from `log_start - 1` or later).
    log_start: AtomicU64,
    /// The version of the last change sent (see `Sent::prev`).
    last_sent: AtomicU64,
    changes: broadcast::Sender<Sent>,
    recent: Mutex<Recent>,
}

/// The newest published changes, in version order: a watch that resumes (a
/// node moving to this server after a failover) or lags is refilled from
/// here without reading sled or etcd, as the kube-apiserver's watch cache
/// serves its watchers.
struct Recent {
    sent: VecDeque<Sent>,
    bytes: usize,
    /// Every change after this version is in `sent`; those up to it may not be
    /// (published before this store opened, forgotten, or never published).
    floor: u64,
}

/// `Recent`'s bounds: at a few thousand changes a second, seconds of them;
/// at a site's usual rate, hours.
const RECENT_BYTES: usize = 32 << 20;
const RECENT_CHANGES: usize = 65_536;

fn change_bytes(c: &Change) -> usize {
    c.object.len() + c.name.len() + std::mem::size_of::<Change>() + 64
}

/// A change as broadcast, with the version of the change sent before it:
/// versions between the two belong to no change (events take versions
/// too), so a watcher at `prev` or later missed nothing.
#[derive(Clone)]
struct Sent {
    prev: u64,
    change: Arc<Change>,
}

impl Published {
    fn new(rv: u64, log_start: u64) -> Published {
        let (changes, _) = broadcast::channel(4096);
        Published {
            rv: AtomicU64::new(rv),
            log_start: AtomicU64::new(log_start),
            last_sent: AtomicU64::new(rv),
            changes,
            recent: Mutex::new(Recent { sent: VecDeque::new(), bytes: 0, floor: rv }),
        }
    }

    fn recent(&self) -> std::sync::MutexGuard<'_, Recent> {
        self.recent.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The changes after `last` up to `top` from `Recent`; `None` when it
    /// does not hold every one of them.
    fn since(&self, last: u64, top: u64) -> Option<Vec<Arc<Change>>> {
        let r = self.recent();
        if last < r.floor {
            return None;
        }
        let first = r.sent.partition_point(|s| s.change.rv <= last);
        Some(r.sent.range(first..).take_while(|s| s.change.rv <= top).map(|s| s.change.clone()).collect())
    }

    /// Changes up to `rv` were not all published (lost to etcd's compaction,
    /// or a change-log entry that did not decode): a watcher behind it finds
    /// a gap at the next change and reads the log, which says what it can.
    fn gap(&self, rv: u64) {
        let mut r = self.recent();
        r.floor = r.floor.max(rv);
        self.last_sent.fetch_max(rv, Ordering::AcqRel);
    }

    /// Publishes the changes newer than what was published, in version order,
    /// then moves the published version to `rv`.
    fn publish(&self, rv: u64, log_start: u64, changes: impl IntoIterator<Item = Change>) {
        self.log_start.fetch_max(log_start, Ordering::AcqRel);
        // Held while the version moves: a refill that reads the version
        // finds every change up to it in `recent`.
        let mut r = self.recent();
        for c in changes {
            if c.rv <= self.rv.load(Ordering::Acquire) {
                continue;
            }
            let prev = self.last_sent.swap(c.rv, Ordering::AcqRel);
            let sent = Sent { prev, change: Arc::new(c) };
            r.bytes += change_bytes(&sent.change);
            r.sent.push_back(sent.clone());
            while r.bytes > RECENT_BYTES || r.sent.len() > RECENT_CHANGES {
                let Some(old) = r.sent.pop_front() else { break };
                r.bytes -= change_bytes(&old.change);
                r.floor = r.floor.max(old.change.rv);
            }
            self.rv.store(sent.change.rv, Ordering::Release);
            let _ = self.changes.send(sent);
        }
        self.rv.fetch_max(rv, Ordering::AcqRel);
    }
}

struct Shared {
    backend: Backend,
    published: Arc<Published>,
    guard: Mutex<Option<LeaderGuard>>,
    /// From a batch's send to its answer, for committed batches only.
    commit_seconds: prometheus_client::metrics::histogram::Histogram,
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
    /// Change-log entries kept for watch resumption (versions, in fact:
    /// events take versions without entries).
    pub log_keep: u64,
    /// Bytes of change-log entries kept, whichever bound comes first; the
    /// newest entry stays whatever its size. A watch from before the oldest
    /// entry kept is told `Gone` (410) and lists again. Sled only: etcd's
    /// entries are mostly slim and etcd's own compaction bounds its history.
    pub log_keep_bytes: u64,
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
            log_keep_bytes: DEFAULT_LOG_KEEP_BYTES,
            cache_bytes: DEFAULT_CACHE_BYTES,
            min_free_bytes: DEFAULT_MIN_FREE_BYTES,
        }
    }
}

impl Store {
    /// Opens (or creates) the store on sled under `dir` and starts its
    /// committer thread, which ends when the last handle is dropped (after flushing).
    pub fn open(dir: &Path, options: StoreOptions) -> Result<Store, StoreError> {
        let (backend, rv, log_start) = sled::SledBackend::open(dir, &options)?;
        let published = Arc::new(Published::new(rv, log_start));
        Store::start(Backend::Sled(backend), published, options)
    }

    /// Opens the store kept in etcd under `prefix` (e.g. `/pinion/`; one etcd
    /// may hold several clusters under different prefixes): loads the mirror
    /// that reads are served from and starts following etcd. `client` comes
    /// from `connect` and may be shared (the leader election uses it too).
    pub async fn open_etcd(
        client: crate::etcdv3::Client,
        prefix: &str,
        options: StoreOptions,
        etcd: EtcdOptions,
    ) -> Result<Store, StoreError> {
        let (backend, published) = etcd::EtcdBackend::open(client, prefix, etcd).await?;
        Store::start(Backend::Etcd(backend), published, options)
    }

    fn start(backend: Backend, published: Arc<Published>, options: StoreOptions) -> Result<Store, StoreError> {
        let commit_seconds = prometheus_client::metrics::histogram::Histogram::new(crate::metrics::latency_buckets());
        let shared = Arc::new(Shared { backend, published, guard: Mutex::new(None), commit_seconds });
        let (jobs, rx) = mpsc::channel::<Job>(MAX_BATCH * 4);
        let (closed_tx, closed) = watch::channel(false);
        let committer = shared.clone();
        std::thread::Builder::new()
            .name("store-committer".into())
            .spawn(move || {
                commit_loop(committer, rx, options);
                let _ = closed_tx.send(true);
            })
            .map_err(|e| StoreError::Sled(::sled::Error::Io(e)))?;
        Ok(Store { shared, jobs, closed })
    }

    /// The commit latency of this store's batches (both backends), for the
    /// server's metrics; a handle on the same histogram.
    pub fn commit_seconds(&self) -> prometheus_client::metrics::histogram::Histogram {
        self.shared.commit_seconds.clone()
    }

    /// Sets (or, with `None`, clears) the guard that `Txn::as_leader` writes
    /// are committed under; the leader election calls it as it wins and loses.
    pub fn set_leader_guard(&self, guard: Option<LeaderGuard>) {
        *self.shared.guard.lock().unwrap_or_else(|p| p.into_inner()) = guard;
    }

    /// Runs `f` as one atomic write; its writes are kept only when it returns `Ok`,
    /// and the answer comes after they are durable (flushed to disk; on etcd,
    /// on a quorum's disks). On etcd `f` may run more than once, each time on
    /// newer state, when another server committed first: it must not move
    /// what it captured out (clone it inside), and only its last run counts.
    pub async fn write<T, E, F>(&self, mut f: F) -> Result<T, E>
    where
        T: Send + 'static,
        E: From<StoreError> + Send + 'static,
        F: FnMut(&mut Txn<'_>) -> Result<T, E> + Send + 'static,
    {
        let (tx, rx) = oneshot::channel::<Result<T, E>>();
        let mut tx = Some(tx);
        let mut outcome: Option<Result<T, E>> = None;
        let job: Job = Box::new(move |step: Step<'_>| match step {
            Step::Run(batch) => {
                let mut txn = Txn { rv: batch.rv, batch, writes: BTreeMap::new(), changes: Vec::new(), leader: false };
                let result = f(&mut txn);
                let staged = result.is_ok().then(|| txn.staged());
                outcome = Some(result);
                staged
            }
            Step::Answer(committed) => {
                let answer = match (committed, outcome.take()) {
                    (Err(e), None | Some(Ok(_))) => Err(E::from(StoreError::for_caller(e))),
                    (_, Some(o)) => o,
                    (Ok(()), None) => Err(E::from(StoreError::Closed)),
                };
                if let Some(tx) = tx.take() {
                    let _ = tx.send(answer);
                }
                None
            }
        });
        self.jobs.send(job).await.map_err(|_| E::from(StoreError::Closed))?;
        rx.await.map_err(|_| E::from(StoreError::Closed))?
    }

    /// Who holds `name` in `space` (`Txn::claim`), as the last durable write
    /// left it (on etcd, as this server's mirror has it).
    pub fn claim_holder(&self, space: &str, name: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.shared.backend.get(&claim_key(space, name))
    }

    pub fn get<T: Object>(&self, name: &str) -> Result<Option<T>, StoreError> {
        let key = object_key(T::KIND, name);
        match self.shared.backend.get(&key)? {
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
        self.shared.backend.scan(T::KIND.prefix().as_bytes(), &mut |k, v| {
            match decode(k, v) {
                Ok(item) => items.push(item),
                Err(e) => {
                    let key = String::from_utf8_lossy(k);
                    tracing::warn!(%key, reason = %e, "skipping a stored record that cannot be decoded");
                    unreadable += 1;
                }
            }
            Ok(())
        })?;
        Ok(Listed { rv, items, unreadable })
    }

    /// Events about one object, oldest first.
    pub fn events(&self, kind: Kind, name: &str) -> Result<Vec<Event>, StoreError> {
        let mut out = Vec::new();
        self.shared.backend.scan(event_prefix(kind, name).as_bytes(), &mut |k, v| {
            out.push(decode(k, v)?);
            Ok(())
        })?;
        Ok(out)
    }

    /// The newest durable, published version.
    pub fn resource_version(&self) -> u64 {
        self.shared.published.rv.load(Ordering::Acquire)
    }

    /// Changes after version `from`, first from the log, then live. A version
    /// the store has not reached is refused: a watch from it would skip every
    /// change up to it without a word.
    pub async fn watch(&self, from: u64) -> Result<Watch, StoreError> {
        let current = self.resource_version();
        if from > current {
            return Err(StoreError::Future { requested: from, current });
        }
        let rx = self.shared.published.changes.subscribe();
        let mut w = Watch { shared: self.shared.clone(), rx, last: from, backlog: Default::default() };
        w.refill().await?;
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

    /// Flushes everything to disk (the committer also flushes after every
    /// batch; on etcd every acknowledged write is on disk already).
    pub async fn flush(&self) -> Result<(), StoreError> {
        match &self.shared.backend {
            Backend::Sled(b) => b.flush().await,
            Backend::Etcd(_) => Ok(()),
        }
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
    rx: broadcast::Receiver<Sent>,
    last: u64,
    backlog: VecDeque<Arc<Change>>,
}

impl Watch {
    /// Reads the log after `last` up to the published version into the backlog.
    async fn refill(&mut self) -> Result<(), StoreError> {
        let published = &self.shared.published;
        let start = published.log_start.load(Ordering::Acquire);
        let top = published.rv.load(Ordering::Acquire);
        if self.last >= top {
            return Ok(());
        }
        if self.last + 1 < start {
            return Err(StoreError::Gone { requested: self.last, oldest: start });
        }
        let changes = match published.since(self.last, top) {
            Some(changes) => changes,
            None => self.shared.backend.log_range(self.last + 1, top).await?.into_iter().map(Arc::new).collect(),
        };
        // The log may have been compacted past `last` while it was read.
        let start = published.log_start.load(Ordering::Acquire);
        if self.last + 1 < start {
            return Err(StoreError::Gone { requested: self.last, oldest: start });
        }
        self.backlog.extend(changes);
        self.last = top;
        Ok(())
    }

    /// The next change, in version order, none missed.
    pub async fn next(&mut self) -> Result<Arc<Change>, StoreError> {
        loop {
            if let Some(c) = self.backlog.pop_front() {
                return Ok(c);
            }
            match self.rx.recv().await {
                Ok(s) if s.change.rv <= self.last => continue,
                Ok(s) => {
                    if s.prev > self.last {
                        // A gap (subscribed while a batch was being published): read the log.
                        self.refill().await?;
                        continue;
                    }
                    self.last = s.change.rv;
                    return Ok(s.change);
                }
                Err(broadcast::error::RecvError::Lagged(_)) => self.refill().await?,
                Err(broadcast::error::RecvError::Closed) => return Err(StoreError::Closed),
            }
        }
    }
}

/// A batch sent and not yet answered (or, with no `sending`, a batch that
/// staged nothing: its callers still read the batches below it, so they are
/// answered in turn too).
struct Flight {
    jobs: Vec<Job>,
    /// Per job: a leader write (`Txn::as_leader`).
    leaders: Vec<bool>,
    batch: Batcher,
    sending: Option<Sending>,
    sent_at: std::time::Instant,
}

/// Ends when every `Store` handle is gone; then flushes and drops its hold on the
/// database (sled's file lock goes with the last `Shared`).
///
/// On etcd up to `pipeline_depth` batches are in flight: the next one is
/// built on the writes of those below it and chained on the last one's
/// commit token, so it can only commit right after it. They are answered and
/// published strictly in order; once one is not committed, none above it
/// is acknowledged: they run again (or share its error where it may have
/// been stored).
fn commit_loop(shared: Arc<Shared>, mut rx: mpsc::Receiver<Job>, options: StoreOptions) {
    let depth = shared.backend.pipeline_depth().max(1);
    let mut pending: VecDeque<Job> = VecDeque::new();
    let mut flights: VecDeque<Flight> = VecDeque::new();
    let mut conflicts = 0u32;
    let mut closed = false;
    // Whether another batch may be sent now: one whose outcome came before
    // sending (a refusal) has no token to chain on, so it is answered first.
    let room = |flights: &VecDeque<Flight>| {
        flights.len() < depth && !flights.back().is_some_and(|f| matches!(f.sending, Some(Sending::Done(_))))
    };
    loop {
        if pending.is_empty() && flights.is_empty() {
            if closed {
                break;
            }
            match rx.blocking_recv() {
                Some(job) => pending.push_back(job),
                None => break,
            }
        }
        if pending.is_empty() && room(&flights) && !closed {
            // Wait for the oldest batch's answer, or for a write to send beside it.
            if let Some(Flight { sending: Some(Sending::Etcd(s)), .. }) = flights.front_mut() {
                match s.wait_or_recv(&mut rx) {
                    etcd::Waited::Job(job) => pending.push_back(job),
                    etcd::Waited::Closed => closed = true,
                    etcd::Waited::Answered => {}
                }
            }
        }
        while pending.len() < MAX_BATCH && !closed {
            match rx.try_recv() {
                Ok(job) => pending.push_back(job),
                Err(_) => break,
            }
        }
        if !pending.is_empty() && room(&flights) {
            let limits = shared.backend.limits();
            let mut on = None;
            let mut below = Vec::new();
            for f in &flights {
                if let Some((base, token, writes)) = f.sending.as_ref().and_then(Sending::chain) {
                    on = Some((base, token));
                    below.push(writes);
                }
            }
            let mut b = Batcher::new(shared.clone(), on, below);
            let (mut jobs, mut leaders) = (Vec::new(), Vec::new());
            while let Some(mut job) = pending.pop_front() {
                let Some(staged) = job(Step::Run(&b)) else {
                    jobs.push(job);
                    leaders.push(false);
                    continue;
                };
                let leader = staged.leader;
                match b.admit(staged, limits) {
                    Admit::Merged => {
                        jobs.push(job);
                        leaders.push(leader);
                    }
                    Admit::Full => {
                        pending.push_front(job);
                        break;
                    }
                    Admit::Refused(e) => {
                        job(Step::Answer(Err(Arc::new(e))));
                    }
                }
            }
            let sent_at = std::time::Instant::now();
            let sending = if b.is_empty() {
                None
            } else {
                let guard =
                    if b.leader { shared.guard.lock().unwrap_or_else(|p| p.into_inner()).clone() } else { None };
                Some(shared.backend.send(&mut b, &shared.published, guard, options))
            };
            flights.push_back(Flight { jobs, leaders, batch: b, sending, sent_at });
            if room(&flights) && !pending.is_empty() {
                continue;
            }
        }
        let Some(mut head) = flights.pop_front() else { continue };
        let result = match head.sending.take() {
            None => Ok(Committed::Done),
            Some(s) => {
                let r = s.finish(&mut head.batch, &shared.published, true);
                if matches!(r, Ok(Committed::Done)) {
                    shared.commit_seconds.observe(head.sent_at.elapsed().as_secs_f64());
                }
                r
            }
        };
        // `Ok(())`: a conflict (another server wrote first).
        let failure = match result {
            Ok(Committed::Done) => {
                conflicts = 0;
                for mut job in head.jobs {
                    job(Step::Answer(Ok(())));
                }
                continue;
            }
            Ok(Committed::Conflict) => Ok(()),
            Err(e) => Err(e),
        };
        // Every batch above was built on this one's writes: none of them is
        // acknowledged. Each one's answer is awaited first, applying nothing.
        let above: Vec<Flight> = flights.drain(..).collect();
        let mut above_jobs = Vec::new();
        for mut f in above {
            if let Some(s) = f.sending.take() {
                let _ = s.finish(&mut f.batch, &shared.published, false);
            }
            above_jobs.extend(f.jobs);
        }
        let (head_result, above_result) = match failure {
            Ok(()) if conflicts < MAX_CONFLICTS => {
                conflicts += 1;
                (None, None)
            }
            Ok(()) => (
                Some(Err(Arc::new(StoreError::Etcd(format!(
                    "other servers wrote first {MAX_CONFLICTS} times in a row; the write was not stored"
                ))))),
                None,
            ),
            Err(e) => {
                tracing::error!(error = %e, "store batch failed; its writes were not acknowledged");
                let e = Arc::new(e);
                // A batch that may have been stored may have let the ones
                // above commit too: they share its answer. Any other failure
                // means it never commits, and so neither do they.
                let above = matches!(*e, StoreError::Unconfirmed(_)).then(|| Err(e.clone()));
                (Some(Err(e)), above)
            }
        };
        match above_result {
            Some(r) => {
                for mut job in above_jobs {
                    job(Step::Answer(r.clone()));
                }
            }
            None => {
                // Run again, in their order, on the newer state.
                for job in above_jobs.into_iter().rev() {
                    pending.push_front(job);
                }
            }
        }
        match head_result {
            // Only its leader writes are refused; the others run again.
            Some(Err(e)) if matches!(*e, StoreError::NotLeader) => {
                conflicts = 0;
                let mut again = Vec::new();
                for (mut job, leader) in head.jobs.into_iter().zip(head.leaders) {
                    if leader {
                        job(Step::Answer(Err(e.clone())));
                    } else {
                        again.push(job);
                    }
                }
                for job in again.into_iter().rev() {
                    pending.push_front(job);
                }
            }
            Some(r) => {
                conflicts = 0;
                for mut job in head.jobs {
                    job(Step::Answer(r.clone()));
                }
            }
            None => {
                for job in head.jobs.into_iter().rev() {
                    pending.push_front(job);
                }
            }
        }
    }
    if let Backend::Sled(b) = &shared.backend {
        b.final_flush();
    }
}
