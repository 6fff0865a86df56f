//! One suite for both backends: each shared test runs on sled and on a real
//! etcd (`on_both!`); the rest are about one backend.

use std::collections::BTreeSet;
use std::time::Duration;

use super::*;
use crate::testing::etcd::{available, EtcdCluster};

const PREFIX: &str = "/pinion-test/";

/// Where a test's store lives.
// One per test: its size does not matter.
#[allow(clippy::large_enum_variant)]
enum Fixture {
    Sled(tempfile::TempDir),
    Etcd { cluster: EtcdCluster, etcd: EtcdOptions },
}

impl Fixture {
    fn sled() -> Fixture {
        Fixture::Sled(tempfile::tempdir().expect("tempdir"))
    }

    /// `None` when etcd is missing outside CI (`available` says SKIPPED).
    async fn etcd(test: &str, members: usize) -> Option<Fixture> {
        if !available(test) {
            return None;
        }
        let cluster = EtcdCluster::start(members).await.unwrap_or_else(|e| panic!("{test}: {e}"));
        let etcd = EtcdOptions { request_timeout: Duration::from_secs(2), ..EtcdOptions::default() };
        Some(Fixture::Etcd { cluster, etcd })
    }

    async fn open(&self, options: StoreOptions) -> Store {
        match self {
            Fixture::Sled(dir) => {
                // A store just dropped may still hold sled's lock while its committer ends.
                for _ in 0..500 {
                    if let Ok(s) = Store::open(dir.path(), options) {
                        return s;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                panic!("cannot open the sled store again within 10 s");
            }
            Fixture::Etcd { cluster, etcd } => {
                let client = connect(&cluster.config(PREFIX)).await.expect("connect");
                Store::open_etcd(client, PREFIX, options, *etcd).await.expect("open_etcd")
            }
        }
    }
}

/// A shared test, once per backend.
macro_rules! on_both {
    ($name:ident) => {
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sled() {
                super::$name(&super::Fixture::sled()).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn etcd() {
                if let Some(f) = super::Fixture::etcd(concat!(stringify!($name), "::etcd"), 1).await {
                    super::$name(&f).await;
                }
            }
        }
    };
}

fn pod(name: &str) -> Pod {
    specs::testing::pod(name).named("c").image("busybox").build()
}

async fn try_create(store: &Store, name: &str) -> Result<u64, StoreError> {
    let p = pod(name);
    store.write(move |t| -> Result<u64, StoreError> { t.put(&mut p.clone()) }).await
}

async fn create(store: &Store, name: &str) -> u64 {
    match try_create(store, name).await {
        Ok(rv) => rv,
        Err(e) => panic!("write of {name} failed: {e}"),
    }
}

/// Every change after `from`, until `count` arrived (30 s at most).
async fn collect(w: &mut Watch, count: usize) -> Vec<Arc<Change>> {
    let mut out = Vec::new();
    while out.len() < count {
        match tokio::time::timeout(Duration::from_secs(30), w.next()).await {
            Ok(Ok(c)) => out.push(c),
            Ok(Err(e)) => panic!("watch failed after {} changes: {e}", out.len()),
            Err(_) => panic!("only {} of {count} changes within 30 s", out.len()),
        }
    }
    out
}

on_both!(durable_across_reopen_and_versions_monotonic);
async fn durable_across_reopen_and_versions_monotonic(f: &Fixture) {
    let mut versions = Vec::new();
    {
        let store = f.open(StoreOptions::default()).await;
        for i in 0..20 {
            versions.push(create(&store, &format!("p{i}")).await);
        }
    }
    let store = f.open(StoreOptions::default()).await;
    assert!(versions.windows(2).all(|w| w[0] < w[1]), "{versions:?}");
    let listed = store.list::<Pod>().expect("list");
    assert_eq!(listed.items.len(), 20);
    assert_eq!(listed.rv, *versions.last().expect("some"));
    assert!(create(&store, "after").await > listed.rv);
}

on_both!(watch_resumes_from_a_version_and_reports_gone);
async fn watch_resumes_from_a_version_and_reports_gone(f: &Fixture) {
    let store = f.open(StoreOptions { log_keep: 10, ..StoreOptions::default() }).await;
    let mut rvs = Vec::new();
    for i in 0..5 {
        rvs.push(create(&store, &format!("p{i}")).await);
    }
    let mut w = store.watch(rvs[1]).await.expect("watch");
    let seen: Vec<String> = collect(&mut w, 3).await.iter().map(|c| c.name.clone()).collect();
    assert_eq!(seen, ["p2", "p3", "p4"]);
    let live = create(&store, "live").await;
    // A caller that watches from its own write's version is not refused.
    let mut from_own = store.watch(live).await.expect("watch from the write's version");
    assert_eq!(w.next().await.expect("next").name, "live");
    for i in 0..20 {
        create(&store, &format!("q{i}")).await;
    }
    assert_eq!(from_own.next().await.expect("next").name, "q0");
    match store.watch(rvs[0]).await {
        Err(StoreError::Gone { requested, .. }) => assert_eq!(requested, rvs[0]),
        other => panic!("expected Gone, got {:?}", other.map(|_| ())),
    }
    // The log kept its bound: the newest `log_keep` changes replay.
    let top = store.resource_version();
    let mut recent = store.watch(top - 9).await.expect("watch within the log");
    let replayed: Vec<u64> = collect(&mut recent, 9).await.iter().map(|c| c.rv).collect();
    assert_eq!(replayed.last(), Some(&top));
    // Those came from the store's recent changes; reopened, it holds none,
    // and the same watch replays the log.
    drop((w, from_own, recent));
    drop(store);
    let store = f.open(StoreOptions { log_keep: 10, ..StoreOptions::default() }).await;
    let mut from_log = store.watch(top - 9).await.expect("watch within the log, reopened");
    let again: Vec<u64> = collect(&mut from_log, 9).await.iter().map(|c| c.rv).collect();
    assert_eq!(again, replayed);
}

/// A pod with a `kib` KiB annotation.
fn big_pod(name: &str, kib: usize) -> Pod {
    let mut p = pod(name);
    p.metadata.annotations.insert("test.pinion.io/blob".into(), "x".repeat(kib << 10));
    p
}

/// The sled log's entries and bytes as stored.
fn sled_log(store: &Store) -> (usize, u64) {
    match &store.shared.backend {
        Backend::Sled(b) => b.log_stored().expect("scan the log"),
        Backend::Etcd(_) => panic!("a sled test opened etcd"),
    }
}

/// Churn of big objects (each entry holds one whole) keeps the change log
/// within its byte bound, across a reopen; a watch from before the entries
/// trimmed is told Gone, one from within the log replays it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sled_log_keeps_its_byte_bound_under_churn() {
    const BOUND: u64 = 256 << 10;
    const KIB: usize = 16;
    let f = Fixture::sled();
    let options = StoreOptions { log_keep_bytes: BOUND, ..StoreOptions::default() };
    let churn = |store: Store, rounds: usize| async move {
        for _ in 0..rounds {
            for i in 0..8 {
                let name = format!("p{i}");
                let gone = name.clone();
                store.write(move |t| t.delete::<Pod>(&gone).map(|_| ())).await.expect("delete");
                let p = big_pod(&name, KIB);
                store.write(move |t| -> Result<u64, StoreError> { t.put(&mut p.clone()) }).await.expect("put");
            }
        }
        store
    };
    let store = f.open(options).await;
    let first = store.resource_version();
    // 160 changes of 16 KiB: 2.5 MiB of log without the bound.
    let store = churn(store, 10).await;
    let (entries, bytes) = sled_log(&store);
    assert!(bytes <= BOUND, "{entries} entries, {bytes} bytes kept; bound {BOUND}");
    assert!(entries >= 8, "only {entries} entries kept under a {BOUND}-byte bound");
    match store.watch(first).await {
        Err(StoreError::Gone { requested, oldest }) => assert_eq!(requested, first, "oldest {oldest}"),
        other => panic!("a watch from before the trimmed log was not told Gone: {:?}", other.map(|_| ())),
    }
    let top = store.resource_version();
    let from = top - entries as u64 + 1;
    let mut w = store.watch(from).await.expect("watch within the log");
    let replayed: Vec<u64> = collect(&mut w, entries - 1).await.iter().map(|c| c.rv).collect();
    drop(w);
    drop(store);
    // Reopened, the bound still holds (the sizes are read back) and the
    // same watch replays the log itself.
    let store = f.open(options).await;
    let mut w = store.watch(from).await.expect("watch within the log, reopened");
    let again: Vec<u64> = collect(&mut w, entries - 1).await.iter().map(|c| c.rv).collect();
    assert_eq!(again, replayed);
    drop(w);
    let store = churn(store, 3).await;
    let (entries, bytes) = sled_log(&store);
    assert!(bytes <= BOUND, "after the reopen: {entries} entries, {bytes} bytes kept; bound {BOUND}");
    assert_eq!(store.list::<Pod>().expect("list").items.len(), 8);
}

on_both!(failed_write_stores_nothing);
async fn failed_write_stores_nothing(f: &Fixture) {
    let store = f.open(StoreOptions::default()).await;
    let p = pod("half");
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
            t.put(&mut p.clone())?;
            Err(E::Refused)
        })
        .await;
    assert!(matches!(r, Err(E::Refused)), "{r:?}");
    assert!(store.get::<Pod>("half").expect("get").is_none());
    assert_eq!(store.resource_version(), 0);
    // A write in the same batch as a failed one is kept.
    assert_eq!(create(&store, "whole").await, 1);
}

/// The free-space check, without filling a disk: a margin no file
/// system has refuses every write, clearly and with nothing stored; the
/// same data opened with the default margin takes writes again.
#[tokio::test]
async fn sled_write_without_free_space_is_refused_whole_and_names_the_data_dir() {
    let f = Fixture::sled();
    let Fixture::Sled(dir) = &f else { unreachable!() };
    let before = {
        let store = f.open(StoreOptions::default()).await;
        create(&store, "before").await
    };
    let store = f.open(StoreOptions { min_free_bytes: u64::MAX, ..StoreOptions::default() }).await;
    let err = match try_create(&store, "refused").await {
        Err(e) => e,
        Ok(rv) => panic!("stored at {rv} without free space"),
    };
    assert!(err.is_disk_full(), "{err}");
    let text = err.to_string();
    assert!(text.contains(&dir.path().display().to_string()) && text.contains("is full"), "{text}");
    assert!(store.get::<Pod>("refused").expect("get").is_none(), "nothing of it stored");
    assert_eq!(store.resource_version(), before);
    // Not a broken store: only the space was missing.
    let Backend::Sled(backend) = &store.shared.backend else { unreachable!() };
    assert!(!backend.is_broken());
    drop(store);
    let store = f.open(StoreOptions::default()).await;
    assert!(create(&store, "after").await > before);
    assert!(store.get::<Pod>("refused").expect("get").is_none());
}

async fn leader_write(store: &Store, name: &str) -> Result<u64, StoreError> {
    let p = pod(name);
    store
        .write(move |t| -> Result<u64, StoreError> {
            t.as_leader();
            t.put(&mut p.clone())
        })
        .await
}

/// One server: there is no one else to be leader.
#[tokio::test]
async fn sled_as_leader_always_passes() {
    let store = Fixture::sled().open(StoreOptions::default()).await;
    assert_eq!(leader_write(&store, "bound").await.expect("as_leader on sled"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_as_leader_needs_the_guard_and_its_lease() {
    let Some(f) = Fixture::etcd("etcd_as_leader_needs_the_guard_and_its_lease", 1).await else { return };
    let Fixture::Etcd { cluster, .. } = &f else { unreachable!() };
    let store = f.open(StoreOptions::default()).await;
    let refused = |r: &Result<u64, StoreError>| matches!(r, Err(StoreError::NotLeader));

    let r = leader_write(&store, "no-guard").await;
    assert!(refused(&r), "without a guard: {r:?}");

    let client = connect(&cluster.config(PREFIX)).await.expect("connect");
    let ours = client.lease_grant(60).await.expect("lease").id;
    let theirs = client.lease_grant(60).await.expect("lease").id;
    let key = b"/pinion-test-election/leader".to_vec();
    client.put(key.clone(), "other", theirs).await.expect("put leader key");
    store.set_leader_guard(Some(LeaderGuard { key: key.clone(), lease: ours }));
    let r = leader_write(&store, "other-holds").await;
    assert!(refused(&r), "another lease holds the key: {r:?}");
    // A write not marked goes on regardless.
    assert_eq!(create(&store, "plain").await, 1);
    // Also when it shares a batch with leader writes (sent together, they
    // do): only those are refused.
    let mixed: Vec<_> = (0..40)
        .map(|i| {
            let store = store.clone();
            async move {
                let name = format!("mixed-{i}");
                let r = if i % 2 == 0 { leader_write(&store, &name).await } else { try_create(&store, &name).await };
                (i, r)
            }
        })
        .collect();
    for (i, r) in futures_join(mixed).await {
        match (i % 2, r) {
            (0, Err(StoreError::NotLeader)) | (1, Ok(_)) => {}
            (_, r) => panic!("mixed-{i}: {r:?}"),
        }
        assert_eq!(store.get::<Pod>(&format!("mixed-{i}")).expect("get").is_some(), i % 2 == 1, "mixed-{i}");
    }
    let plain_rv = store.resource_version();

    client.put(key.clone(), "us", ours).await.expect("put leader key");
    assert_eq!(leader_write(&store, "ours").await.expect("leader write with the key held"), plain_rv + 1);

    store.set_leader_guard(None);
    let r = leader_write(&store, "cleared").await;
    assert!(refused(&r), "guard cleared: {r:?}");
    for name in ["no-guard", "other-holds", "cleared"] {
        assert!(store.get::<Pod>(name).expect("get").is_none(), "{name} stored");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_write_too_big_for_one_txn_names_the_limit() {
    let Some(f) = Fixture::etcd("etcd_write_too_big_for_one_txn_names_the_limit", 1).await else { return };
    let Fixture::Etcd { cluster, .. } = &f else { unreachable!() };
    let client = connect(&cluster.config(PREFIX)).await.expect("connect");
    let etcd = EtcdOptions { max_txn_ops: 16, ..EtcdOptions::default() };
    let store = Store::open_etcd(client, PREFIX, StoreOptions::default(), etcd).await.expect("open");
    let r = store
        .write(|t| -> Result<(), StoreError> {
            for i in 0..10 {
                t.put(&mut pod(&format!("big{i}")))?;
            }
            Ok(())
        })
        .await;
    match r {
        Err(e @ StoreError::TooLarge { .. }) => assert!(e.to_string().contains("--max-txn-ops"), "{e}"),
        other => panic!("expected TooLarge, got {other:?}"),
    }
    assert!(store.list::<Pod>().expect("list").items.is_empty());
    // Many small writes at once are split into transactions within the limit.
    let writes: Vec<_> = (0..40)
        .map(|i| {
            let store = store.clone();
            async move { try_create(&store, &format!("small{i}")).await }
        })
        .collect();
    for r in futures_join(writes).await {
        r.expect("small write");
    }
    assert_eq!(store.list::<Pod>().expect("list").items.len(), 40);
}

/// Runs the futures concurrently on the runtime; their results in order.
async fn futures_join<T: Send + 'static>(
    futures: Vec<impl std::future::Future<Output = T> + Send + 'static>,
) -> Vec<T> {
    let handles: Vec<_> = futures.into_iter().map(tokio::spawn).collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.expect("task"));
    }
    out
}

/// An acknowledged write is on disk: the member killed with SIGKILL right
/// after the answer has it when it starts again; while it is down writes fail
/// within the timeout, and none is acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_acknowledged_write_survives_kill_9() {
    let Some(mut f) = Fixture::etcd("etcd_acknowledged_write_survives_kill_9", 1).await else { return };
    let store = f.open(StoreOptions::default()).await;
    let mut acked = Vec::new();
    for i in 0..10 {
        acked.push(format!("p{i}"));
        create(&store, &format!("p{i}")).await;
    }
    let Fixture::Etcd { cluster, .. } = &mut f else { unreachable!() };
    cluster.kill(0);
    let down = tokio::time::timeout(Duration::from_secs(30), try_create(&store, "while-down")).await;
    match down {
        Ok(Err(e)) => assert!(matches!(e, StoreError::Failed(_)), "{e}"),
        Ok(Ok(rv)) => panic!("acknowledged at {rv} with etcd down"),
        Err(_) => panic!("a write with etcd down had no answer within 30 s"),
    }
    cluster.restart(0).await.expect("restart etcd");
    let fresh = f.open(StoreOptions::default()).await;
    for name in &acked {
        assert!(fresh.get::<Pod>(name).expect("get").is_some(), "{name} lost");
    }
    assert!(fresh.get::<Pod>("while-down").expect("get").is_none());
    // The first store's watch on etcd is back too: it sees the other's write.
    let mut seen = store.watch(store.resource_version()).await.expect("watch");
    let rv = create(&fresh, "from-fresh").await;
    let c = collect(&mut seen, 1).await;
    assert_eq!((c[0].rv, c[0].name.as_str()), (rv, "from-fresh"));
    assert!(store.get::<Pod>("from-fresh").expect("get").is_some());
    // The first store takes writes again once etcd is back.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        match try_create(&store, "after").await {
            Ok(_) => break,
            Err(e) if std::time::Instant::now() < deadline => {
                tracing::debug!(error = %e, "etcd not back yet");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("no write within 30 s of etcd's restart: {e}"),
        }
    }
}

/// Two servers on one etcd, writing at once: every acknowledged write is
/// stored once, the log has every version without a gap, and each server's
/// watch sees all writes, the other's included, in version order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn etcd_two_servers_write_concurrently() {
    let Some(f) = Fixture::etcd("etcd_two_servers_write_concurrently", 1).await else { return };
    let a = f.open(StoreOptions::default()).await;
    let b = f.open(StoreOptions::default()).await;
    let mut watch_a = a.watch(0).await.expect("watch");
    let mut watch_b = b.watch(0).await.expect("watch");
    const TASKS: usize = 4;
    const EACH: usize = 25;
    let mut writes = Vec::new();
    for (server, store) in [("a", &a), ("b", &b)] {
        for t in 0..TASKS {
            let store = store.clone();
            writes.push(async move {
                let mut done = Vec::new();
                for i in 0..EACH {
                    let name = format!("{server}{t}-{i}");
                    let rv = create(&store, &name).await;
                    done.push((rv, name));
                }
                done
            });
        }
    }
    let mut acked: Vec<(u64, String)> = futures_join(writes).await.into_iter().flatten().collect();
    acked.sort();
    let total = 2 * TASKS * EACH;
    assert_eq!(acked.len(), total);
    let rvs: Vec<u64> = acked.iter().map(|(rv, _)| *rv).collect();
    assert_eq!(rvs, (1..=total as u64).collect::<Vec<_>>(), "one version per write, no gap, none twice");

    for (server, w) in [("a", &mut watch_a), ("b", &mut watch_b)] {
        let seen: Vec<(u64, String)> = collect(w, total).await.iter().map(|c| (c.rv, c.name.clone())).collect();
        assert_eq!(seen, acked, "server {server}'s watch");
    }
    // The log, read by a third server from the start, is the same.
    let c = f.open(StoreOptions::default()).await;
    let mut replay = c.watch(0).await.expect("watch");
    let logged: Vec<(u64, String)> = collect(&mut replay, total).await.iter().map(|c| (c.rv, c.name.clone())).collect();
    assert_eq!(logged, acked);
    let names: BTreeSet<String> = c.list::<Pod>().expect("list").items.into_iter().map(|p| p.metadata.name).collect();
    assert_eq!(names.len(), total);
    assert_eq!(b.list::<Pod>().expect("list").items.len(), total);
}

/// Two servers on one etcd, each with two batches in flight (small
/// transactions, so that many are sent), writing at once: their own pods
/// and read-modify-write increments of one shared counter. Every
/// acknowledged write is stored once with its own version, the versions run
/// 1..N without a gap, both watches see the same changes in order, and no
/// increment is lost (a batch that committed on top of another server's
/// write, or after the batch below it failed, would repeat a count).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn etcd_pipelined_servers_keep_order_and_atomicity_under_conflicts() {
    let test = "etcd_pipelined_servers_keep_order_and_atomicity_under_conflicts";
    let Some(f) = Fixture::etcd(test, 1).await else { return };
    let Fixture::Etcd { cluster, etcd } = &f else { unreachable!() };
    let etcd = EtcdOptions { pipeline_depth: 2, max_txn_ops: 16, ..*etcd };
    let mut stores = Vec::new();
    for _ in 0..2 {
        let client = connect(&cluster.config(PREFIX)).await.expect("connect");
        stores.push(Store::open_etcd(client, PREFIX, StoreOptions::default(), etcd).await.expect("open_etcd"));
    }
    let (a, b) = (stores[0].clone(), stores[1].clone());
    let mut watch_a = a.watch(0).await.expect("watch");
    let mut watch_b = b.watch(0).await.expect("watch");
    let first = create(&a, "counter").await;
    assert_eq!(first, 1);

    const TASKS: usize = 12;
    const EACH: usize = 10;
    let mut writes = Vec::new();
    for (server, store) in [("a", &a), ("b", &b)] {
        for t in 0..TASKS {
            let store = store.clone();
            writes.push(async move {
                let mut done = Vec::new();
                for i in 0..EACH {
                    if i % 2 == 0 {
                        let name = format!("{server}{t}-{i}");
                        let rv = create(&store, &name).await;
                        done.push((rv, name, None));
                        continue;
                    }
                    let counted = store
                        .write(|t| -> Result<(u64, u64), StoreError> {
                            let mut c: Pod = t.get("counter")?.ok_or(StoreError::Closed)?;
                            let n = c.metadata.labels.get("n").and_then(|n| n.parse::<u64>().ok()).unwrap_or(0) + 1;
                            c.metadata.labels.insert("n".into(), n.to_string());
                            Ok((t.put(&mut c)?, n))
                        })
                        .await;
                    match counted {
                        Ok((rv, n)) => done.push((rv, "counter".to_string(), Some(n))),
                        Err(e) => panic!("increment on {server} failed: {e}"),
                    }
                }
                done
            });
        }
    }
    let mut acked: Vec<(u64, String, Option<u64>)> = futures_join(writes).await.into_iter().flatten().collect();
    acked.sort();
    let increments = 2 * TASKS * EACH / 2;
    let total = 1 + 2 * TASKS * EACH;
    let rvs: Vec<u64> = acked.iter().map(|(rv, _, _)| *rv).collect();
    assert_eq!(rvs, (2..=total as u64).collect::<Vec<_>>(), "one version per write, no gap, none twice");
    let counts: Vec<u64> = acked.iter().filter_map(|(_, _, n)| *n).collect();
    assert_eq!(counts, (1..=increments as u64).collect::<Vec<_>>(), "every increment saw the one before it");

    let mut expected: Vec<(u64, String)> = vec![(1, "counter".into())];
    expected.extend(acked.iter().map(|(rv, name, _)| (*rv, name.clone())));
    let mut seen = Vec::new();
    for w in [&mut watch_a, &mut watch_b] {
        let changes = collect(w, total).await;
        let labels: Vec<Option<String>> =
            changes.iter().filter(|c| c.name == "counter").map(|c| c.labels.get("n").cloned()).collect();
        let mut want = vec![None];
        want.extend((1..=increments).map(|n| Some(n.to_string())));
        assert_eq!(labels, want, "the counter's changes, in order");
        seen.push(changes.iter().map(|c| (c.rv, c.name.clone())).collect::<Vec<_>>());
    }
    assert_eq!(seen[0], expected, "server a's watch");
    assert_eq!(seen[1], expected, "server b's watch");
    for store in [&a, &b] {
        let counter: Pod = store.get("counter").expect("get").expect("counter");
        assert_eq!(counter.metadata.labels.get("n"), Some(&increments.to_string()));
    }
    // A third server, reading etcd afresh, holds every acknowledged write.
    let c = f.open(StoreOptions::default()).await;
    let names: BTreeSet<String> = c.list::<Pod>().expect("list").items.into_iter().map(|p| p.metadata.name).collect();
    assert_eq!(names.len(), 1 + TASKS * EACH);
    for (_, name, _) in &acked {
        assert!(names.contains(name), "{name} missing");
    }
}

/// Writes per second through one Store: 5,000 pod puts from 64 tasks, on
/// sled and on a three-member etcd. Run by hand:
/// `cargo test -p orchestrator --lib store::tests::write_throughput -- --ignored --nocapture`
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "a measurement, not a check"]
async fn write_throughput() {
    const WRITES: usize = 5000;
    const TASKS: usize = 64;
    let mut fixtures = vec![("sled", Fixture::sled())];
    if let Some(f) = Fixture::etcd("write_throughput", 3).await {
        fixtures.push(("etcd, 3 members", f));
    }
    for (label, f) in fixtures {
        let store = f.open(StoreOptions::default()).await;
        let started = std::time::Instant::now();
        let tasks: Vec<_> = (0..TASKS)
            .map(|t| {
                let store = store.clone();
                async move {
                    for i in (t..WRITES).step_by(TASKS) {
                        create(&store, &format!("p{i}")).await;
                    }
                }
            })
            .collect();
        futures_join(tasks).await;
        let secs = started.elapsed().as_secs_f64();
        println!("{label}: {WRITES} pod puts from {TASKS} tasks in {secs:.2} s: {:.0} writes/s", WRITES as f64 / secs);
        assert_eq!(store.list::<Pod>().expect("list").items.len(), WRITES);
        // A watch resumed from before them all: from the store's recent
        // changes, then (reopened, as another server) from the log.
        let started = std::time::Instant::now();
        let mut w = store.watch(0).await.expect("watch");
        assert_eq!(collect(&mut w, WRITES).await.len(), WRITES);
        let recent = started.elapsed().as_secs_f64();
        drop(w);
        drop(store);
        let store = f.open(StoreOptions::default()).await;
        let started = std::time::Instant::now();
        let mut w = store.watch(0).await.expect("watch");
        assert_eq!(collect(&mut w, WRITES).await.len(), WRITES);
        let log = started.elapsed().as_secs_f64();
        println!(
            "{label}: replaying them: {:.1} ms from recent changes, {:.1} ms from the log ({:.0} changes/s)",
            recent * 1000.0,
            log * 1000.0,
            WRITES as f64 / log
        );
    }
}

/// A server whose etcd member went away while the others wrote, and compacted
/// etcd's history past its watch, misses nothing: its watchers get every
/// change, in order, and its reads catch up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_server_cut_off_while_others_write_misses_nothing() {
    let test = "etcd_server_cut_off_while_others_write_misses_nothing";
    let Some(mut f) = Fixture::etcd(test, 3).await else { return };
    let Fixture::Etcd { cluster, etcd } = &mut f else { unreachable!() };
    let endpoints = cluster.endpoints();
    let only =
        |i: usize| EtcdConfig { endpoints: vec![endpoints[i].clone()], prefix: PREFIX.into(), ..EtcdConfig::default() };
    let open = |i: usize| {
        let (config, etcd) = (only(i), *etcd);
        async move {
            let client = connect(&config).await.expect("connect");
            Store::open_etcd(client, PREFIX, StoreOptions::default(), etcd).await.expect("open_etcd")
        }
    };
    let a = open(0).await;
    let b = open(1).await;
    create(&a, "first").await;
    let mut w = a.watch(a.resource_version()).await.expect("watch");
    cluster.kill(0);
    // The killed member may have led etcd's raft: the others elect a leader
    // first (a second or more under load), which a write must not race
    // against its own bound. A linearizable read answers only once they have.
    let client = connect(&only(1)).await.expect("connect");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while tokio::time::timeout(Duration::from_secs(2), client.get("probe")).await.map_or(true, |r| r.is_err()) {
        assert!(std::time::Instant::now() < deadline, "the two members left elect no leader within 30 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut written = Vec::new();
    for i in 0..10 {
        written.push((create(&b, &format!("p{i}")).await, format!("p{i}")));
    }
    let revision = client.get("probe").await.expect("get").revision();
    client.compact(revision, true).await.expect("compact");
    cluster.restart(0).await.expect("restart");
    let seen: Vec<(u64, String)> = collect(&mut w, 10).await.iter().map(|c| (c.rv, c.name.clone())).collect();
    assert_eq!(seen, written);
    assert!(a.get::<Pod>("p9").expect("get").is_some());
    assert_eq!(a.resource_version(), written[9].0);
}

/// On etcd a put's log entry leaves the object out (etcd's history holds it
/// at the entry's revision). After etcd compacted its history, a watch
/// resuming from before a change whose key was written since is told Gone;
/// one whose changes' keys were not written since still replays them whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_replay_after_compaction_is_whole_or_gone() {
    let test = "etcd_replay_after_compaction_is_whole_or_gone";
    let Some(f) = Fixture::etcd(test, 1).await else { return };
    let Fixture::Etcd { cluster, .. } = &f else { unreachable!() };
    let store = f.open(StoreOptions::default()).await;
    let before = create(&store, "z").await;
    let a = create(&store, "a").await;
    let b = create(&store, "b").await;
    let a_again = create(&store, "a").await;

    // The log holds no second copy of a put's object.
    let client = connect(&cluster.config(PREFIX)).await.expect("connect");
    let key = format!("{PREFIX}{}", String::from_utf8_lossy(&log_key(b)));
    let entry = client.get(key).await.expect("get");
    let entry: Change = serde_json::from_slice(&entry.kvs[0].value).expect("log entry");
    assert_eq!((entry.name.as_str(), entry.object.as_str()), ("b", ""));

    // Another server (its recent changes hold none of these) replays them
    // from the log: before compaction every object from etcd's history.
    let reader = f.open(StoreOptions::default()).await;
    let mut w = reader.watch(before).await.expect("watch");
    let seen = collect(&mut w, 3).await;
    let first_a: Pod = serde_json::from_str(&seen[0].object).expect("object");
    assert_eq!(first_a.metadata.resource_version, Some(a), "the object as it was at its change");

    let revision = client.get("probe").await.expect("get").revision();
    client.compact(revision, false).await.expect("compact");

    // The writer published them itself: its watches resume from memory, whole.
    let mut w = store.watch(before).await.expect("watch on the writer");
    assert_eq!(collect(&mut w, 3).await.iter().map(|c| c.rv).collect::<Vec<_>>(), vec![a, b, a_again]);
    match reader.watch(before).await {
        Err(StoreError::Gone { requested, oldest }) => assert_eq!((requested, oldest), (before, a + 1)),
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("a watch from before a change lost to compaction was not told Gone"),
    }
    let mut w = reader.watch(a).await.expect("watch");
    let seen: Vec<(u64, String, u64)> = collect(&mut w, 2)
        .await
        .iter()
        .map(|c| {
            let p: Pod = serde_json::from_str(&c.object).expect("object");
            (c.rv, c.name.clone(), p.metadata.resource_version.unwrap_or(0))
        })
        .collect();
    assert_eq!(seen, vec![(b, "b".into(), b), (a_again, "a".into(), a_again)]);
}

on_both!(a_key_written_twice_in_a_batch_replays_each_change_whole);
/// A key written more than once in one batch (in one write, or by writes that
/// share a batch) replays every change with its own object, from the log of
/// a store that did not publish them (on etcd a slim entry would read the
/// key's last value, or nothing after a delete).
async fn a_key_written_twice_in_a_batch_replays_each_change_whole(f: &Fixture) {
    let store = f.open(StoreOptions::default()).await;
    let before = store.resource_version();
    store
        .write(|t| -> Result<(), StoreError> {
            let mut a = pod("a");
            t.put(&mut a)?;
            a.metadata.labels.insert("again".into(), "yes".into());
            t.put(&mut a)?;
            t.put(&mut pod("b"))?;
            t.delete::<Pod>("a")?;
            Ok(())
        })
        .await
        .expect("one write");
    let concurrent: Vec<_> = (0..20)
        .map(|i| {
            let store = store.clone();
            async move {
                let mut c = pod("c");
                c.metadata.labels.insert("i".into(), i.to_string());
                store.write(move |t| -> Result<u64, StoreError> { t.put(&mut c.clone()) }).await.expect("write")
            }
        })
        .collect();
    futures_join(concurrent).await;
    drop(store);
    let reader = f.open(StoreOptions::default()).await;
    let mut w = reader.watch(before).await.expect("watch");
    let seen = collect(&mut w, 24).await;
    let kinds: Vec<(String, WatchEventType)> = seen[..4].iter().map(|c| (c.name.clone(), c.event_type)).collect();
    assert_eq!(
        kinds,
        [
            ("a".to_string(), WatchEventType::Added),
            ("a".to_string(), WatchEventType::Modified),
            ("b".to_string(), WatchEventType::Added),
            ("a".to_string(), WatchEventType::Deleted)
        ]
    );
    for c in &seen {
        let p: Pod = serde_json::from_str(&c.object).unwrap_or_else(|e| panic!("change {}: {e}", c.rv));
        assert_eq!(p.metadata.resource_version, Some(c.rv), "change {} carries another version's object", c.rv);
    }
}

/// etcd over https with client certificates (rustls): the store works with
/// the CA and this server's certificate, and is refused without the certificate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_over_tls_with_client_certificates() {
    let test = "etcd_over_tls_with_client_certificates";
    if !available(test) {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let (pki, _) = crate::tls::Pki::load_or_create(dir.path()).expect("pki");
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).expect("write pem");
        path
    };
    let (server_cert, server_key) = pki.issue_server(&["127.0.0.1".into()]).expect("server cert");
    let (client_cert, client_key) =
        pki.issue_client("pinion-server", None, std::time::Duration::from_secs(3600)).expect("client cert");
    let tls = crate::testing::etcd::ClientTls {
        ca: write("ca.pem", &pki.ca_cert_pem),
        server_cert: write("server.pem", &server_cert),
        server_key: write("server.key", &server_key),
        client_cert: write("client.pem", &client_cert),
        client_key: write("client.key", &client_key),
    };
    let cluster = EtcdCluster::start_with(1, Some(tls)).await.unwrap_or_else(|e| panic!("{test}: {e}"));
    let config = cluster.config(PREFIX);
    assert!(config.endpoints[0].starts_with("https://"), "{config:?}");
    let client = connect(&config).await.expect("connect over https");
    let store = Store::open_etcd(client, PREFIX, StoreOptions::default(), EtcdOptions::default()).await.expect("open");
    assert_eq!(create(&store, "secure").await, 1);

    let anonymous = EtcdConfig { cert: None, key: None, ..config.clone() };
    let opened = match connect(&anonymous).await {
        Ok(client) => Store::open_etcd(client, PREFIX, StoreOptions::default(), EtcdOptions::default()).await.err(),
        Err(e) => Some(e),
    };
    assert!(opened.is_some(), "etcd asks for a client certificate; a server without one must not get in");
}

/// What `connect` refuses before it dials, each naming the field.
#[tokio::test]
async fn etcd_config_errors_name_the_field() {
    let check = |config: EtcdConfig, field: &'static str| async move {
        match connect(&config).await {
            Err(e) => assert!(e.to_string().contains(field), "{e}"),
            Ok(_) => panic!("{config:?} accepted"),
        }
    };
    let base = EtcdConfig::default();
    check(EtcdConfig { endpoints: vec![], ..base.clone() }, "endpoints").await;
    check(EtcdConfig { endpoints: vec!["http://10.1.2.3:2379".into()], ..base.clone() }, "plain http").await;
    check(EtcdConfig { endpoints: vec!["127.0.0.1:2379".into()], ..base.clone() }, "scheme").await;
    check(EtcdConfig { endpoints: vec!["https://10.1.2.3:2379".into()], ..base.clone() }, "ca:").await;
    let with_ca = EtcdConfig {
        endpoints: vec!["https://10.1.2.3:2379".into()],
        ca: Some("missing/ca.pem".into()),
        ..base.clone()
    };
    check(with_ca.clone(), "ca missing/ca.pem").await;
}

fn change(rv: u64, object_bytes: usize) -> Change {
    Change {
        rv,
        kind: Kind::Pod,
        name: format!("p{rv}"),
        event_type: WatchEventType::Added,
        object: "x".repeat(object_bytes),
        node_name: None,
        prev_node_name: None,
        labels: BTreeMap::new(),
        owner: None,
        status_only: false,
    }
}

/// A refill is served from the recent changes only where they hold every
/// change it needs: not from before the store opened, across a gap, or
/// past what the bounds let go.
#[test]
fn recent_changes_serve_a_refill_only_when_whole() {
    let rvs = |v: Option<Vec<Arc<Change>>>| v.map(|v| v.iter().map(|c| c.rv).collect::<Vec<_>>());
    let p = Published::new(10, 1);
    // 12 went to an event: no change has it.
    p.publish(13, 1, vec![change(11, 10), change(13, 10)]);
    let cases: [(u64, u64, Option<Vec<u64>>); 5] = [
        (10, 13, Some(vec![11, 13])),
        (11, 13, Some(vec![13])),
        (13, 13, Some(vec![])),
        (10, 11, Some(vec![11])),
        (9, 13, None),
    ];
    for (last, top, want) in cases {
        assert_eq!(rvs(p.since(last, top)), want, "after {last} up to {top}");
    }
    let mut rx = p.changes.subscribe();
    p.gap(20);
    assert_eq!(rvs(p.since(13, 20)), None, "across a gap");
    p.publish(21, 1, vec![change(21, 10)]);
    assert_eq!(rx.try_recv().map(|s| (s.prev, s.change.rv)).ok(), Some((20, 21)), "a watcher at 13 sees the gap");
    assert_eq!(rvs(p.since(20, 21)), Some(vec![21]));
    // One change larger than the byte bound pushes every older one out, and itself.
    p.publish(22, 1, vec![change(22, RECENT_BYTES)]);
    assert_eq!(rvs(p.since(21, 22)), None);
    assert_eq!(rvs(p.since(22, 22)), Some(vec![]));
}

on_both!(claims_are_listed_as_each_write_sees_them);
/// A space's claims as a write sees them: writes that share a batch see each
/// other's, so twenty writes racing for "the lowest free slot" take twenty
/// different ones; a release takes one off; they are durable.
async fn claims_are_listed_as_each_write_sees_them(f: &Fixture) {
    let store = f.open(StoreOptions::default()).await;
    let racing: Vec<_> = (0..20)
        .map(|i| {
            let store = store.clone();
            async move {
                store
                    .write(move |t| -> Result<(u32, Claim), StoreError> {
                        let held: BTreeSet<u32> =
                            t.claims("slot")?.iter().filter_map(|(name, _)| name.parse().ok()).collect();
                        let free = (0..=held.len() as u32).find(|n| !held.contains(n)).unwrap_or(u32::MAX);
                        Ok((free, t.claim("slot", &free.to_string(), format!("w{i}").as_bytes())?))
                    })
                    .await
                    .expect("claim a slot")
            }
        })
        .collect();
    let claimed = futures_join(racing).await;
    assert!(claimed.iter().all(|(_, c)| *c == Claim::New), "{claimed:?}");
    let mut got: Vec<u32> = claimed.into_iter().map(|(slot, _)| slot).collect();
    got.sort_unstable();
    assert_eq!(got, (0..20).collect::<Vec<u32>>(), "every write took its own slot");
    let (released, seen_after) = store
        .write(|t| -> Result<(bool, bool), StoreError> {
            let released = t.release("slot", "3")?;
            let seen = t.claims("slot")?.iter().any(|(name, _)| name == "3");
            t.claim("other", "3", b"x")?;
            Ok((released, seen))
        })
        .await
        .expect("release");
    assert_eq!((released, seen_after), (true, false), "a release shows in the same write");
    drop(store);
    let store = f.open(StoreOptions::default()).await;
    let listed = store
        .write(|t| -> Result<Vec<(String, Vec<u8>)>, StoreError> { t.claims("slot") })
        .await
        .expect("read the claims");
    assert_eq!(listed.len(), 19);
    assert!(listed.iter().all(|(name, holder)| name != "3" && holder.starts_with(b"w")), "{listed:?}");
}

on_both!(accounting_records_outlive_a_reopen_and_are_pruned);
async fn accounting_records_outlive_a_reopen_and_are_pruned(f: &Fixture) {
    use crate::cluster::{acct, ClusterError};
    {
        let store = f.open(StoreOptions::default()).await;
        let mut p = pod("done");
        p.metadata.uid = Some("u1".into());
        p.status = Some(specs::PodStatus { phase: specs::PodPhase::Succeeded, ..Default::default() });
        // The pod's end and its record, one write.
        store
            .write(move |t| -> Result<(), ClusterError> {
                let mut p = p.clone();
                t.put(&mut p)?;
                acct::pod_ended(t, &p, false)
            })
            .await
            .expect("ended");
    }
    let store = f.open(StoreOptions::default()).await;
    let listed = store.list::<specs::acct::Record>().expect("list").items;
    let seen: Vec<(&str, specs::acct::State)> = listed.iter().map(|r| (r.job_id.as_str(), r.state)).collect();
    assert_eq!(seen, [("done", specs::acct::State::Completed)]);
    let names = vec![listed[0].metadata.name.clone()];
    let later = chrono::Utc::now().timestamp() + 10;
    let gone = store.write(move |t| acct::prune(t, &names, later, 1)).await.expect("pruned");
    assert_eq!(gone, 1);
    assert!(store.list::<specs::acct::Record>().expect("list").items.is_empty());
}
