//! Faults of the control plane with the real `pinion` binary: the server
//! killed with `kill -9` in the middle of a burst of creates and binds (with a
//! nodelet watching), and the server's data dir full. Each checks that nothing
//! acknowledged is lost, nothing refused is half-written, and the cluster
//! converges. The nodelet's own kills at each step of a pod start are the
//! scenarios `11-nodelet-kills*` (`tests/scenarios.rs`).
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use e2e::process::Proc;
use pinion_wire::testing::{is_root, requires};
use pinion_wire::tls::Credentials;
use pinion_wire::{Client, ClientError};
use serde_json::Value;

struct Server {
    pinion: PathBuf,
    data: PathBuf,
    out: PathBuf,
    addr: SocketAddr,
    proc: Option<Proc>,
    starts: u32,
}

impl Server {
    fn new(pinion: &Path, data: &Path, out: &Path) -> Server {
        Server {
            pinion: pinion.to_path_buf(),
            data: data.to_path_buf(),
            out: out.to_path_buf(),
            addr: "127.0.0.1:0".parse().unwrap(),
            proc: None,
            starts: 0,
        }
    }

    /// Starts `pinion server` on the data dir; a restart listens where the
    /// last one did, so nodes find it again.
    fn start(&mut self) {
        let log = self.out.join(format!("server.{}.out", self.starts));
        self.starts += 1;
        let file = std::fs::File::create(&log).unwrap();
        let child = Command::new(&self.pinion)
            .args(["server", "--listen", &self.addr.to_string(), "--data-dir"])
            .arg(&self.data)
            .env("PINION_LOG", "info")
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .unwrap();
        self.proc = Some(Proc(child));
        let line = wait_line(&log, "listening on", Duration::from_secs(30));
        self.addr = line.split_whitespace().nth(2).unwrap().parse().unwrap();
    }

    fn kill(&mut self) {
        self.proc = None;
    }

    fn alive(&mut self) -> bool {
        self.proc.as_mut().is_some_and(|p| p.0.try_wait().ok().flatten().is_none())
    }

    fn client(&self) -> Client {
        let creds = Credentials::load(&self.data.join("admin.conf")).unwrap();
        Client::new(&creds).unwrap()
    }

    fn url(&self) -> String {
        format!("https://{}", self.addr)
    }
}

fn wait_line(path: &Path, prefix: &str, timeout: Duration) -> String {
    let deadline = Instant::now() + timeout;
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if let Some(l) = text.lines().find(|l| l.starts_with(prefix)) {
            return l.to_string();
        }
        assert!(Instant::now() < deadline, "no {prefix:?} line in {} after {timeout:?}:\n{text}", path.display());
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn out_dir(name: &str) -> PathBuf {
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("faults").join(name);
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).unwrap();
    out
}

fn manifest(name: &str) -> Bytes {
    Bytes::from(format!(
        "apiVersion: pinion.io/v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: main\n    rootfs: host\n    command: [sleep, inf]\n    resources: {{requests: {{cpu: 100m}}}}\n"
    ))
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

/// Every pod by name, as JSON.
async fn pods(client: &Client) -> BTreeMap<String, Value> {
    let list = client.list_pods(None).await.unwrap();
    list.items.into_iter().map(|p| (p.metadata.name.clone(), serde_json::to_value(&p).unwrap())).collect()
}

const BURST: usize = 200;

/// 200 creates in flight (64 at a time, one HTTP/2 connection) while a
/// nodelet (hollow runtime, a 256-CPU fixture machine) watches its bindings;
/// the server is killed with SIGKILL once 100 creates were acknowledged, and
/// restarted on the same data dir. Every acknowledged pod is there, each was
/// bound once (one `Scheduled` event) and runs in one container; the creates
/// that got no answer are sent again and everything converges to Running.
#[test]
fn server_kill_during_a_burst_of_binds_loses_nothing_acknowledged() {
    let out = out_dir("burst");
    let pinion = e2e::binary::pinion().unwrap_or_else(|e| panic!("{e:#}"));
    let tmp = tempfile::Builder::new().prefix("pinion-faults-").tempdir().unwrap();
    let mut server = Server::new(&pinion, &tmp.path().join("srv"), &out);
    server.start();

    let fixtures = e2e::binary::repo_root().join("e2e/fixtures/sysfs");
    let sysfs = tmp.path().join("sysfs");
    std::fs::create_dir_all(&sysfs).unwrap();
    let ok = Command::new("tar")
        .arg("xzf")
        .arg(fixtures.join("256ppc-8n8s4t.tar.gz"))
        .arg("-C")
        .arg(&sysfs)
        .status()
        .unwrap()
        .success();
    assert!(ok, "cannot extract the fixture");
    let node_data = tmp.path().join("node");
    let token = std::fs::read_to_string(tmp.path().join("srv/join-token")).unwrap();
    let node_log = std::fs::File::create(out.join("node.out")).unwrap();
    let _node = Proc(
        Command::new(&pinion)
            .args(["agent", "--server", &server.url(), "--token", token.trim(), "--ca"])
            .arg(tmp.path().join("srv/pki/ca.crt"))
            .arg("--data-dir")
            .arg(&node_data)
            .args(["--node-name", "big", "--endpoint-listen", "127.0.0.1:0", "--runtime", "hollow"])
            .arg("--sysfs-root")
            .arg(&sysfs)
            .args(["--reserved-cpus", "0"])
            .env("PINION_LOG", "info")
            .stdin(Stdio::null())
            .stdout(node_log.try_clone().unwrap())
            .stderr(node_log)
            .spawn()
            .unwrap(),
    );

    let rt = runtime();
    let client = server.client();
    rt.block_on(async {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !client
            .get_node("big")
            .await
            .is_ok_and(|n| serde_json::to_value(&n).unwrap()["status"]["condition"] == "Ready")
        {
            assert!(Instant::now() < deadline, "the node did not become Ready");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });

    // The burst: each create's outcome, and the kill once half are acknowledged.
    let names: Vec<String> = (0..BURST).map(|i| format!("burst-{i:03}")).collect();
    let acked = Arc::new(std::sync::Mutex::new(BTreeSet::new()));
    let (half_tx, half_rx) = std::sync::mpsc::channel::<()>();
    let burst = {
        let (client, names, acked) = (client.clone(), names.clone(), acked.clone());
        std::thread::spawn(move || {
            let rt = runtime();
            rt.block_on(async move {
                let limit = Arc::new(tokio::sync::Semaphore::new(64));
                let mut set = tokio::task::JoinSet::new();
                for name in names {
                    let (client, acked, limit, half) = (client.clone(), acked.clone(), limit.clone(), half_tx.clone());
                    set.spawn(async move {
                        let _permit = limit.acquire_owned().await;
                        if let Ok((code, _)) = client.create_pod(manifest(&name)).await {
                            assert!(code == 201 || code == 200, "{name}: {code}");
                            let mut a = acked.lock().unwrap();
                            a.insert(name);
                            if a.len() == BURST / 2 {
                                let _ = half.send(());
                            }
                        }
                    });
                }
                // A task's panic (a create answered otherwise than 200/201)
                // fails the test; the killed server's errors are no panic.
                while let Some(done) = set.join_next().await {
                    done.expect("create task");
                }
            })
        })
    };
    half_rx.recv_timeout(Duration::from_secs(120)).expect("half of the burst acknowledged");
    server.kill();
    burst.join().unwrap();
    let acked: BTreeSet<String> = acked.lock().unwrap().clone();
    assert!(acked.len() >= BURST / 2 && acked.len() < BURST, "the kill landed mid-burst: {} acknowledged", acked.len());

    server.start();
    let client = server.client();
    rt.block_on(async {
        // Nothing acknowledged is lost.
        let found = pods(&client).await;
        println!(
            "{} of {BURST} creates acknowledged before the kill; {} pods after the restart, {} bound",
            acked.len(),
            found.len(),
            found.values().filter(|p| p["spec"]["nodeName"].is_string()).count()
        );
        let lost: Vec<&String> = acked.iter().filter(|n| !found.contains_key(*n)).collect();
        assert!(lost.is_empty(), "{} acknowledged pods lost after the restart: {lost:?}", lost.len());
        // The creates that got no answer are sent again (a client's retry): created, or already there.
        for name in names.iter().filter(|n| !acked.contains(*n)) {
            let (code, _) = client.create_pod(manifest(name)).await.unwrap();
            assert!(code == 201 || code == 200, "{name}: {code}");
        }
        // Everything converges: every pod Running on the node.
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let found = pods(&client).await;
            let waiting: Vec<String> = names
                .iter()
                .filter(|n| {
                    found.get(*n).is_none_or(|p| p["status"]["phase"] != "Running" || p["spec"]["nodeName"] != "big")
                })
                .cloned()
                .collect();
            if waiting.is_empty() && found.len() == BURST {
                for (name, p) in &found {
                    let restarts = p["status"]["containerStatuses"][0]["restartCount"].as_u64();
                    assert_eq!(restarts, Some(0), "{name}: {p}");
                }
                break;
            }
            assert!(Instant::now() < deadline, "not Running after 90 s: {waiting:?} ({} pods)", found.len());
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        // Each pod bound once.
        for name in &names {
            let events = client.events("Pod", name).await.unwrap();
            let scheduled = events.items.iter().filter(|e| e.reason == "Scheduled").count();
            assert_eq!(scheduled, 1, "{name} was bound {scheduled} times: {:?}", events.items);
        }
    });

    // One container per pod on the node, never a second incarnation.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let file: Value =
            serde_json::from_slice(&std::fs::read(node_data.join("hollow/containers.json")).unwrap_or_default())
                .unwrap_or(Value::Null);
        let ids: Vec<String> = file["containers"].as_object().map(|m| m.keys().cloned().collect()).unwrap_or_default();
        let per_pod = names.iter().map(|n| ids.iter().filter(|id| id.starts_with(&format!("{n}_"))).count());
        let all_once = per_pod.clone().all(|c| c == 1) && ids.len() == BURST;
        if all_once {
            assert!(ids.iter().all(|id| id.ends_with("_0")), "a container was started twice: {ids:?}");
            break;
        }
        assert!(Instant::now() < deadline, "containers on the node: {} for {BURST} pods: {ids:?}", ids.len());
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A small tmpfs mounted as the server's data dir; unmounted on drop.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(at).unwrap();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(at)
            .status()
            .unwrap()
            .success();
        assert!(ok, "mount -t tmpfs at {}", at.display());
        Tmpfs(at.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Fills the file system of `dir` with `dir/filler` until a write fails.
fn fill(dir: &Path) -> PathBuf {
    use std::io::Write;
    let path = dir.join("filler");
    let mut f = std::fs::File::create(&path).unwrap();
    let chunk = vec![0xa5u8; 64 << 10];
    while f.write_all(&chunk).is_ok() {}
    // The last bytes, below a chunk.
    while f.write_all(&[0xa5]).is_ok() {}
    let _ = f.sync_all();
    path
}

fn api_error(r: Result<(u16, specs::Pod), ClientError>) -> Option<(u16, String)> {
    match r {
        Err(ClientError::Api(e)) => Some((e.code, e.message)),
        _ => None,
    }
}

/// The data dir on a 64 MiB tmpfs (a new store's first sled segment is
/// 16 MiB, so a smaller disk cannot even open it), filled by a file: creates go on until
/// one is refused (at once, when the server checks the free space itself),
/// with 507 and a message naming the full data dir; the server stays up, a
/// refused pod is nowhere (nor after a restart); with the filler deleted,
/// creates work again without a restart, and everything acknowledged is there
/// after one.
#[test]
fn a_full_data_dir_refuses_writes_clearly_and_recovers_when_space_returns() {
    if !requires(is_root(), "root (to mount a tmpfs)") {
        return;
    }
    let out = out_dir("disk-full");
    let pinion = e2e::binary::pinion().unwrap_or_else(|e| panic!("{e:#}"));
    let tmp = tempfile::Builder::new().prefix("pinion-faults-").tempdir().unwrap();
    let data = tmp.path().join("srv");
    let _fs = Tmpfs::mount(&data, "64m");
    let mut server = Server::new(&pinion, &data, &out);
    server.start();
    let rt = runtime();
    let client = server.client();
    let mut acked: BTreeSet<String> = BTreeSet::new();
    let refused = rt.block_on(async {
        for name in ["before-0", "before-1", "before-2"] {
            assert_eq!(client.create_pod(manifest(name)).await.unwrap().0, 201, "{name}");
            acked.insert(name.to_string());
        }
        let filler = fill(&data);
        // sled writes into file space it already holds: a few creates may
        // still be durable. Whatever is acknowledged must survive.
        let mut refused = None;
        for i in 0..400 {
            let name = format!("full-{i:03}");
            match client.create_pod(manifest(&name)).await {
                Ok((201, _)) => {
                    acked.insert(name);
                }
                Err(ClientError::Api(e)) => {
                    refused = Some((name, e));
                    break;
                }
                other => panic!("{name}: {:?}", other.map(|r| r.0)),
            }
        }
        let Some((name, e)) = refused else { panic!("400 creates on a full disk, none refused") };
        assert_eq!(e.code, 507, "{name}: {e:?}");
        let dir = data.display().to_string();
        assert!(e.message.contains("full") && e.message.contains(&dir), "{name}: names the full data dir: {e:?}");
        assert!(
            matches!(client.get_pod(&name).await, Err(ClientError::Api(e)) if e.code == 404),
            "{name} half-written"
        );
        let again = api_error(client.create_pod(manifest("full-again")).await);
        assert_eq!(again.map(|a| a.0), Some(507), "still refused while full");
        assert!(server.alive(), "the server survives a full disk");

        std::fs::remove_file(&filler).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match client.create_pod(manifest("after-0")).await {
                Ok((code, _)) => {
                    assert_eq!(code, 201);
                    break;
                }
                Err(e) => assert!(Instant::now() < deadline, "creates still refused with space back: {e}"),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert_eq!(client.create_pod(manifest("after-1")).await.unwrap().0, 201);
        acked.extend(["after-0".to_string(), "after-1".to_string()]);
        name
    });
    server.kill();
    server.start();
    let client = server.client();
    rt.block_on(async {
        let found: BTreeSet<String> = pods(&client).await.into_keys().collect();
        assert_eq!(found, acked, "after a restart: every acknowledged pod, and only those");
        assert!(!found.contains(&refused), "{refused} was refused");
    });
}
