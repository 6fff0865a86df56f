//! A Deployment on a hollow node, through an in-process server and the
//! `pinion` binary: 6 replicas reach Running, named `NAME-HASH-XXXXX` with
//! their labels; a template change rolls to the new hash and no look at the
//! pods ever finds more than `replicas + maxSurge` of them; `pinion rollout
//! status` waits for it; `pinion scale` to 2 takes 4 away; `pinion get
//! deployments` shows READY as ready/replicas; `pinion delete deployment`
//! takes its pods with it.

mod common;

use std::time::Duration;

use common::{Cluster, SOON};
use pinion_wire::testing::eventually;
use specs::deployment::{DEPLOYMENT_LABEL, TEMPLATE_HASH_LABEL};
use specs::{Pod, PodPhase};

const LONG: Duration = Duration::from_secs(60);

fn manifest(replicas: u32, command: &str) -> String {
    format!(
        "apiVersion: pinion.io/v1\nkind: Deployment\nmetadata: {{name: web}}\nspec:\n  replicas: {replicas}\n  strategy: {{type: RollingUpdate, rollingUpdate: {{maxSurge: 2, maxUnavailable: 1}}}}\n  selector: {{matchLabels: {{app: web}}}}\n  template:\n    metadata: {{labels: {{app: web, tier: front}}}}\n    spec:\n      terminationGracePeriodSeconds: 0\n      containers:\n      - name: main\n        rootfs: host\n        command: [sleep, \"{command}\"]\n        resources:\n          limits: {{cpu: 100m, memory: 16Mi}}\n"
    )
}

async fn pods(c: &Cluster) -> Vec<Pod> {
    c.admin.list_pods(Some(&format!("{DEPLOYMENT_LABEL}=web"))).await.expect("list pods").items
}

fn terminating(p: &Pod) -> bool {
    p.status.as_ref().and_then(|s| s.reason.as_deref()) == Some(specs::status::TERMINATING)
}

fn running(p: &Pod) -> bool {
    p.status.as_ref().is_some_and(|s| s.phase == PodPhase::Running)
}

/// Runs `pinion ARGS`; its success and stdout.
fn cli(c: &Cluster, args: &[&str]) -> (bool, String) {
    let out = std::process::Command::new(common::PINION)
        .args(args)
        .env("PINION_CONFIG", &c.relayed_config)
        .output()
        .expect("run pinion");
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployment_runs_rolls_scales_and_goes_on_a_hollow_node() {
    let mut c = Cluster::start().await;
    let direct = c.admin.authority().to_string();
    c.node(false, &format!("https://{direct}"));
    let file = c.dir.path().join("web.yaml");
    std::fs::write(&file, manifest(6, "inf")).expect("write");
    let path = file.to_str().expect("utf-8").to_string();
    let (ok, out) = cli(&c, &["apply", "-f", &path]);
    assert!(ok && out.contains("deployment/web created"), "{out}");

    let first = eventually("6 Running pods", LONG, || async {
        let p = pods(&c).await;
        (p.len() == 6 && p.iter().all(running)).then_some(p)
    })
    .await;
    let hash = first[0].metadata.labels[TEMPLATE_HASH_LABEL].clone();
    for p in &first {
        let name = &p.metadata.name;
        let suffix = name.strip_prefix(&format!("web-{hash}-")).unwrap_or_else(|| panic!("{name}: NAME-HASH-XXXXX"));
        assert_eq!(suffix.len(), specs::deployment::SUFFIX_LEN, "{name}");
        let l = &p.metadata.labels;
        assert_eq!((l.get("app").map(String::as_str), l.get("tier").map(String::as_str)), (Some("web"), Some("front")));
        assert_eq!(l.get(specs::deployment::REVISION_LABEL).map(String::as_str), Some("1"));
    }
    let (ok, out) = cli(&c, &["rollout", "status", "deployment", "web", "--timeout", "60s"]);
    assert!(ok && out.contains("successfully rolled out"), "{out}");
    let (ok, out) = cli(&c, &["get", "deployments"]);
    assert!(ok, "{out}");
    let row: Vec<&str> = out.lines().nth(1).unwrap_or_default().split_whitespace().collect();
    assert_eq!(
        out.lines().next().map(|h| h.split_whitespace().collect::<Vec<_>>()),
        Some(vec!["NAME", "READY", "UP-TO-DATE", "AVAILABLE", "AGE"])
    );
    assert_eq!(row[..4], ["web", "6/6", "6", "6"], "{out}");

    // A template change: never more than 6 + maxSurge pods at any look.
    std::fs::write(&file, manifest(6, "1000000")).expect("write");
    let (ok, out) = cli(&c, &["apply", "-f", &path]);
    assert!(ok && out.contains("deployment/web configured"), "{out}");
    let most = std::sync::atomic::AtomicUsize::new(0);
    let new_hash = eventually("6 Running pods of the new template", LONG, || {
        let (c, most, hash) = (&c, &most, hash.clone());
        async move {
            let p = pods(c).await;
            // A deleted pod its node is still stopping is listed as
            // Terminating; like Kubernetes' surge, the bound counts the live ones.
            let live = p.iter().filter(|p| !terminating(p)).count();
            most.fetch_max(live, std::sync::atomic::Ordering::Relaxed);
            let hashes: std::collections::BTreeSet<&String> =
                p.iter().map(|p| &p.metadata.labels[TEMPLATE_HASH_LABEL]).collect();
            let new = hashes.len() == 1 && !hashes.contains(&hash);
            (p.len() == 6 && new && p.iter().all(|p| running(p) && !terminating(p)))
                .then(|| p[0].metadata.labels[TEMPLATE_HASH_LABEL].clone())
        }
    })
    .await;
    let most = most.into_inner();
    assert!(most <= 8, "at most replicas + maxSurge pods: saw {most}");
    assert_ne!(new_hash, hash);
    let (ok, out) = cli(&c, &["rollout", "history", "deployment", "web"]);
    assert!(ok && out.contains(&hash) && out.contains(&new_hash), "{out}");

    let (ok, out) = cli(&c, &["scale", "deployment", "web", "--replicas", "2"]);
    assert!(ok, "{out}");
    eventually("2 pods left", SOON, || async { pods(&c).await.len() == 2 }).await;
    let (ok, out) = cli(&c, &["describe", "deployment", "web"]);
    assert!(ok && out.contains("2 desired"), "{out}");

    let (ok, out) = cli(&c, &["delete", "deployment", "web"]);
    assert!(ok && out.contains("deployment/web deleted"), "{out}");
    eventually("no pods left", SOON, || async { pods(&c).await.is_empty() }).await;
    c.stop().await;
}
