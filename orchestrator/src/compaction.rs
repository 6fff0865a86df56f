//! The leader compacts etcd's history, as the kube-apiserver does. etcd keeps
//! every revision of every key until told to forget; without compaction its
//! database grows until the backend quota (2 GiB by default) is full and it
//! refuses every write (alarm NOSPACE): the cluster stops.
//!
//! At each interval the leader notes etcd's revision and compacts to the one
//! it noted an interval before, so at least one interval of history stays:
//! the store's slim log entries read their objects from it, so a watch that
//! resumes within that window replays; an older one is told Gone (410) and
//! lists again, as a Kubernetes watch is. Only the leader compacts: one
//! compactor per cluster, and a server that no longer leads forgets what it
//! noted.

use std::time::Duration;

use crate::etcdv3::Client;
use tokio::sync::watch;

use crate::leader::Term;
use crate::store::etcd::bounded;

/// Runs until `shutdown` turns true (or its sender goes).
pub async fn run(
    client: Client,
    interval: Duration,
    request_timeout: Duration,
    terms: watch::Receiver<Option<Term>>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut noted: Option<i64> = None;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            changed = shutdown.changed() => if changed.is_err() { return },
        }
        if *shutdown.borrow() {
            return;
        }
        let Some(term) = terms.borrow().clone() else {
            noted = None;
            continue;
        };
        // Any read answers with etcd's newest revision.
        let now = match bounded(request_timeout, client.get(term.key)).await {
            Ok(resp) => resp.revision(),
            Err(e) => {
                tracing::warn!(error = %e, "cannot read etcd's revision to compact its history; trying at the next interval");
                continue;
            }
        };
        if let Some(at) = noted.filter(|&at| at > 0) {
            match bounded(request_timeout, client.compact(at, false)).await {
                Ok(_) => tracing::debug!(revision = at, "compacted etcd's history"),
                // Compacted at or past it already (etcd's own auto-compaction, or a leader before).
                Err(e) if e.to_string().contains("compacted") => {}
                Err(e) => tracing::warn!(error = %e, revision = at, "compacting etcd's history failed"),
            }
        }
        noted = Some(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::etcdv3::RangeRequest;
    use crate::testing::etcd::{available, EtcdCluster};

    /// Whether etcd still answers a read at `revision`.
    async fn readable_at(client: &Client, revision: i64) -> bool {
        match client.range(RangeRequest::key("k").at(revision)).await {
            Ok(_) => true,
            Err(e) if e.to_string().contains("compacted") => false,
            Err(e) => panic!("read at {revision}: {e}"),
        }
    }

    /// A leader compacts the history to what it noted an interval before; a
    /// server that does not lead never does.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_leader_compacts_history_a_follower_does_not() {
        let test = "the_leader_compacts_history_a_follower_does_not";
        if !available(test) {
            return;
        }
        let cluster = EtcdCluster::start(1).await.unwrap_or_else(|e| panic!("{test}: {e}"));
        let client = crate::store::etcd::connect(&cluster.config("/t/")).await.expect("connect");
        let first = client.put("k", "1", 0).await.expect("put").revision();
        client.put("k", "2", 0).await.expect("put");
        let interval = Duration::from_millis(100);
        let (stop_tx, stop) = watch::channel(false);

        // Not leading: three intervals and more, and the history is whole.
        let (terms_tx, terms) = watch::channel(None);
        let task = tokio::spawn(run(client.clone(), interval, Duration::from_secs(2), terms, stop.clone()));
        tokio::time::sleep(interval * 5).await;
        assert!(readable_at(&client, first).await, "a server that does not lead compacted");

        // Leading: within a few intervals the old revision is gone; the newest value stays.
        terms_tx.send_replace(Some(Term { key: b"leader".to_vec(), lease: 1 }));
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while readable_at(&client, first).await {
            assert!(tokio::time::Instant::now() < deadline, "the leader did not compact within 10 s");
            tokio::time::sleep(interval).await;
        }
        let now = client.get("k").await.expect("get");
        assert_eq!(now.kvs.first().map(|kv| kv.value.clone()), Some(b"2".to_vec()));

        stop_tx.send_replace(true);
        tokio::time::timeout(Duration::from_secs(5), task).await.expect("stops on shutdown").expect("task");
    }
}
