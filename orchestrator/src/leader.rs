//! Leader election on an etcd lease: of the servers sharing one etcd, exactly
//! one at a time runs the scheduler and the controller.
//!
//! A server campaigns by creating the leader key bound to a fresh lease (a
//! transaction that succeeds only while the key does not exist); the others
//! watch the key and campaign again when it goes (its lease expired, or its
//! holder revoked it on shutdown). The leader renews the lease every third of
//! its TTL and steps down by itself, before the lease can have expired on
//! etcd's side, when renewals stop getting through: its deadline is the time
//! it SENT the last successful renewal plus the TTL etcd answered, measured on
//! this process's monotonic clock, which etcd's own clock can only be later
//! than. Stepping down is therefore local and bounded even when etcd cannot be
//! reached at all. Bindings are written in transactions that also compare the
//! key's lease with the term's (see `store::LeaderGuard`), so a leader that has
//! not noticed its deposition yet cannot bind anything.

use std::time::Duration;

use crate::etcdv3::{Client, Compare, CompareResult, RequestOp, TxnRequest, Watch, WatchCreateRequest};
use tokio::sync::watch;
use tokio::time::{sleep, sleep_until, timeout, Instant};

use crate::store::etcd::{bounded, CallError};

#[derive(Debug, Clone)]
pub struct ElectionConfig {
    /// The full etcd key (prefix included).
    pub key: Vec<u8>,
    /// Written as the key's value: who leads (the server's URL), for `pinion
    /// get leader`-style reads and logs.
    pub identity: String,
    /// The lease's time to live: a killed leader is replaced within about
    /// this long. etcd rounds a TTL below its minimum up.
    pub ttl: Duration,
    /// Bound on every etcd call.
    pub request_timeout: Duration,
}

impl ElectionConfig {
    pub fn new(key: impl Into<Vec<u8>>, identity: impl Into<String>) -> ElectionConfig {
        ElectionConfig {
            key: key.into(),
            identity: identity.into(),
            ttl: Duration::from_secs(3),
            request_timeout: Duration::from_secs(2),
        }
    }
}

/// One leadership term: the lease the leader key is bound to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Term {
    pub key: Vec<u8>,
    pub lease: i64,
}

#[derive(Debug, thiserror::Error)]
enum ElectionError {
    #[error(transparent)]
    Call(#[from] CallError),
    #[error("the lease ended (etcd answered a renewal with TTL 0)")]
    LeaseEnded,
}

/// Campaigns until `shutdown` turns true; the receiver holds the current term
/// while this server leads, `None` otherwise. On shutdown a leader revokes its
/// lease so that another server takes over at once rather than after the TTL.
pub fn spawn(
    client: Client,
    config: ElectionConfig,
    shutdown: watch::Receiver<bool>,
) -> (watch::Receiver<Option<Term>>, tokio::task::JoinHandle<()>) {
    let (tx, rx) = watch::channel(None);
    let task = tokio::spawn(run(client, config, tx, shutdown));
    (rx, task)
}

async fn run(
    client: Client,
    config: ElectionConfig,
    tx: watch::Sender<Option<Term>>,
    mut shutdown: watch::Receiver<bool>,
) {
    // After a failure, wait a little before campaigning again (etcd may be
    // unreachable); never longer than a third of the TTL, the failover bound.
    let pause = (config.ttl / 3).max(Duration::from_millis(100));
    // A dropped sender is a shutdown too (else `changed()` would end every wait at once).
    while !*shutdown.borrow() && shutdown.has_changed().is_ok() {
        // Every step of a campaign is bounded and watches `shutdown` itself.
        let outcome = campaign(&client, &config, &tx, &mut shutdown).await;
        tx.send_replace(None);
        if let Err(e) = outcome {
            tracing::warn!(error = %e, "leader election: campaigning again");
            tokio::select! {
                _ = sleep(pause) => {}
                _ = shutdown.changed() => {}
            }
        }
    }
}

/// One attempt: takes the key or waits for it to go, then leads until the
/// term ends. `Ok` when it ended by shutdown or by losing the key.
async fn campaign(
    client: &Client,
    config: &ElectionConfig,
    tx: &watch::Sender<Option<Term>>,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<(), ElectionError> {
    let rt = config.request_timeout;
    let ttl_s = config.ttl.as_secs().max(1) as i64;
    let sent = Instant::now();
    let lease = bounded(rt, client.lease_grant(ttl_s)).await?;
    let (lease, granted_ttl) = (lease.id, lease.ttl);
    let take = TxnRequest::new(
        [Compare::create_revision(config.key.clone(), CompareResult::Equal, 0)],
        [RequestOp::put(config.key.clone(), config.identity.clone(), lease)],
        [RequestOp::get(config.key.clone())],
    );
    let taken = match bounded(rt, client.txn(take)).await {
        Ok(r) => r,
        Err(e) => {
            // Whether or not the put went through, the lease is ours to end.
            let _ = bounded(rt, client.lease_revoke(lease)).await;
            return Err(e.into());
        }
    };
    if !taken.succeeded {
        let _ = bounded(rt, client.lease_revoke(lease)).await;
        let revision = taken.revision();
        return wait_for_vacancy(client, config, revision, shutdown).await;
    }
    let term = Term { key: config.key.clone(), lease };
    tracing::info!(lease, identity = %config.identity, "leader election: this server leads");
    tx.send_replace(Some(term));
    let result = lead(client, config, lease, sent + Duration::from_secs(granted_ttl.max(0) as u64), shutdown).await;
    tx.send_replace(None);
    // Ending the lease deletes the key: the next server need not wait out the TTL.
    let _ = bounded(rt, client.lease_revoke(lease)).await;
    tracing::info!(lease, "leader election: this server no longer leads");
    result
}

/// Renews the lease until shutdown, a failed renewal past the deadline, or the
/// key changing hands.
async fn lead(
    client: &Client,
    config: &ElectionConfig,
    lease: i64,
    mut deadline: Instant,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<(), ElectionError> {
    let rt = config.request_timeout;
    // Step down a margin before etcd could expire the lease.
    let margin = (config.ttl / 6).max(Duration::from_millis(100));
    let every = config.ttl / 3;
    let (mut keeper, _) = bounded(rt, client.lease_keep_alive(lease)).await?;
    let mut key_watch: Watch = bounded(rt, client.watch(WatchCreateRequest::key(config.key.clone()))).await?;
    let mut next = Instant::now() + every;
    loop {
        tokio::select! {
            _ = shutdown.changed() => return Ok(()),
            _ = sleep_until(deadline - margin) => {
                tracing::warn!(lease, "leader election: renewals did not get through; stepping down");
                return Ok(());
            }
            msg = key_watch.message() => {
                let gone = match msg {
                    Ok(Some(resp)) => resp.canceled
                        || resp.events.iter().any(|e| e.is_delete() || e.kv.as_ref().is_some_and(|kv| kv.lease != lease)),
                    Ok(None) | Err(_) => true,
                };
                if gone {
                    tracing::warn!(lease, "leader election: the leader key went or changed; stepping down");
                    return Ok(());
                }
            }
            _ = sleep_until(next) => {
                next = Instant::now() + every;
                let sent = Instant::now();
                let left = deadline.saturating_duration_since(sent).min(rt);
                match timeout(left, keeper.renew()).await {
                    Ok(Ok(r)) if r.ttl > 0 => deadline = sent + Duration::from_secs(r.ttl as u64),
                    Ok(Ok(_)) => return Err(ElectionError::LeaseEnded),
                    Ok(Err(e)) => {
                        tracing::warn!(lease, error = %e, "leader election: renewal failed");
                        // The stream is broken: open a new one (its first
                        // message renews the lease), within the deadline.
                        let left = deadline.saturating_duration_since(Instant::now()).min(rt);
                        let sent = Instant::now();
                        if let Ok((k, r)) = bounded(left, client.lease_keep_alive(lease)).await {
                            keeper = k;
                            if r.ttl <= 0 {
                                return Err(ElectionError::LeaseEnded);
                            }
                            deadline = sent + Duration::from_secs(r.ttl as u64);
                        }
                    }
                    Err(_) => tracing::warn!(lease, "leader election: renewal unanswered"),
                }
            }
        }
    }
}

/// Waits until the leader key is gone (or a TTL passes: the watch may have
/// missed it, and a bound on this silence costs one transaction).
async fn wait_for_vacancy(
    client: &Client,
    config: &ElectionConfig,
    revision: i64,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<(), ElectionError> {
    let request = WatchCreateRequest::key(config.key.clone()).since(revision + 1);
    let mut stream = bounded(config.request_timeout, client.watch(request)).await?;
    let until = Instant::now() + config.ttl;
    loop {
        tokio::select! {
            _ = shutdown.changed() => return Ok(()),
            _ = sleep_until(until) => return Ok(()),
            msg = stream.message() => match msg {
                Ok(Some(resp)) => {
                    if resp.canceled || resp.events.iter().any(|e| e.is_delete()) {
                        return Ok(());
                    }
                }
                Ok(None) => return Ok(()),
                Err(e) => return Err(CallError::from(e).into()),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::etcd::{available, EtcdCluster};

    fn config(identity: &str) -> ElectionConfig {
        ElectionConfig { ttl: Duration::from_secs(4), ..ElectionConfig::new("/t/leader", identity) }
    }

    async fn wait_until(
        rx: &mut watch::Receiver<Option<Term>>,
        what: &str,
        limit: Duration,
        pred: impl Fn(&Option<Term>) -> bool,
    ) {
        let r = timeout(limit, rx.wait_for(|t| pred(t))).await;
        assert!(matches!(r, Ok(Ok(_))), "{what}: not within {limit:?}");
    }

    /// Two campaigners (TTL 4 s): exactly one leads; when it shuts down the
    /// other takes over at once (the lease is revoked, not left to expire);
    /// when etcd goes away the leader steps down by itself within the TTL.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_leader_handover_on_shutdown_and_step_down_without_etcd() {
        let test = "one_leader_handover_on_shutdown_and_step_down_without_etcd";
        if !available(test) {
            return;
        }
        let mut cluster = EtcdCluster::start(1).await.unwrap_or_else(|e| panic!("{test}: {e}"));
        let client = crate::store::connect(&cluster.config("/t/")).await.expect("connect");
        let (stop_a, stopped_a) = watch::channel(false);
        let (stop_b, stopped_b) = watch::channel(false);
        let (mut a, task_a) = spawn(client.clone(), config("a"), stopped_a);
        let b_client = client.clone();
        let (b, task_b) = spawn(client.clone(), config("b"), stopped_b);
        wait_until(&mut a, "a or b leads", Duration::from_secs(10), |_| true).await;
        let deadline = Instant::now() + Duration::from_secs(10);
        let (leader, mut leader_rx, leader_stop, mut other_rx) = loop {
            match (a.borrow().clone(), b.borrow().clone()) {
                (Some(_), Some(_)) => panic!("two leaders at once"),
                (Some(t), None) => break (t, a.clone(), stop_a, b.clone()),
                (None, Some(t)) => break (t, b.clone(), stop_b, a.clone()),
                (None, None) => {}
            }
            assert!(Instant::now() < deadline, "nobody leads");
            sleep(Duration::from_millis(20)).await;
        };
        // The key names the leader and carries its term's lease.
        let got = b_client.get(leader.key.clone()).await.expect("get");
        assert_eq!(got.kvs.first().map(|kv| kv.lease), Some(leader.lease));

        // Still exactly one after a few renewals.
        sleep(Duration::from_secs(3)).await;
        assert_eq!(leader_rx.borrow().as_ref(), Some(&leader));
        assert!(other_rx.borrow().is_none(), "two leaders after renewals");

        let t = Instant::now();
        let _ = leader_stop.send(true);
        // Well under the TTL: the lease was revoked, not left to expire.
        wait_until(&mut other_rx, "the other leads after a shutdown", Duration::from_millis(1500), Option::is_some)
            .await;
        println!("handover after a shutdown: {:?}", t.elapsed());
        wait_until(&mut leader_rx, "the stopped one does not lead", Duration::from_secs(1), Option::is_none).await;

        // etcd gone: the remaining leader steps down by itself, within the TTL.
        cluster.kill(0);
        wait_until(&mut other_rx, "step down without etcd", Duration::from_secs(4), Option::is_none).await;
        task_a.abort();
        task_b.abort();
    }
}
