//! The cluster's identity, shared by the servers of one etcd: the CA (its
//! certificate and key) and the join token's secret live in ONE etcd key, so
//! that a node or a CLI that reaches any server meets the same CA and the same
//! token. Each server issues its own serving certificate from that CA with its
//! own names, so no certificate needs to name every server.
//!
//! The first server to start creates the identity (or uploads the one its data
//! dir already holds: a single server moving onto etcd keeps its nodes'
//! credentials) in a create-if-absent transaction; every other server writes
//! the shared identity into its data dir (`pki/`, `join-token`), where
//! `Pki::load_or_create` and the token loader read it as on a single server.
//! The key is readable by whoever holds an etcd client certificate, which is
//! who can already rewrite every object of the cluster.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::etcdv3::{Client, Compare, CompareResult, RequestOp, TxnRequest};
use serde::{Deserialize, Serialize};

use crate::store::etcd::{bounded, CallError};
use crate::tls::{load_or_create_join_token, Pki, TlsError};
use pinion_wire::tls::{ca_pin, write_private, JoinToken};

#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error(transparent)]
    Call(#[from] CallError),
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error("the cluster identity in etcd ({key}) does not decode: {source}")]
    Decode { key: String, source: serde_json::Error },
    #[error(
        "{} holds another CA than the cluster in etcd ({key}): this data dir belongs to another cluster; \
         give the server an empty data dir, or another --etcd-prefix",
        dir.display()
    )]
    OtherCluster { dir: PathBuf, key: String },
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
struct Identity {
    ca_cert: String,
    ca_key: String,
    join_secret: String,
}

/// Makes `dir` hold the cluster's identity from etcd `key`, creating the
/// identity there first if no server has. Returns whether this call created it.
pub async fn share(client: &Client, key: &[u8], dir: &Path, limit: Duration) -> Result<bool, IdentityError> {
    let key_name = String::from_utf8_lossy(key).into_owned();
    let crt = dir.join("pki/ca.crt");
    // Two tries: the second only after losing a race against another server's first start.
    for _ in 0..2 {
        let got = bounded(limit, client.get(key)).await?;
        if let Some(kv) = got.kvs.first() {
            let identity: Identity = serde_json::from_slice(&kv.value)
                .map_err(|source| IdentityError::Decode { key: key_name.clone(), source })?;
            adopt(&identity, dir, &key_name)?;
            return Ok(false);
        }
        let existed = crt.exists();
        let (pki, _) = Pki::load_or_create(dir)?;
        let (token, _) = load_or_create_join_token(dir, &pki.ca_cert_pem)?;
        let identity =
            Identity { ca_cert: pki.ca_cert_pem.clone(), ca_key: pki.ca_key_pem(), join_secret: token.secret.clone() };
        let value =
            serde_json::to_vec(&identity).map_err(|source| IdentityError::Decode { key: key_name.clone(), source })?;
        let put = TxnRequest::new(
            [Compare::create_revision(key.to_vec(), CompareResult::Equal, 0)],
            [RequestOp::put(key.to_vec(), value, 0)],
            [],
        );
        if bounded(limit, client.txn(put)).await?.succeeded {
            tracing::info!(key = %key_name, uploaded = existed, "cluster identity stored in etcd");
            return Ok(true);
        }
        if existed {
            return Err(IdentityError::OtherCluster { dir: dir.to_path_buf(), key: key_name });
        }
        // Another server stored its identity first: drop the one just made here.
        for path in [dir.join("pki/ca.key"), crt.clone(), dir.join("join-token")] {
            std::fs::remove_file(&path).map_err(|source| IdentityError::Io { path, source })?;
        }
    }
    Err(IdentityError::OtherCluster { dir: dir.to_path_buf(), key: key_name })
}

/// Writes the shared identity into `dir`, refusing a data dir of another cluster.
fn adopt(identity: &Identity, dir: &Path, key: &str) -> Result<(), IdentityError> {
    let crt = dir.join("pki/ca.crt");
    match std::fs::read_to_string(&crt) {
        Ok(local) if local == identity.ca_cert => {}
        Ok(_) => return Err(IdentityError::OtherCluster { dir: dir.to_path_buf(), key: key.to_string() }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            // Key first: a crash between the two leaves no certificate without its key.
            write_private(&dir.join("pki/ca.key"), identity.ca_key.as_bytes()).map_err(TlsError::from)?;
            write_private(&crt, identity.ca_cert.as_bytes()).map_err(TlsError::from)?;
        }
        Err(source) => return Err(IdentityError::Io { path: crt, source }),
    }
    let token = JoinToken {
        ca_pin: Some(ca_pin(&identity.ca_cert).map_err(TlsError::from)?),
        id: None,
        secret: identity.join_secret.clone(),
    };
    let path = dir.join("join-token");
    let text = format!("{token}\n");
    if std::fs::read_to_string(&path).ok().as_deref() != Some(text.as_str()) {
        write_private(&path, text.as_bytes()).map_err(TlsError::from)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::etcd::{available, EtcdCluster};

    const LIMIT: Duration = Duration::from_secs(5);

    fn read(dir: &Path, file: &str) -> String {
        std::fs::read_to_string(dir.join(file)).unwrap_or_default()
    }

    /// Three servers starting at once end with one CA and one token; a
    /// server whose data dir holds another cluster's CA is refused, naming
    /// the dir, and its files are left as they were.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn servers_share_one_identity_and_a_foreign_data_dir_is_refused() {
        let test = "servers_share_one_identity_and_a_foreign_data_dir_is_refused";
        if !available(test) {
            return;
        }
        let cluster = EtcdCluster::start(1).await.unwrap_or_else(|e| panic!("{test}: {e}"));
        let client = crate::store::connect(&cluster.config("/t/")).await.expect("connect");
        let tmp = tempfile::tempdir().expect("tempdir");
        let dirs: Vec<PathBuf> = (0..3).map(|i| tmp.path().join(format!("s{i}"))).collect();
        let mut starts = Vec::new();
        for d in &dirs {
            let (c, d) = (client.clone(), d.clone());
            starts.push(tokio::spawn(async move { share(&c, b"/t/identity", &d, LIMIT).await }));
        }
        let mut created = 0;
        for s in starts {
            created += usize::from(s.await.expect("join").expect("share"));
        }
        assert_eq!(created, 1, "exactly one server creates the identity");
        for d in &dirs[1..] {
            assert_eq!(read(d, "pki/ca.crt"), read(&dirs[0], "pki/ca.crt"));
            assert_eq!(read(d, "pki/ca.key"), read(&dirs[0], "pki/ca.key"));
            assert_eq!(read(d, "join-token"), read(&dirs[0], "join-token"));
        }
        // What the servers load from their dirs is the shared identity.
        let (pki, made) = Pki::load_or_create(&dirs[2]).expect("load");
        assert!(!made);
        let (token, _) = load_or_create_join_token(&dirs[2], &pki.ca_cert_pem).expect("token");
        assert_eq!(format!("{token}\n"), read(&dirs[0], "join-token"));

        // Another cluster's data dir.
        let foreign = tmp.path().join("foreign");
        let (other, _) = Pki::load_or_create(&foreign).expect("other CA");
        let err = share(&client, b"/t/identity", &foreign, LIMIT).await.expect_err("a foreign CA is refused");

        let text = err.to_string();
        assert!(
            matches!(err, IdentityError::OtherCluster { .. }) && text.contains(&foreign.display().to_string()),
            "{text}"
        );
        assert_eq!(read(&foreign, "pki/ca.crt"), other.ca_cert_pem, "left as it was");
    }
}
