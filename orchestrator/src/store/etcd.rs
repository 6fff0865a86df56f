//! The store on etcd: several servers share one cluster's state.
//!
//! Reads come from a mirror of the prefix in memory (the kube-apiserver's
//! watch cache, in small), loaded by a range read at open and kept current by
//! one etcd watch on the prefix. The change log (`log/<rv>`) stays out of the
//! mirror (50,000 entries by default); a watch that replays it reads etcd.
//!
//! A batch commits as one etcd transaction that compares the revision of
//! `meta/rv` with the one the batch was built on: every batch writes
//! `meta/rv`, so the compare fails exactly when another server wrote since,
//! and the batch runs again once the mirror has caught up. etcd answers only
//! once a quorum has the transaction on disk.
//!
//! The feed from the watch and this server's own commits both apply to the
//! mirror and publish to watchers under the mirror's lock, so watchers get
//! every change once and in version order; the feed skips what a commit
//! already applied (its revision is not newer than the mirror's).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use std::sync::atomic::{AtomicU64, Ordering};

use crate::etcdv3::{
    self, prefix_end, Client, Compare, CompareResult, KeyValue, RangeRequest, RequestOp, TxnRequest, TxnResponse,
    WatchCreateRequest,
};
use pinion_wire::backoff::Doubling;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::sync::{mpsc, watch};

use super::{
    decode, log_key, object_key, read_counter, Base, Batcher, Change, Committed, Job, LeaderGuard, Limits, Published,
    StoreError, StoreOptions, Visit, Writes, KEY_LOG_START, KEY_RV, LOG_PREFIX,
};

/// Every batch writes its commit token here: this server's random id and a
/// count. A batch sent while another is in flight compares this key's value
/// with the other's token, so it commits only right after the other did.
const KEY_COMMIT: &[u8] = b"meta/commit";

/// Where a cluster's keys live in etcd unless configured otherwise.
pub const DEFAULT_PREFIX: &str = "/pinion/";
/// Keys per range read: a page stays well under gRPC's message limit. Small
/// in tests, so that their few hundred keys take several pages.
const PAGE: i64 = if cfg!(test) { 64 } else { 500 };

/// How to reach etcd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdConfig {
    /// `http://host:port` (loopback only) or `https://host:port`.
    pub endpoints: Vec<String>,
    /// The CA that signed etcd's server certificates (needed for https).
    pub ca: Option<PathBuf>,
    /// This server's client certificate and key, when etcd asks for one.
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    /// The key prefix this cluster's data lives under.
    pub prefix: String,
}

impl Default for EtcdConfig {
    fn default() -> Self {
        EtcdConfig {
            endpoints: vec!["http://127.0.0.1:2379".into()],
            ca: None,
            cert: None,
            key: None,
            prefix: DEFAULT_PREFIX.into(),
        }
    }
}

/// Bounds on the talk with etcd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EtcdOptions {
    /// Every request's bound: a server cut off from etcd answers writes with
    /// an error within it.
    pub request_timeout: Duration,
    /// etcd's `--max-txn-ops` (its default 128): a batch never holds more.
    pub max_txn_ops: usize,
    /// etcd's `--max-request-bytes` (its default 1.5 MiB).
    pub max_request_bytes: usize,
    /// Most batches in flight at once (1: each waits for the one before).
    /// A write takes a quorum's fsyncs; while one batch waits for them the
    /// next is built and sent. 1 by default: on a small host running the
    /// etcd members too, two in flight made more, smaller transactions and
    /// bound fewer pods per second (BENCHMARKS.md).
    pub pipeline_depth: usize,
    /// How often the leader compacts etcd's history (`compaction`); None
    /// where etcd compacts itself (`--auto-compaction-retention`).
    pub compaction_interval: Option<Duration>,
}

impl Default for EtcdOptions {
    fn default() -> Self {
        EtcdOptions {
            request_timeout: Duration::from_secs(5),
            max_txn_ops: 128,
            max_request_bytes: 1536 * 1024,
            pipeline_depth: 1,
            // The kube-apiserver's default.
            compaction_interval: Some(Duration::from_secs(300)),
        }
    }
}

/// An etcd call that failed, or outran its bound (the election's, the
/// identity's and the peers' calls; the store's own keep their finer errors).
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("etcd: {0}")]
    Etcd(#[from] etcdv3::Error),
    #[error("etcd did not answer within {0:?}")]
    Timeout(Duration),
}

/// `f`, bounded by `limit`.
pub async fn bounded<T>(
    limit: Duration,
    f: impl std::future::Future<Output = Result<T, etcdv3::Error>>,
) -> Result<T, CallError> {
    match tokio::time::timeout(limit, f).await {
        Ok(r) => Ok(r?),
        Err(_) => Err(CallError::Timeout(limit)),
    }
}

/// Connects to etcd (rustls for https). Plain http is refused except to
/// loopback: etcd holds the cluster's state, claims included.
pub async fn connect(config: &EtcdConfig) -> Result<Client, StoreError> {
    let bad = |m: String| StoreError::Etcd(m);
    if config.endpoints.is_empty() {
        return Err(bad("endpoints: at least one etcd endpoint is needed".into()));
    }
    let mut https = false;
    for e in &config.endpoints {
        let (scheme, rest) =
            e.split_once("://").ok_or_else(|| bad(format!("endpoints: {e:?} has no scheme (http:// or https://)")))?;
        let host = rest.rsplit_once(':').map_or(rest, |(h, _)| h).trim_matches(['[', ']']);
        match scheme {
            "https" => https = true,
            "http" if host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|a| a.is_loopback()) => {}
            "http" => {
                return Err(bad(format!("endpoints: {e:?} is plain http to another machine; use https with a CA")))
            }
            _ => return Err(bad(format!("endpoints: {e:?}: the scheme must be http or https"))),
        }
    }
    let tls = if https { Some(client_tls(config)?) } else { None };
    match tokio::time::timeout(Duration::from_secs(10), Client::connect(&config.endpoints, tls)).await {
        Ok(Ok(client)) => Ok(client),
        Ok(Err(e)) => Err(bad(format!("connecting to {}: {e}", config.endpoints.join(",")))),
        Err(_) => Err(bad(format!("connecting to {}: no answer within 10 s", config.endpoints.join(",")))),
    }
}

/// The TLS configuration for https endpoints: trusts only the CA given
/// (every certificate in its file), and presents the client certificate
/// when one is given.
fn client_tls(config: &EtcdConfig) -> Result<rustls::ClientConfig, StoreError> {
    let bad = |m: String| StoreError::Etcd(m);
    let read = |what: &str, path: &PathBuf| {
        std::fs::read(path).map_err(|err| bad(format!("{what} {}: {err}", path.display())))
    };
    let ca = config.ca.as_ref().ok_or_else(|| bad("ca: an https endpoint needs the etcd CA certificate".into()))?;
    let ca_path = ca.display();
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&read("ca", ca)?) {
        let cert = cert.map_err(|e| bad(format!("ca {ca_path}: {e}")))?;
        roots.add(cert).map_err(|e| bad(format!("ca {ca_path}: {e}")))?;
    }
    if roots.is_empty() {
        return Err(bad(format!("ca {ca_path}: holds no PEM certificate")));
    }
    let builder = rustls::ClientConfig::builder_with_provider(pinion_wire::tls::provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| bad(format!("TLS: {e}")))?
        .with_root_certificates(roots);
    match (&config.cert, &config.key) {
        (Some(cert), Some(key)) => {
            let chain = CertificateDer::pem_slice_iter(&read("cert", cert)?)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| bad(format!("cert {}: {e}", cert.display())))?;
            if chain.is_empty() {
                return Err(bad(format!("cert {}: holds no PEM certificate", cert.display())));
            }
            let private = PrivateKeyDer::from_pem_slice(&read("key", key)?)
                .map_err(|e| bad(format!("key {}: {e}", key.display())))?;
            builder.with_client_auth_cert(chain, private).map_err(|e| bad(format!("cert, key: {e}")))
        }
        (None, None) => Ok(builder.with_no_client_auth()),
        _ => Err(bad("cert, key: give both the client certificate and its key, or neither".into())),
    }
}

/// The keys under the prefix, without it, the log left out.
#[derive(Default)]
struct Mirror {
    kv: BTreeMap<Vec<u8>, Vec<u8>>,
    /// The etcd revision the mirror is current to.
    revision: i64,
    /// The revision that last wrote `meta/rv`: what a transaction compares.
    rv_revision: i64,
}

impl Mirror {
    fn counter(&self, key: &[u8]) -> u64 {
        read_counter(self.kv.get(key).map(Vec::as_slice))
    }
}

/// What the backend and its feed task share.
struct Follow {
    client: Client,
    prefix: Vec<u8>,
    options: EtcdOptions,
    mirror: RwLock<Mirror>,
    /// The mirror's revision, for a committer waiting to catch up.
    revision: watch::Sender<i64>,
    published: Arc<Published>,
}

pub(super) struct EtcdBackend {
    follow: Arc<Follow>,
    /// This store's random id, the first part of its commit tokens.
    id: [u8; 16],
    /// Batches sent, the second part.
    sent: AtomicU64,
    /// The committer thread is no tokio thread; it runs etcd calls on this.
    runtime: tokio::runtime::Handle,
    feed: tokio::task::JoinHandle<()>,
}

impl Drop for EtcdBackend {
    fn drop(&mut self) {
        self.feed.abort();
    }
}

fn etcd_error(during: &str, e: etcdv3::Error) -> StoreError {
    StoreError::Etcd(format!("{during}: {e}"))
}

fn timed_out(during: &str, options: EtcdOptions) -> StoreError {
    StoreError::Etcd(format!("{during}: no answer within {:?}", options.request_timeout))
}

impl Follow {
    fn key(&self, rel: &[u8]) -> Vec<u8> {
        let mut k = self.prefix.clone();
        k.extend_from_slice(rel);
        k
    }

    fn read(&self) -> RwLockReadGuard<'_, Mirror> {
        self.mirror.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, Mirror> {
        self.mirror.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Every key in `[start, end)` at `revision` (0: the newest), page by page;
    /// returns the revision read at.
    async fn range(
        &self,
        start: Vec<u8>,
        end: &[u8],
        mut revision: i64,
        f: &mut (dyn FnMut(KeyValue) -> Result<(), StoreError> + Send),
    ) -> Result<i64, StoreError> {
        let mut from = start;
        loop {
            let request = RangeRequest::key(from.clone()).until(end.to_vec()).limit(PAGE).at(revision);
            let resp = match tokio::time::timeout(self.options.request_timeout, self.client.range(request)).await {
                Ok(Ok(r)) => r,
                Ok(Err(e)) => return Err(etcd_error("range read", e)),
                Err(_) => return Err(timed_out("range read", self.options)),
            };
            if revision == 0 {
                revision = resp.revision();
            }
            let more = resp.more;
            let kvs = resp.kvs;
            let next = kvs.last().map(|kv| {
                let mut k = kv.key.clone();
                k.push(0);
                k
            });
            for kv in kvs {
                f(kv)?;
            }
            match next {
                Some(next) if more => from = next,
                _ => return Ok(revision),
            }
        }
    }

    /// Reads the prefix, the log left out, at one revision.
    async fn load(&self) -> Result<Mirror, StoreError> {
        let mut m = Mirror::default();
        let prefix_len = self.prefix.len();
        let mut take = |kv: KeyValue| {
            let rel = kv.key.get(prefix_len..).unwrap_or_default();
            if rel == KEY_RV {
                m.rv_revision = kv.mod_revision;
            }
            m.kv.insert(rel.to_vec(), kv.value);
            Ok(())
        };
        let log = self.key(LOG_PREFIX.as_bytes());
        // `0` follows `/`: the first key after the whole log.
        let after_log = self.key(b"log0");
        let revision = self.range(self.prefix.clone(), &log, 0, &mut take).await?;
        self.range(after_log, &prefix_end(&self.prefix), revision, &mut take).await?;
        m.revision = revision;
        Ok(m)
    }

    async fn log_range(&self, from: u64, to: u64) -> Result<Vec<Change>, StoreError> {
        let mut out = Vec::new();
        let end = self.key(&log_key(to.saturating_add(1)));
        self.range(self.key(&log_key(from)), &end, 0, &mut |kv| {
            out.push((decode(&kv.key, &kv.value)?, kv.mod_revision));
            Ok(())
        })
        .await?;
        self.fill_objects(&mut out, from.saturating_sub(1)).await?;
        Ok(out.into_iter().map(|(c, _)| c).collect())
    }

    /// Gives slim log entries (`store::log_entry`) their objects from etcd's
    /// history: the keys of one revision read at it in one transaction. Where
    /// etcd compacted that revision away, the key's value now serves if
    /// nothing wrote it since; otherwise the change is lost to history and
    /// the reader is told Gone, as a watch from a compacted revision is.
    async fn fill_objects(&self, entries: &mut [(Change, i64)], requested: u64) -> Result<(), StoreError> {
        let mut by_revision: BTreeMap<i64, Vec<usize>> = BTreeMap::new();
        for (i, (c, revision)) in entries.iter().enumerate() {
            if c.object.is_empty() {
                by_revision.entry(*revision).or_default().push(i);
            }
        }
        let mut reads = Vec::new();
        for (revision, wanted) in by_revision {
            for chunk in wanted.chunks(self.options.max_txn_ops.max(1)) {
                reads.push((revision, chunk.to_vec()));
            }
        }
        // A few reads in flight at once: a replay of many commits is many
        // round trips, each a quorum's read index.
        let mut reads = reads.into_iter();
        let mut flying = tokio::task::JoinSet::new();
        let mut lost: Option<u64> = None;
        loop {
            while flying.len() < REPLAY_READS {
                let Some((revision, chunk)) = reads.next() else { break };
                let keys: Vec<Vec<u8>> =
                    chunk.iter().map(|&i| self.key(&object_key(entries[i].0.kind, &entries[i].0.name))).collect();
                let (client, options) = (self.client.clone(), self.options);
                flying.spawn(async move { (revision, chunk, read_history(client, options, keys, revision).await) });
            }
            let Some(done) = flying.join_next().await else { break };
            let (revision, chunk, read) =
                done.map_err(|e| StoreError::Etcd(format!("reading the log's objects: the read's task ended: {e}")))?;
            let (resp, now) = read?;
            for (j, &i) in chunk.iter().enumerate() {
                match resp.found(j) {
                    Some(found) if !now || found.mod_revision == revision => {
                        entries[i].0.object = String::from_utf8_lossy(&found.value).into_owned();
                    }
                    _ => lost = lost.max(Some(entries[i].0.rv)),
                }
            }
        }
        match lost {
            Some(rv) => Err(StoreError::Gone { requested, oldest: rv + 1 }),
            None => Ok(()),
        }
    }

    /// Applies one watch response: newer events go into the mirror, the
    /// log entries among them are published.
    fn apply_events(&self, events: &[etcdv3::proto::Event]) {
        let mut m = self.write();
        // A slim log entry's object is the put of its key in the same
        // transaction: etcd never splits one revision's events between
        // responses. Only events the mirror has not seen (not the echo of
        // this server's own commits, which it applied already).
        let puts: std::collections::HashMap<(&[u8], i64), &[u8]> = events
            .iter()
            .filter(|ev| !ev.is_delete())
            .filter_map(|ev| ev.kv.as_ref().filter(|kv| kv.mod_revision > m.revision))
            .map(|kv| ((kv.key.as_slice(), kv.mod_revision), kv.value.as_slice()))
            .collect();
        let mut top = m.revision;
        let mut changes = Vec::new();
        let mut lost = false;
        for ev in events {
            let Some(kv) = ev.kv.as_ref() else { continue };
            if kv.mod_revision <= m.revision {
                continue;
            }
            top = top.max(kv.mod_revision);
            let Some(rel) = kv.key.strip_prefix(self.prefix.as_slice()) else { continue };
            let put = !ev.is_delete();
            if rel.starts_with(LOG_PREFIX.as_bytes()) {
                if put {
                    match decode::<Change>(&kv.key, &kv.value) {
                        Ok(mut c) if c.object.is_empty() => {
                            let key = self.key(&object_key(c.kind, &c.name));
                            match puts.get(&(key.as_slice(), kv.mod_revision)) {
                                Some(object) => {
                                    c.object = String::from_utf8_lossy(object).into_owned();
                                    changes.push(c);
                                }
                                None => {
                                    tracing::warn!(
                                        rv = c.rv,
                                        "a change-log entry's object is not in its revision's events"
                                    );
                                    lost = true;
                                }
                            }
                        }
                        Ok(c) => changes.push(c),
                        Err(e) => {
                            tracing::warn!(error = %e, "a change-log entry from etcd does not decode");
                            lost = true;
                        }
                    }
                }
                continue;
            }
            if rel == KEY_RV {
                m.rv_revision = kv.mod_revision;
            }
            if put {
                m.kv.insert(rel.to_vec(), kv.value.clone());
            } else {
                m.kv.remove(rel);
            }
        }
        m.revision = top;
        changes.sort_by_key(|c| c.rv);
        self.published.publish(m.counter(KEY_RV), m.counter(KEY_LOG_START), changes);
        if lost {
            // Its watchers find the gap and read the log, which names the key.
            self.published.gap(m.counter(KEY_RV));
        }
        self.revision.send_replace(top);
    }

    /// Reloads the mirror after the watch lost its place (its revision was
    /// compacted) and publishes the changes missed meanwhile from the log.
    async fn reload(&self) -> Result<(), StoreError> {
        let fresh = self.load().await?;
        let from = self.published.rv.load(std::sync::atomic::Ordering::Acquire) + 1;
        let top = fresh.counter(KEY_RV);
        let mut lost = false;
        let missed = if top >= from {
            match self.log_range(from, top).await {
                Ok(missed) => missed,
                // Lost to etcd's compaction: the watchers behind find the gap,
                // read the log and are told Gone, and list again.
                Err(StoreError::Gone { oldest, .. }) => {
                    tracing::warn!(from, oldest, "changes missed while the watch was away were compacted in etcd");
                    lost = true;
                    Vec::new()
                }
                Err(e) => return Err(e),
            }
        } else {
            Vec::new()
        };
        let mut m = self.write();
        // A commit of this server's may have moved the mirror past the reload.
        if fresh.revision > m.revision {
            *m = fresh;
        }
        self.published.publish(m.counter(KEY_RV), m.counter(KEY_LOG_START), missed);
        if lost {
            self.published.gap(top);
        }
        self.revision.send_replace(m.revision);
        Ok(())
    }

    /// Follows the prefix until aborted: one watch from the mirror's next
    /// revision, set up again whenever it ends.
    async fn feed(self: Arc<Follow>) {
        let mut backoff = WATCH_RETRY.base;
        loop {
            let from = self.read().revision + 1;
            let request = WatchCreateRequest::key(self.prefix.clone()).prefix().since(from).progress_notify();
            match tokio::time::timeout(self.options.request_timeout, self.client.watch(request)).await {
                Ok(Ok(mut stream)) => loop {
                    match stream.message().await {
                        Ok(Some(resp)) if resp.canceled => {
                            if resp.compact_revision > 0 {
                                tracing::warn!(
                                    from,
                                    compacted = resp.compact_revision,
                                    "etcd compacted past the store's watch; reloading"
                                );
                                if let Err(e) = self.reload().await {
                                    tracing::warn!(error = %e, "reloading the store from etcd failed; trying again");
                                }
                            } else {
                                tracing::warn!(reason = resp.cancel_reason, "etcd cancelled the store's watch");
                            }
                            break;
                        }
                        Ok(Some(resp)) => {
                            backoff = WATCH_RETRY.base;
                            if !resp.events.is_empty() {
                                self.apply_events(&resp.events);
                            }
                        }
                        Ok(None) => {
                            tracing::warn!("the store's etcd watch ended; watching again");
                            break;
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "the store's etcd watch broke; watching again");
                            break;
                        }
                    }
                },
                Ok(Err(e)) => tracing::warn!(error = %e, "cannot watch etcd; trying again"),
                Err(_) => {
                    tracing::warn!(timeout = ?self.options.request_timeout, "etcd did not answer a watch; trying again")
                }
            }
            tokio::time::sleep(backoff).await;
            backoff = WATCH_RETRY.after(backoff);
        }
    }
}

/// The wait before watching again after a watch ended or failed.
const WATCH_RETRY: Doubling = Doubling::new(Duration::from_millis(100), Duration::from_secs(5));

/// Reads of a replay's objects in flight at once (`Follow::fill_objects`).
const REPLAY_READS: usize = 8;

/// `keys` as they were at `revision`, in one transaction; where etcd
/// compacted that revision, as they are now (`true`), for the caller to
/// check that nothing wrote them since.
async fn read_history(
    client: Client,
    options: EtcdOptions,
    keys: Vec<Vec<u8>>,
    revision: i64,
) -> Result<(TxnResponse, bool), StoreError> {
    let during = "reading the log's objects";
    for (at, now) in [(revision, false), (0, true)] {
        let ops = keys.iter().map(|k| RequestOp::range(RangeRequest::key(k.clone()).at(at)));
        match tokio::time::timeout(options.request_timeout, client.txn(TxnRequest::new([], ops, []))).await {
            Ok(Ok(resp)) => return Ok((resp, now)),
            // etcd's ErrCompacted: "mvcc: required revision has been compacted".
            Ok(Err(etcdv3::Error::Status { code: OUT_OF_RANGE, message })) if message.contains("compacted") => {}
            Ok(Err(e)) => return Err(etcd_error(during, e)),
            Err(_) => return Err(timed_out(during, options)),
        }
    }
    Err(StoreError::Etcd(format!("{during}: etcd says even its newest revision is compacted")))
}

/// gRPC codes with which etcd refuses a request before applying it
/// (invalid argument, permission denied, resource exhausted, failed
/// precondition, out of range, unauthenticated): the write surely is not stored.
const REFUSED: [i32; 6] = [3, 7, 8, 9, OUT_OF_RANGE, 16];
/// The gRPC code of etcd's "required revision has been compacted".
const OUT_OF_RANGE: i32 = 11;

impl EtcdBackend {
    pub(super) async fn open(
        client: Client,
        prefix: &str,
        options: EtcdOptions,
    ) -> Result<(EtcdBackend, Arc<Published>), StoreError> {
        if prefix.is_empty() {
            return Err(StoreError::Etcd("prefix: must not be empty (e.g. /pinion/)".into()));
        }
        let (revision, _) = watch::channel(0);
        let mut follow = Follow {
            client,
            prefix: prefix.as_bytes().to_vec(),
            options,
            mirror: RwLock::new(Mirror::default()),
            revision,
            published: Arc::new(Published::new(0, 1)),
        };
        let mirror = follow.load().await?;
        follow.published = Arc::new(Published::new(mirror.counter(KEY_RV), mirror.counter(KEY_LOG_START).max(1)));
        follow.revision.send_replace(mirror.revision);
        follow.mirror = RwLock::new(mirror);
        let follow = Arc::new(follow);
        let published = follow.published.clone();
        let mut id = [0u8; 16];
        rustls::crypto::ring::default_provider()
            .secure_random
            .fill(&mut id)
            .map_err(|_| StoreError::Etcd("no random bytes for the store's commit id".into()))?;
        let feed = tokio::spawn(follow.clone().feed());
        let runtime = tokio::runtime::Handle::current();
        Ok((EtcdBackend { follow, id, sent: AtomicU64::new(0), runtime, feed }, published))
    }

    pub(super) fn get(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.follow.read().kv.get(key).cloned()
    }

    pub(super) fn scan(&self, prefix: &[u8], f: &mut Visit<'_>) -> Result<(), StoreError> {
        let m = self.follow.read();
        for (k, v) in m.kv.range(prefix.to_vec()..).take_while(|(k, _)| k.starts_with(prefix)) {
            f(k, v)?;
        }
        Ok(())
    }

    pub(super) fn base(&self) -> Base {
        let m = self.follow.read();
        Base { rv: m.counter(KEY_RV), revision: m.rv_revision, log_start: m.counter(KEY_LOG_START).max(1) }
    }

    pub(super) fn limits(&self) -> Limits {
        let o = self.follow.options;
        Limits {
            max_ops: o.max_txn_ops,
            max_bytes: o.max_request_bytes,
            key_prefix: self.follow.prefix.len(),
            slim_log: true,
        }
    }

    pub(super) async fn log_range(&self, from: u64, to: u64) -> Result<Vec<Change>, StoreError> {
        self.follow.log_range(from, to).await
    }

    pub(super) fn pipeline_depth(&self) -> usize {
        self.follow.options.pipeline_depth
    }

    /// Sends the batch as one transaction; see the module's comment. Its
    /// writes move into the returned `Sent`, where batches built above it read them.
    pub(super) fn send(
        &self,
        b: &mut Batcher,
        guard: Option<LeaderGuard>,
        options: StoreOptions,
    ) -> Result<Sent, StoreError> {
        let f = &self.follow;
        let rv_key = f.key(KEY_RV);
        let commit_key = f.key(KEY_COMMIT);
        let mut token = self.id.to_vec();
        token.extend_from_slice(&self.sent.fetch_add(1, Ordering::Relaxed).to_be_bytes());
        let mut compares = vec![match &b.chain {
            // Only the batch below writes its token, once: equal means it
            // committed and nothing since.
            Some(below) => Compare::value(commit_key.clone(), CompareResult::Equal, below.to_vec()),
            None => Compare::mod_revision(rv_key.clone(), CompareResult::Equal, b.base.revision),
        }];
        let mut on_failure = vec![RequestOp::get(rv_key.clone()), RequestOp::get(commit_key.clone())];
        let leader = b.leader;
        if leader {
            let Some(guard) = &guard else { return Err(StoreError::NotLeader) };
            compares.push(Compare::lease(guard.key.clone(), CompareResult::Equal, guard.lease));
            on_failure.push(RequestOp::get(guard.key.clone()));
        }
        let writes = Arc::new(std::mem::take(&mut b.writes));
        let mut ops = Vec::with_capacity(b.log.len() + writes.len() + 4);
        for (rv, bytes) in &b.log {
            ops.push(RequestOp::put(f.key(&log_key(*rv)), bytes.clone(), 0));
        }
        for (k, v) in writes.iter() {
            ops.push(match v {
                Some(v) => RequestOp::put(f.key(k), v.clone(), 0),
                None => RequestOp::delete(f.key(k)),
            });
        }
        ops.push(RequestOp::put(rv_key, b.rv.to_be_bytes().to_vec(), 0));
        ops.push(RequestOp::put(commit_key, token.clone(), 0));
        // Compact the log to its bound in the same transaction.
        let start = b.base.log_start;
        let new_start = b.rv.saturating_sub(options.log_keep).max(start);
        if new_start > start {
            ops.push(RequestOp::delete_range(f.key(&log_key(start)), f.key(&log_key(new_start))));
            ops.push(RequestOp::put(f.key(KEY_LOG_START), new_start.to_be_bytes().to_vec(), 0));
        }
        // The batch's first log entry, read back when the compare fails after
        // a send whose outcome was lost: found as written, the commit was ours.
        let first_log = b.log.first().map(|(rv, bytes)| (f.key(&log_key(*rv)), bytes.clone()));
        if let Some((key, _)) = &first_log {
            on_failure.push(RequestOp::get(key.clone()));
        }
        let txn = TxnRequest::new(compares, ops, on_failure);
        let client = f.client.clone();
        let timeout = f.options.request_timeout;
        // A send whose outcome is lost (the member died with it, the reply
        // was cut) is sent again, to another member if the client has one,
        // within one `request_timeout`: the compare makes that safe (a second
        // commit is impossible), and the read-back of the token and of the
        // first log entry tells a commit of ours from another server's.
        let handle = self.runtime.spawn(async move {
            let deadline = tokio::time::Instant::now() + timeout;
            let mut lost: Option<String> = None;
            loop {
                match tokio::time::timeout_at(deadline, client.txn(txn.clone())).await {
                    Ok(Ok(resp)) => return Ok((resp, lost)),
                    Ok(Err(etcdv3::Error::Status { code, message })) if REFUSED.contains(&code) => {
                        // An earlier send of it may still have been stored.
                        return Err(match lost {
                            Some(l) => StoreError::Unconfirmed(format!("{l}; sent again, refused: {message}")),
                            None => StoreError::Etcd(format!("the write was refused: {message}")),
                        });
                    }
                    Ok(Err(e)) if tokio::time::Instant::now() < deadline => {
                        tracing::warn!(error = %e, "etcd: a commit's outcome was lost; sending it again");
                        lost = Some(e.to_string());
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    Ok(Err(e)) => return Err(StoreError::Unconfirmed(e.to_string())),
                    Err(_) => return Err(StoreError::Unconfirmed(format!("no answer within {timeout:?}"))),
                }
            }
        });
        let next = Base { rv: b.rv, revision: 0, log_start: new_start };
        Ok(Sent {
            follow: f.clone(),
            runtime: self.runtime.clone(),
            writes,
            next,
            token: token.into(),
            leader: leader.then_some(guard).flatten(),
            first_log: first_log.map(|(_, bytes)| bytes),
            start,
            new_start,
            handle,
            answer: None,
        })
    }
}

type Answer = Result<(TxnResponse, Option<String>), StoreError>;

/// What `Sent::wait_or_recv` saw first.
pub(super) enum Waited {
    Answered,
    Job(Job),
    /// Every `Store` handle is gone.
    Closed,
}

/// A batch's transaction, sent.
pub(super) struct Sent {
    follow: Arc<Follow>,
    runtime: tokio::runtime::Handle,
    writes: Arc<Writes>,
    /// What a batch built above this one is built on.
    next: Base,
    token: Arc<[u8]>,
    /// The guard of a leader batch.
    leader: Option<LeaderGuard>,
    first_log: Option<Vec<u8>>,
    start: u64,
    new_start: u64,
    handle: tokio::task::JoinHandle<Answer>,
    answer: Option<Answer>,
}

fn joined(r: Result<Answer, tokio::task::JoinError>) -> Answer {
    r.unwrap_or_else(|e| Err(StoreError::Unconfirmed(format!("the commit's task ended: {e}"))))
}

impl Sent {
    pub(super) fn chain(&self) -> (Base, Arc<[u8]>, Arc<Writes>) {
        (self.next, self.token.clone(), self.writes.clone())
    }

    /// Waits for etcd's answer or the next write, whichever comes first.
    pub(super) fn wait_or_recv(&mut self, rx: &mut mpsc::Receiver<Job>) -> Waited {
        if self.answer.is_some() {
            return Waited::Answered;
        }
        let handle = &mut self.handle;
        let (waited, answer) = self.runtime.block_on(async {
            tokio::select! {
                biased;
                r = handle => (Waited::Answered, Some(joined(r))),
                job = rx.recv() => (job.map_or(Waited::Closed, Waited::Job), None),
            }
        });
        if answer.is_some() {
            self.answer = answer;
        }
        waited
    }

    /// See `Sending::finish`.
    pub(super) fn finish(
        mut self,
        b: &mut Batcher,
        published: &Published,
        apply: bool,
    ) -> Result<Committed, StoreError> {
        let answer = match self.answer.take() {
            Some(a) => a,
            None => {
                let handle = &mut self.handle;
                joined(self.runtime.block_on(handle))
            }
        };
        let (resp, lost) = answer?;
        let f = &self.follow;
        let got = |i: usize| resp.found(i);
        let first_log_at = if self.leader.is_some() { 3 } else { 2 };
        let ours_already = lost.is_some()
            && !resp.succeeded
            && (got(1).is_some_and(|kv| kv.value == *self.token)
                || self.first_log.as_ref().is_some_and(|bytes| got(first_log_at).is_some_and(|kv| kv.value == *bytes)));
        if lost.is_some() && !resp.succeeded && !ours_already && self.first_log.is_none() {
            return Err(StoreError::Unconfirmed(lost.unwrap_or_default()));
        }
        if resp.succeeded || ours_already {
            if !apply {
                return Ok(Committed::Done);
            }
            if ours_already {
                // Its revision is unknown: the mirror takes it from the feed,
                // which this waits for (a later revision of `meta/rv`
                // includes it), so that no batch reads a mirror without it.
                let wanted = got(0).map_or(0, |kv| kv.mod_revision);
                let mut caught_up = f.revision.subscribe();
                let waited = self.runtime.block_on(async {
                    tokio::time::timeout(f.options.request_timeout, caught_up.wait_for(|r| *r >= wanted)).await
                });
                if !matches!(waited, Ok(Ok(_))) {
                    return Err(StoreError::Unconfirmed(format!(
                        "{}; sent again, it was found stored, but this server's view of etcd did not reach revision {wanted} within {:?}",
                        lost.unwrap_or_default(),
                        f.options.request_timeout
                    )));
                }
                let _m = f.write();
                published.publish(b.rv, self.new_start, std::mem::take(&mut b.changes));
                return Ok(Committed::Done);
            }
            let revision = resp.revision();
            let mut m = f.write();
            // The feed may have applied this commit, and later ones, already.
            if m.revision < revision {
                for (k, v) in self.writes.iter() {
                    match v {
                        Some(v) => m.kv.insert(k.clone(), v.clone()),
                        None => m.kv.remove(k),
                    };
                }
                m.kv.insert(KEY_RV.to_vec(), b.rv.to_be_bytes().to_vec());
                m.kv.insert(KEY_COMMIT.to_vec(), self.token.to_vec());
                if self.new_start > self.start {
                    m.kv.insert(KEY_LOG_START.to_vec(), self.new_start.to_be_bytes().to_vec());
                }
                m.rv_revision = revision;
                m.revision = revision;
            }
            // Published before the callers are answered: a caller that
            // watches from its write's version must find it.
            published.publish(b.rv, self.new_start, std::mem::take(&mut b.changes));
            f.revision.send_replace(m.revision);
            return Ok(Committed::Done);
        }
        if let Some(guard) = &self.leader {
            if got(2).map(|kv| kv.lease) != Some(guard.lease) {
                return Err(StoreError::NotLeader);
            }
        }
        if !apply {
            return Ok(Committed::Conflict);
        }
        let wanted = got(0).map_or(0, |kv| kv.mod_revision);
        let mut caught_up = f.revision.subscribe();
        let waited = self.runtime.block_on(async {
            tokio::time::timeout(f.options.request_timeout, caught_up.wait_for(|r| *r >= wanted)).await
        });
        match waited {
            Ok(Ok(_)) => Ok(Committed::Conflict),
            _ => Err(StoreError::Etcd(format!(
                "another server wrote first and this server's view of etcd did not reach revision {wanted} within {:?}",
                f.options.request_timeout
            ))),
        }
    }
}
