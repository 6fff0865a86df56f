//! Nodes that go silent, with the real binary: `pinion server` (heartbeat
//! grace 4 s) and three hollow agents of two NUMA nodes each under
//! `single-numa-node`. A Deployment `web` of 6 replicas says
//! `nodeLostReplaceAfterSeconds: 5`, a Deployment `upf` of 2 says `never`
//! (the server's default is 1 s, so `never` is the template's own doing).
//! The agent holding both kinds is killed with `kill -9`: once its node is
//! NotReady, nothing is replaced for a while; then web's pods there are
//! replaced on the other nodes, each on one NUMA node, and marked; upf's is
//! not. The agent starts again: web is back to exactly 6, the pods that
//! stopped are the returning node's, and upf still has its 2.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use e2e::hollow::{HollowCluster, NodeShape};
use pinion_wire::testing::wait_for;
use specs::deployment::DEPLOYMENT_LABEL;
use specs::node_lost::REPLACED_ANNOTATION;
use specs::{Pod, PodPhase};

const PINION: &str = env!("CARGO_BIN_EXE_pinion");
const SETTING: u64 = 5;
const LONG: Duration = Duration::from_secs(60);

fn deployment(name: &str, replicas: u32, replace_after: &str) -> String {
    format!(
        "apiVersion: pinion.io/v1\nkind: Deployment\nmetadata: {{name: {name}}}\nspec:\n  replicas: {replicas}\n  selector: {{matchLabels: {{app: {name}}}}}\n  template:\n    metadata: {{labels: {{app: {name}}}}}\n    spec:\n      terminationGracePeriodSeconds: 0\n      nodeLostReplaceAfterSeconds: {replace_after}\n      containers:\n      - name: main\n        rootfs: host\n        command: [sleep, inf]\n        resources:\n          limits: {{cpu: \"2\", memory: 64Mi}}\n"
    )
}

fn pods(c: &HollowCluster, name: &str) -> Vec<Pod> {
    c.pods(&format!("{DEPLOYMENT_LABEL}={name}")).unwrap_or_default()
}

fn phase(p: &Pod) -> PodPhase {
    p.status.as_ref().map(|s| s.phase).unwrap_or_default()
}

fn node(p: &Pod) -> &str {
    p.spec.node_name.as_deref().unwrap_or_default()
}

fn names(pods: &[Pod]) -> BTreeSet<String> {
    pods.iter().map(|p| p.metadata.name.clone()).collect()
}

/// Every pod's placement is on one NUMA node.
fn single_numa(pods: &[Pod]) {
    for p in pods {
        let affinity = p.status.as_ref().and_then(|s| s.placement.as_ref()).map(|pl| pl.numa_affinity.len());
        assert_eq!(affinity, Some(1), "{} on one NUMA node: {:?}", p.metadata.name, p.status);
    }
}

#[test]
fn a_silent_nodes_replicas_are_replaced_at_their_time_and_one_duplicate_stops_on_return() {
    let shape = NodeShape {
        synthetic: "pack:1 numa:2 core:8 pu:1".into(),
        reserved_cpus: "0".into(),
        policy: "single-numa-node".into(),
    };
    let flags = ["--heartbeat-grace", "4", "--node-lost-replace-after", "1"];
    let mut c = HollowCluster::start(std::path::Path::new(PINION), &flags, &["a", "b", "c"], shape).expect("cluster");
    wait_for("3 Ready nodes", LONG, || ["a", "b", "c"].iter().all(|n| c.node_condition(n).is_ok_and(|s| s == "Ready")));
    c.apply("web", &deployment("web", 6, &SETTING.to_string())).expect("apply web");
    c.apply("upf", &deployment("upf", 2, "never")).expect("apply upf");
    let running = |p: &Vec<Pod>, n: usize| p.len() == n && p.iter().all(|p| phase(p) == PodPhase::Running);
    wait_for("web's 6 and upf's 2 Running", LONG, || running(&pods(&c, "web"), 6) && running(&pods(&c, "upf"), 2));
    let web = pods(&c, "web");
    let upf = pods(&c, "upf");
    single_numa(&web);
    // The node to silence: one with an upf pod, and the most of web's there.
    let victim = ["a", "b", "c"]
        .into_iter()
        .filter(|n| upf.iter().any(|p| node(p) == *n))
        .max_by_key(|n| web.iter().filter(|p| node(p) == *n).count())
        .expect("a node with an upf pod")
        .to_string();
    let web_there: BTreeSet<String> = names(&web.iter().filter(|p| node(p) == victim).cloned().collect::<Vec<_>>());
    let upf_there: BTreeSet<String> = names(&upf.iter().filter(|p| node(p) == victim).cloned().collect::<Vec<_>>());
    assert!(!web_there.is_empty(), "web has a pod on {victim}: {:?}", web.iter().map(node).collect::<Vec<_>>());

    c.kill_agent(&victim);
    wait_for("the node NotReady", LONG, || c.node_condition(&victim).is_ok_and(|s| s == "NotReady"));
    let not_ready = Instant::now();
    // Not before the setting: for 3 of its 5 s (NotReady is seen up to a
    // poll late), web has its 6 pods and nothing new.
    while not_ready.elapsed() < Duration::from_secs(SETTING - 2) {
        let now = pods(&c, "web");
        assert_eq!(names(&now), names(&web), "nothing replaced before {SETTING} s");
        assert!(now.iter().all(|p| !p.metadata.annotations.contains_key(REPLACED_ANNOTATION)));
        std::thread::sleep(Duration::from_millis(200));
    }
    // After it: the pods there are replaced on the other nodes, each on one
    // NUMA node, and left where they were, marked.
    wait_for("web's replacements Running elsewhere", LONG, || {
        let now = pods(&c, "web");
        let elsewhere: Vec<&Pod> = now.iter().filter(|p| node(p) != victim).collect();
        elsewhere.len() == 6 && elsewhere.iter().all(|p| phase(p) == PodPhase::Running)
    });
    let replaced_at = not_ready.elapsed();
    let now = pods(&c, "web");
    assert_eq!(now.len(), 6 + web_there.len(), "the lost pods stay, not counted: {:?}", names(&now));
    for p in now.iter().filter(|p| web_there.contains(&p.metadata.name)) {
        assert!(p.metadata.annotations.contains_key(REPLACED_ANNOTATION), "{} marked", p.metadata.name);
        assert_eq!(phase(p), PodPhase::Unknown, "{}", p.metadata.name);
    }
    let replacements: Vec<Pod> = now.iter().filter(|p| !names(&web).contains(&p.metadata.name)).cloned().collect();
    assert_eq!(replacements.len(), web_there.len());
    single_numa(&replacements);
    // `never`: upf's pod there is neither replaced nor marked, long past 1 s.
    let u = pods(&c, "upf");
    assert_eq!(names(&u), names(&upf), "upf keeps its pods, its node's one waited for");
    assert!(u.iter().all(|p| !p.metadata.annotations.contains_key(REPLACED_ANNOTATION)));
    eprintln!("replaced {} pods {:.1}s after NotReady was seen", web_there.len(), replaced_at.as_secs_f64());

    // The node comes back: exactly 6 again, the returning node's pods gone.
    c.start_agent(&victim).expect("restart the agent");
    wait_for("the node Ready", LONG, || c.node_condition(&victim).is_ok_and(|s| s == "Ready"));
    wait_for("web back to 6 Running", LONG, || running(&pods(&c, "web"), 6));
    let left = pods(&c, "web");
    assert!(names(&left).is_disjoint(&web_there), "the returning node's pods stopped: {:?}", names(&left));
    assert!(left.iter().all(|p| node(p) != victim), "none left on {victim}");
    let kept: BTreeSet<String> = names(&replacements);
    assert!(kept.is_subset(&names(&left)), "the replacements stayed");
    // And it stays 6 (never both stopped, no second round).
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(names(&pods(&c, "web")), names(&left));
    let u = pods(&c, "upf");
    assert!(running(&u, 2) && names(&u) == names(&upf), "upf's pods as they were: {:?}", names(&u));
    assert_eq!(upf_there.len(), u.iter().filter(|p| node(p) == victim).count());
}
