//! A DaemonSet on hollow nodes, through an in-process server and the
//! `pinion` binary: with a `nodeSelector` on three nodes of which two match,
//! one pod per matching node reaches Running; a matching node that joins
//! later gets its pod; a node stopped and deleted (`pinion delete node`)
//! takes its pod with it; `pinion rollout status daemonset` waits for it;
//! `pinion get daemonsets` shows kubectl's columns; a template change rolls
//! node by node (no look finds two nodes without a Running pod); `pinion
//! describe daemonset` shows it; `pinion rollout history daemonset` lists
//! its revisions, `rollout undo daemonset` takes every node back to the old
//! template and `rollout restart daemonset` replaces every node's pod;
//! `pinion delete daemonset` takes its pods.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{Cluster, SOON};
use pinion_wire::testing::eventually;
use specs::daemonset::DAEMONSET_LABEL;
use specs::deployment::TEMPLATE_HASH_LABEL;
use specs::{Pod, PodPhase};

const LONG: Duration = Duration::from_secs(60);

fn manifest(command: &str) -> String {
    format!(
        "apiVersion: pinion.io/v1\nkind: DaemonSet\nmetadata: {{name: ptp}}\nspec:\n  updateStrategy: {{type: RollingUpdate, rollingUpdate: {{maxUnavailable: 1}}}}\n  selector: {{matchLabels: {{app: ptp}}}}\n  template:\n    metadata: {{labels: {{app: ptp}}}}\n    spec:\n      nodeSelector: {{ptp: \"yes\"}}\n      terminationGracePeriodSeconds: 0\n      containers:\n      - name: main\n        rootfs: host\n        command: [sleep, \"{command}\"]\n        resources:\n          limits: {{cpu: 100m, memory: 16Mi}}\n"
    )
}

async fn pods(c: &Cluster) -> Vec<Pod> {
    c.admin.list_pods(Some(&format!("{DAEMONSET_LABEL}=ptp"))).await.expect("list pods").items
}

/// Running and not a deleted pod its node is still stopping (listed as
/// Terminating with the phase it had).
fn running(p: &Pod) -> bool {
    p.status
        .as_ref()
        .is_some_and(|s| s.phase == PodPhase::Running && s.reason.as_deref() != Some(specs::status::TERMINATING))
}

/// Node -> the template hash of its Running pod.
fn running_on(pods: &[Pod]) -> BTreeMap<String, String> {
    pods.iter()
        .filter(|p| running(p))
        .filter_map(|p| Some((p.spec.node_name.clone()?, p.metadata.labels.get(TEMPLATE_HASH_LABEL)?.clone())))
        .collect()
}

/// Waits until exactly `nodes` each run one Running pod and no other pod is left.
async fn running_on_exactly(c: &Cluster, nodes: &[&str]) -> Vec<Pod> {
    eventually(format!("one Running pod on each of {nodes:?}"), LONG, || async {
        let p = pods(c).await;
        let on: Vec<String> = running_on(&p).into_keys().collect();
        (p.len() == nodes.len() && on == nodes).then_some(p)
    })
    .await
}

/// Runs `pinion ARGS`; its success and output.
fn cli(c: &Cluster, args: &[&str]) -> (bool, String) {
    let out = std::process::Command::new(common::PINION)
        .args(args)
        .env("PINION_CONFIG", &c.relayed_config)
        .output()
        .expect("run pinion");
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemonset_follows_its_nodes_rolls_node_by_node_and_goes_on_hollow_nodes() {
    let mut c = Cluster::start().await;
    c.labelled_node("a", &[("ptp", "yes")]);
    let b = c.labelled_node("b", &[("ptp", "yes")]);
    c.labelled_node("c", &[("ptp", "no")]);
    eventually("3 nodes", SOON, || async { c.admin.list_nodes(None).await.is_ok_and(|l| l.items.len() == 3) }).await;

    let file = c.dir.path().join("ptp.yaml");
    std::fs::write(&file, manifest("inf")).expect("write");
    let path = file.to_str().expect("utf-8").to_string();
    let (ok, out) = cli(&c, &["apply", "-f", &path]);
    assert!(ok && out.contains("daemonset/ptp created"), "{out}");
    let first = running_on_exactly(&c, &["a", "b"]).await;
    let hash = first[0].metadata.labels[TEMPLATE_HASH_LABEL].clone();
    for p in &first {
        assert_eq!(p.metadata.labels.get("app").map(String::as_str), Some("ptp"));
        assert!(p.metadata.name.starts_with("ptp-"), "{}", p.metadata.name);
    }

    let (ok, out) = cli(&c, &["rollout", "status", "daemonset", "ptp", "--timeout", "60s"]);
    assert!(ok && out.contains("successfully rolled out"), "{out}");
    let (ok, out) = cli(&c, &["get", "daemonsets"]);
    assert!(ok, "{out}");
    assert_eq!(
        out.lines().next().map(|h| h.split_whitespace().collect::<Vec<_>>()),
        Some(vec!["NAME", "DESIRED", "CURRENT", "READY", "UP-TO-DATE", "AVAILABLE", "AGE"])
    );
    let row: Vec<&str> = out.lines().nth(1).unwrap_or_default().split_whitespace().collect();
    assert_eq!(row[..6], ["ptp", "2", "2", "2", "2", "2"], "{out}");

    // A matching node that joins later gets its pod.
    c.labelled_node("d", &[("ptp", "yes")]);
    running_on_exactly(&c, &["a", "b", "d"]).await;

    // A node stopped and deleted takes its pod with it.
    let _ = b.send(true);
    let (ok, out) = cli(&c, &["delete", "node", "b"]);
    assert!(ok, "{out}");
    running_on_exactly(&c, &["a", "d"]).await;

    // A template change rolls node by node: at most maxUnavailable (1) of
    // the 2 nodes without a Running pod at any look.
    std::fs::write(&file, manifest("1000000")).expect("write");
    let (ok, out) = cli(&c, &["apply", "-f", &path]);
    assert!(ok && out.contains("daemonset/ptp configured"), "{out}");
    let worst = std::sync::atomic::AtomicUsize::new(0);
    let new_hash = eventually("both nodes on the new template", LONG, || {
        let (c, worst, hash) = (&c, &worst, hash.clone());
        async move {
            let p = pods(c).await;
            let on = running_on(&p);
            worst.fetch_max(2usize.saturating_sub(on.len()), std::sync::atomic::Ordering::Relaxed);
            let hashes: std::collections::BTreeSet<&String> = on.values().collect();
            (p.len() == 2 && on.len() == 2 && hashes.len() == 1 && !hashes.contains(&hash))
                .then(|| on.values().next().cloned().unwrap_or_default())
        }
    })
    .await;
    assert_ne!(new_hash, hash);
    let worst = worst.into_inner();
    assert!(worst <= 1, "at most one node without its pod at once: saw {worst}");
    let (ok, out) = cli(&c, &["rollout", "status", "daemonset", "ptp", "--timeout", "60s"]);
    assert!(ok && out.contains("successfully rolled out"), "{out}");

    let (ok, out) = cli(&c, &["describe", "daemonset", "ptp"]);
    assert!(ok && out.contains("ptp=yes") && out.contains("2 desired") && out.contains(&new_hash), "{out}");

    // Its revisions: the first and the current.
    let (ok, out) = cli(&c, &["rollout", "history", "daemonset", "ptp"]);
    assert!(ok, "{out}");
    let rows: Vec<Vec<&str>> = out.lines().skip(2).map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(rows, [vec!["1", hash.as_str(), "-", "-"], vec!["2", new_hash.as_str(), "current", "-"]], "{out}");
    // Undo: every node back on the first template, as revision 3.
    let (ok, out) = cli(&c, &["rollout", "undo", "daemonset", "ptp"]);
    assert!(ok && out.contains("daemonset/ptp rolled back"), "{out}");
    let undone = eventually("both nodes back on the first template", LONG, || async {
        let on = running_on(&pods(&c).await);
        (on.len() == 2 && on.values().all(|h| *h == hash)).then_some(on)
    })
    .await;
    assert_eq!(undone.keys().collect::<Vec<_>>(), ["a", "d"]);
    let (ok, out) = cli(&c, &["rollout", "undo", "daemonset", "ptp", "--to-revision", "3"]);
    assert!(!ok && out.contains("revision 3 is the current one already"), "{out}");
    // Restart: a new revision of the same template, every node's pod replaced.
    let before: Vec<String> = pods(&c).await.into_iter().map(|p| p.metadata.name).collect();
    let (ok, out) = cli(&c, &["rollout", "restart", "daemonset", "ptp"]);
    assert!(ok && out.contains("daemonset/ptp restarted"), "{out}");
    eventually("every node's pod replaced", LONG, || async {
        let p = pods(&c).await;
        let on = running_on(&p);
        let fresh = p.iter().all(|x| !before.contains(&x.metadata.name));
        (p.len() == 2 && on.len() == 2 && fresh && on.values().all(|h| *h != hash)).then_some(())
    })
    .await;
    let (ok, out) = cli(&c, &["rollout", "history", "daemonset", "ptp"]);
    let numbers: Vec<&str> = out.lines().skip(2).filter_map(|l| l.split_whitespace().next()).collect();
    assert!(ok && numbers == ["2", "3", "4"] && out.contains("restarted at"), "{out}");

    let (ok, out) = cli(&c, &["delete", "daemonset", "ptp"]);
    assert!(ok && out.contains("daemonset/ptp deleted"), "{out}");
    eventually("no pods left", SOON, || async { pods(&c).await.is_empty() }).await;
    let (ok, out) = cli(&c, &["get", "daemonsets"]);
    assert!(ok && out.contains("no daemonsets"), "{out}");
    c.stop().await;
}
