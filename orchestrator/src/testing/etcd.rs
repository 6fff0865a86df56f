//! Real etcd clusters for tests: one or three members on free loopback
//! ports, each with its own data dir in a temporary directory; a member can
//! be killed with SIGKILL and started again on its data; every member is
//! killed when the cluster is dropped.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::store::EtcdConfig;

/// Whether `etcd` can be run here. Outside CI a missing etcd prints SKIPPED
/// and the test returns; under `CI=true` it is a failure, never a skip
/// (`pinion_wire::testing::requires`).
pub fn available(test: &str) -> bool {
    let found = Command::new("etcd")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    pinion_wire::testing::requires(
        found,
        format_args!("etcd for {test} (apt-get install etcd-server; e2e/host-setup.sh)"),
    )
}

/// TLS on the members' client port: the server certificate etcd presents,
/// and the client certificate it asks for (both signed by `ca`).
#[derive(Debug, Clone)]
pub struct ClientTls {
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
}

/// The transaction limits the members start with.
pub const MAX_TXN_OPS: usize = 1024;
pub const MAX_REQUEST_BYTES: usize = 8 << 20;

struct Member {
    name: String,
    data_dir: PathBuf,
    client_url: String,
    peer_url: String,
    child: Option<Child>,
}

pub struct EtcdCluster {
    members: Vec<Member>,
    initial_cluster: String,
    tls: Option<ClientTls>,
    dir: tempfile::TempDir,
}

fn free_ports(n: usize) -> std::io::Result<Vec<u16>> {
    // Held together until all are known, so that no two are the same.
    let listeners: Vec<_> =
        (0..n).map(|_| std::net::TcpListener::bind("127.0.0.1:0")).collect::<std::io::Result<_>>()?;
    listeners.iter().map(|l| l.local_addr().map(|a| a.port())).collect()
}

impl EtcdCluster {
    /// Starts `members` members and waits (30 s at most) until each answers.
    pub async fn start(members: usize) -> Result<EtcdCluster, String> {
        EtcdCluster::start_with(members, None).await
    }

    /// As `start`, with https and client certificates on the client port
    /// when `tls` is given (the peers talk plain http on loopback).
    pub async fn start_with(members: usize, tls: Option<ClientTls>) -> Result<EtcdCluster, String> {
        let scheme = if tls.is_some() { "https" } else { "http" };
        let dir = tempfile::tempdir().map_err(|e| format!("tempdir: {e}"))?;
        let ports = free_ports(2 * members).map_err(|e| format!("free ports: {e}"))?;
        let members: Vec<Member> = (0..members)
            .map(|i| Member {
                name: format!("m{i}"),
                data_dir: dir.path().join(format!("m{i}")),
                client_url: format!("{scheme}://127.0.0.1:{}", ports[2 * i]),
                peer_url: format!("http://127.0.0.1:{}", ports[2 * i + 1]),
                child: None,
            })
            .collect();
        let initial_cluster =
            members.iter().map(|m| format!("{}={}", m.name, m.peer_url)).collect::<Vec<_>>().join(",");
        let mut cluster = EtcdCluster { members, initial_cluster, tls, dir };
        for i in 0..cluster.members.len() {
            cluster.spawn(i)?;
        }
        for i in 0..cluster.members.len() {
            cluster.wait_ready(i).await?;
        }
        Ok(cluster)
    }

    fn spawn(&mut self, i: usize) -> Result<(), String> {
        let m = &self.members[i];
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join(format!("{}.log", m.name)))
            .map_err(|e| format!("etcd log: {e}"))?;
        let log2 = log.try_clone().map_err(|e| format!("etcd log: {e}"))?;
        let mut command = Command::new("etcd");
        if let Some(tls) = &self.tls {
            command
                .arg("--cert-file")
                .arg(&tls.server_cert)
                .arg("--key-file")
                .arg(&tls.server_key)
                .arg("--trusted-ca-file")
                .arg(&tls.ca)
                .arg("--client-cert-auth");
        }
        let child = command
            .args(["--name", &m.name])
            .arg("--data-dir")
            .arg(&m.data_dir)
            .args(["--listen-client-urls", &m.client_url, "--advertise-client-urls", &m.client_url])
            .args(["--listen-peer-urls", &m.peer_url, "--initial-advertise-peer-urls", &m.peer_url])
            .args(["--initial-cluster", &self.initial_cluster, "--initial-cluster-state", "new"])
            .args(["--initial-cluster-token", "pinion-test"])
            // etcd's tuning guide for a slow or busy host: a test suite shares two cores
            // with dozens of tests, and a missed 100 ms heartbeat must not start an
            // election in the middle of a test (a three-member test failed once in CI
            // under the whole suite's load, and did not fail alone here).
            .args(["--heartbeat-interval", "250", "--election-timeout", "2500"])
            // What README recommends for Pinion (etcd's defaults: 128 and 1.5 MiB);
            // a server uses them only when told (`--etcd-max-txn-ops`, ...).
            .args(["--max-txn-ops", &MAX_TXN_OPS.to_string(), "--max-request-bytes", &MAX_REQUEST_BYTES.to_string()])
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            .spawn()
            .map_err(|e| format!("starting etcd: {e}"))?;
        self.members[i].child = Some(child);
        Ok(())
    }

    /// Waits until member `i` answers a linearizable read (so it has a quorum).
    async fn wait_ready(&mut self, i: usize) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut config = self.config("/probe/");
        config.endpoints = vec![self.members[i].client_url.clone()];
        loop {
            if let Some(child) = self.members[i].child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    return Err(format!("etcd member {i} exited: {status}; see {}", self.log_path(i).display()));
                }
            }
            let probe = async {
                let c = crate::store::connect(&config).await.ok()?;
                c.get("probe").await.ok()
            };
            if let Ok(Some(_)) = tokio::time::timeout(Duration::from_secs(2), probe).await {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!("etcd member {i} not ready within 30 s; see {}", self.log_path(i).display()));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn log_path(&self, i: usize) -> PathBuf {
        self.dir.path().join(format!("{}.log", self.members[i].name))
    }

    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(|m| m.client_url.clone()).collect()
    }

    /// How to reach this cluster, with the cluster's keys under `prefix`.
    pub fn config(&self, prefix: &str) -> EtcdConfig {
        EtcdConfig {
            endpoints: self.endpoints(),
            ca: self.tls.as_ref().map(|t| t.ca.clone()),
            cert: self.tls.as_ref().map(|t| t.client_cert.clone()),
            key: self.tls.as_ref().map(|t| t.client_key.clone()),
            prefix: prefix.into(),
        }
    }

    /// SIGKILL to member `i`, and waits until it is gone.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.members[i].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGSTOP to member `i`: alive to the kernel (its ports still accept
    /// connections), silent to everyone, as a member on a hung host is.
    pub fn pause(&mut self, i: usize) {
        self.signal(i, nix::sys::signal::Signal::SIGSTOP);
    }

    /// SIGCONT to member `i`, paused before.
    pub fn resume(&mut self, i: usize) {
        self.signal(i, nix::sys::signal::Signal::SIGCONT);
    }

    fn signal(&mut self, i: usize, signal: nix::sys::signal::Signal) {
        if let Some(child) = &self.members[i].child {
            if let Ok(pid) = i32::try_from(child.id()) {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal);
            }
        }
    }

    /// Starts member `i` again on its data dir and waits until it answers.
    pub async fn restart(&mut self, i: usize) -> Result<(), String> {
        self.kill(i);
        self.spawn(i)?;
        self.wait_ready(i).await
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }
}
