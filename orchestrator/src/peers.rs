//! The servers of one cluster on etcd, as each advertised itself
//! (`pinion server --advertise-url`): one key per server under
//! `PREFIX/servers/`, so that a node joining through any server, and the
//! admin credentials a server writes, list them all, and a client moves
//! between them without the operator naming each.

use std::time::Duration;

use crate::etcdv3::{Client, RangeRequest};

use crate::store::etcd::bounded;

#[derive(Clone)]
pub struct Peers {
    client: Client,
    /// `PREFIX/servers/`
    key: Vec<u8>,
    /// This server's advertised URL, listed first.
    own: Option<String>,
    limit: Duration,
}

impl Peers {
    pub fn new(client: Client, prefix: &str, own: Option<String>, limit: Duration) -> Peers {
        Peers { client, key: format!("{prefix}servers/").into_bytes(), own, limit }
    }

    /// Writes this server's URL (when it advertises one).
    pub async fn advertise(&self) -> Result<(), String> {
        let Some(url) = &self.own else { return Ok(()) };
        let mut key = self.key.clone();
        key.extend_from_slice(url.as_bytes());
        bounded(self.limit, self.client.put(key, url.as_bytes(), 0))
            .await
            .map(|_| ())
            .map_err(|e| format!("advertising {url} in etcd: {e}"))
    }

    /// Every advertised server, this one first; only this one when etcd
    /// does not answer (a join is not refused for want of the list).
    pub async fn list(&self) -> Vec<String> {
        let mut out: Vec<String> = self.own.iter().cloned().collect();
        match bounded(self.limit, self.client.range(RangeRequest::key(self.key.clone()).prefix())).await {
            Ok(r) => {
                let mut others: Vec<String> = r
                    .kvs
                    .iter()
                    .filter_map(|kv| std::str::from_utf8(&kv.value).ok().map(str::to_string))
                    .filter(|u| !out.contains(u))
                    .collect();
                others.sort();
                out.extend(others);
            }
            Err(e) => tracing::warn!(error = %e, "cannot list the cluster's servers in etcd"),
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::etcd::{available, EtcdCluster};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_server_lists_itself_first_then_the_others() {
        let test = "every_server_lists_itself_first_then_the_others";
        if !available(test) {
            return;
        }
        let cluster = EtcdCluster::start(1).await.unwrap_or_else(|e| panic!("{test}: {e}"));
        let client = crate::store::connect(&cluster.config("/t/")).await.expect("connect");
        let limit = Duration::from_secs(5);
        let peer = |url: Option<&str>| Peers::new(client.clone(), "/t/", url.map(str::to_string), limit);
        let (a, b, c) = (peer(Some("https://a:7443")), peer(Some("https://b:7443")), peer(None));
        assert_eq!(c.list().await, Vec::<String>::new(), "nobody advertised yet");
        for p in [&b, &a, &c] {
            p.advertise().await.expect("advertise");
        }
        assert_eq!(a.list().await, ["https://a:7443", "https://b:7443"]);
        assert_eq!(b.list().await, ["https://b:7443", "https://a:7443"]);
        assert_eq!(
            c.list().await,
            ["https://a:7443", "https://b:7443"],
            "one that advertises nothing lists the others"
        );
    }
}
