//! DaemonSets through a real server on 127.0.0.1:0 with a real sled store
//! and registered nodes that run nothing (`cli/tests/daemonsets.rs` runs
//! them on hollow nodes): one pod per Ready node that matches the
//! template's `nodeSelector`, bound to it by name with the scheduler's plan
//! made there; a node that joins later gets its pod, a node deleted takes
//! its pod with it; a node where the pod cannot fit gets none and the status
//! says why; a pod its node rejects fails there (never to the queue) and
//! is made again after a pause; a template change moves `metadata.generation`; a delete takes
//! the pods with it; a problem is a 422 naming its field; a person sees only
//! their own DaemonSets and a viewer creates none.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use hyper::Method;
use orchestrator::testing::server::TestServer;
use pinion_wire::testing::eventually;
use pinion_wire::{Client, ClientError};
use specs::api::{Node, NodeSpec, NodeStatus, Role, User, UserSpec};
use specs::daemonset::{DaemonSet, DAEMONSET_LABEL};
use specs::pod::ObjectMeta;
use specs::topology::{Cpu, NumaNode};
use specs::{NodeTopology, Pod, PodPhase};

const SOON: Duration = Duration::from_secs(20);

fn manifest(name: &str, command: &str, cpu: &str) -> Bytes {
    Bytes::from(format!(
        "apiVersion: pinion.io/v1\nkind: DaemonSet\nmetadata: {{name: {name}}}\nspec:\n  selector: {{matchLabels: {{app: {name}}}}}\n  template:\n    metadata: {{labels: {{app: {name}}}}}\n    spec:\n      nodeSelector: {{ptp: \"yes\"}}\n      containers:\n      - name: main\n        rootfs: host\n        command: [sleep, \"{command}\"]\n        resources:\n          limits: {{cpu: \"{cpu}\", memory: 16Mi}}\n"
    ))
}

fn code<T: std::fmt::Debug>(r: Result<T, ClientError>) -> u16 {
    match r {
        Ok(_) => 200,
        Err(ClientError::Api(e)) => e.code,
        Err(e) => panic!("expected an HTTP answer, got {e}"),
    }
}

/// One NUMA node of `cpus` CPUs, one thread per core.
fn topology(cpus: u32) -> NodeTopology {
    let mut t = NodeTopology::default();
    let ids: Vec<u32> = (0..cpus).collect();
    for id in &ids {
        t.cpus.push(Cpu { id: *id, core: *id, socket: 0, die: None, numa: Some(0), uncore_cache: None });
    }
    t.numa_nodes.push(NumaNode {
        kind: Default::default(),
        id: 0,
        cpus: specs::CpuSet::from_ids(ids).expect("ids within MAX_ID"),
        memory_bytes: 64 << 30,
        distances: vec![10],
        hugepages: Vec::new(),
    });
    t
}

/// A node that joined `s` and registered `cpus` CPUs, labelled `ptp=yes`
/// when `matches`, and said it is alive.
async fn node(s: &TestServer, dir: &Path, name: &str, cpus: u32, matches: bool) -> Client {
    let n = s.node_client(dir, name).await;
    let labels: BTreeMap<String, String> =
        if matches { [("ptp".to_string(), "yes".to_string())].into() } else { BTreeMap::new() };
    let node = Node {
        api_version: "pinion.io/v1".into(),
        kind: "Node".into(),
        metadata: ObjectMeta { name: name.into(), labels, ..Default::default() },
        spec: NodeSpec { topology: topology(cpus), settings: Default::default(), ..Default::default() },
        status: NodeStatus::default(),
    };
    let body = Bytes::from(serde_json::to_vec(&node).expect("encode"));
    n.call::<Node>(Method::POST, "/api/v1/nodes", Some(("application/json", body))).await.expect("register");
    let path = format!("/api/v1/nodes/{name}/heartbeat");
    n.call::<serde_json::Value>(Method::POST, &path, None).await.expect("heartbeat");
    n
}

async fn pods_of(c: &Client, name: &str) -> Vec<Pod> {
    c.list_pods(Some(&format!("{DAEMONSET_LABEL}={name}"))).await.expect("list pods").items
}

/// Waits until the DaemonSet's pods are on exactly these nodes; returns them.
async fn on_nodes(c: &Client, name: &str, nodes: &[&str]) -> Vec<Pod> {
    let want: Vec<String> = nodes.iter().map(|n| n.to_string()).collect();
    eventually(format!("{name}'s pods on {nodes:?}"), SOON, || async {
        let pods = pods_of(c, name).await;
        let mut on: Vec<String> = pods.iter().filter_map(|p| p.spec.node_name.clone()).collect();
        on.sort();
        (on == want).then_some(pods)
    })
    .await
}

fn user(name: &str, role: Role) -> User {
    User {
        api_version: "pinion.io/v1".into(),
        kind: "User".into(),
        metadata: ObjectMeta { name: name.into(), ..Default::default() },
        spec: UserSpec {
            role,
            uid: None,
            gid: None,
            groups: vec![],
            profile: None,
            capabilities: vec![],
            host_network: false,
            revoked: None,
        },
    }
}

async fn add(s: &TestServer, u: &User) -> Client {
    let added = s.admin.add_user(u).await.expect("add the user");
    let creds = orchestrator::tls::Credentials {
        servers: vec![s.url.clone()],
        ca_cert: added.ca_cert,
        client_cert: added.client_cert,
        client_key: added.client_key,
    };
    Client::new(&creds).expect("client")
}

#[tokio::test]
async fn a_daemonset_runs_a_pod_per_matching_node_follows_the_nodes_and_takes_them_when_deleted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = TestServer::start(dir.path(), |_| {}).await;
    let admin = &s.admin;
    node(&s, dir.path(), "a", 4, true).await;
    node(&s, dir.path(), "b", 4, true).await;
    node(&s, dir.path(), "c", 4, false).await;

    let (c, d) = admin.apply_daemonset(manifest("ptp", "inf", "100m")).await.expect("create");
    assert_eq!((c, d.metadata.generation), (201, Some(1)));
    assert_eq!(d.metadata.owner.as_deref(), Some("admin"), "the server sets the owner");
    let (c, again) = admin.apply_daemonset(manifest("ptp", "inf", "100m")).await.expect("the same again");
    assert_eq!((c, again.metadata.generation), (200, Some(1)), "unchanged: the same generation");

    let pods = on_nodes(admin, "ptp", &["a", "b"]).await;
    for p in &pods {
        assert_eq!(p.metadata.labels.get("app").map(String::as_str), Some("ptp"));
        assert_eq!(p.metadata.owner.as_deref(), Some("admin"));
        let s = p.status.clone().expect("status");
        // Bound by name, with the plan the scheduler made on that node.
        assert_eq!(s.phase, PodPhase::Scheduled);
        assert!(s.plan.is_some(), "{}: a plan for the node to adopt", p.metadata.name);
    }
    let d: DaemonSet = eventually("the status", SOON, || async {
        admin
            .get_daemonset("ptp")
            .await
            .ok()
            .filter(|d| d.status.as_ref().is_some_and(|s| s.current_number_scheduled == 2))
    })
    .await;
    let st = d.status.clone().expect("status");
    assert_eq!((st.desired_number_scheduled, st.observed_generation, st.number_unfit), (2, 1, 0));

    // A matching node that joins later gets its pod; a deleted one takes its pod.
    node(&s, dir.path(), "d", 4, true).await;
    on_nodes(admin, "ptp", &["a", "b", "d"]).await;
    admin.delete_node("b").await.expect("delete node b");
    on_nodes(admin, "ptp", &["a", "d"]).await;

    // A node where the pod cannot fit gets none, and the status says why.
    node(&s, dir.path(), "small", 1, true).await;
    let (c, changed) = admin.apply_daemonset(manifest("ptp", "inf", "2")).await.expect("change");
    assert_eq!((c, changed.metadata.generation), (200, Some(2)));
    let d = eventually("small named unfit", SOON, || async {
        let d = admin.get_daemonset("ptp").await.ok()?;
        let s = d.status.clone()?;
        (s.observed_generation == 2 && s.unfit.iter().any(|u| u.node == "small")).then_some(d)
    })
    .await;
    assert_eq!(d.status.as_ref().map(|s| s.number_unfit), Some(1), "{:?}", d.status);
    let pods = pods_of(admin, "ptp").await;
    assert!(pods.iter().all(|p| p.spec.node_name.as_deref() != Some("small")), "no pod on small");

    admin.delete_daemonset("ptp").await.expect("delete");
    on_nodes(admin, "ptp", &[]).await;
    assert_eq!(code(admin.get_daemonset("ptp").await), 404);
    s.stop().await;
}

#[tokio::test]
async fn problems_name_their_fields() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = TestServer::start(dir.path(), |_| {}).await;
    let bad = String::from_utf8(manifest("ptp", "inf", "100m").to_vec())
        .expect("utf-8")
        .replace("selector: {matchLabels: {app: ptp}}", "selector: {matchLabels: {app: other}}")
        .replace(
            "  template:\n",
            "  updateStrategy: {type: OnDelete, rollingUpdate: {maxUnavailable: 1}}\n  template:\n",
        );
    match s.admin.apply_daemonset(Bytes::from(bad)).await {
        Err(ClientError::Api(e)) => {
            assert_eq!(e.code, 422);
            let fields: Vec<&str> = e.details.iter().map(|d| d.field.as_str()).collect();
            assert!(fields.contains(&"spec.selector.matchLabels"), "{fields:?}");
            assert!(fields.contains(&"spec.updateStrategy.rollingUpdate"), "{fields:?}");
        }
        other => panic!("expected a 422, got {other:?}"),
    }
    let unknown =
        String::from_utf8(manifest("ptp", "inf", "100m").to_vec()).expect("utf-8").replace("selector:", "selectr:");
    match s.admin.apply_daemonset(Bytes::from(unknown)).await {
        Err(ClientError::Api(e)) => assert_eq!(e.code, 422, "{e:?}"),
        other => panic!("expected a 422, got {other:?}"),
    }
    assert_eq!(code(s.admin.delete_daemonset("nothing").await), 404);
    s.stop().await;
}

#[tokio::test]
async fn a_person_sees_only_their_own_daemonsets_and_a_viewer_makes_none() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = TestServer::start(dir.path(), |_| {}).await;
    node(&s, dir.path(), "a", 4, true).await;
    let alice = add(&s, &user("alice", Role::User)).await;
    let bob = add(&s, &user("bob", Role::User)).await;
    let audit = add(&s, &user("audit", Role::Viewer)).await;

    let (c, d) = alice.apply_daemonset(manifest("alices", "inf", "100m")).await.expect("alice creates one");
    assert_eq!((c, d.metadata.owner.as_deref()), (201, Some("alice")));
    let pods = on_nodes(&s.admin, "alices", &["a"]).await;
    assert!(pods.iter().all(|p| p.metadata.owner.as_deref() == Some("alice")), "her pods are hers");

    assert_eq!(code(bob.get_daemonset("alices").await), 404, "another's is absent");
    assert_eq!(code(bob.delete_daemonset("alices").await), 404);
    assert!(bob.list_daemonsets(None).await.expect("list").items.is_empty());
    assert_eq!(code(bob.apply_daemonset(manifest("alices", "inf", "100m")).await), 409, "the name is hers");

    assert_eq!(code(audit.apply_daemonset(manifest("audits", "inf", "100m")).await), 403);
    assert_eq!(code(audit.delete_daemonset("alices").await), 403);
    assert_eq!(audit.list_daemonsets(None).await.expect("a viewer reads all").items.len(), 1);
    assert_eq!(code(audit.get_daemonset("alices").await), 200);

    assert_eq!(alice.list_daemonsets(None).await.expect("list").items.len(), 1);
    alice.delete_daemonset("alices").await.expect("she deletes hers");
    on_nodes(&s.admin, "alices", &[]).await;
    s.stop().await;
}

/// A node that rejects its DaemonSet pod: the pod fails there and is never
/// sent to the queue (no other node ever holds two of the DaemonSet's
/// pods); the status names the node with its reason; the pod is made there
/// again after a pause.
#[tokio::test]
async fn a_pod_its_node_rejects_fails_there_and_comes_back_after_a_pause() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = TestServer::start(dir.path(), |_| {}).await;
    let admin = &s.admin;
    let a = node(&s, dir.path(), "a", 4, true).await;
    node(&s, dir.path(), "b", 4, true).await;
    admin.apply_daemonset(manifest("ptp", "inf", "100m")).await.expect("create");
    let pods = on_nodes(admin, "ptp", &["a", "b"]).await;
    let on_a = pods.iter().find(|p| p.spec.node_name.as_deref() == Some("a")).expect("a pod on a");
    let name = on_a.metadata.name.clone();
    let uid = on_a.metadata.uid.clone();

    let rejection = specs::api::PodRejection { reason: "InsufficientCpu".into(), message: "no room".into() };
    let body = Bytes::from(serde_json::to_vec(&rejection).expect("encode"));
    let path = format!("/api/v1/pods/{name}/rejection");
    let (_, rejected) =
        a.call::<Pod>(Method::POST, &path, Some(("application/json", body))).await.expect("the node rejects it");
    assert_eq!(rejected.spec.node_name.as_deref(), Some("a"), "still bound to its node");
    assert_eq!(rejected.status.map(|s| s.phase), Some(PodPhase::Failed));

    eventually("a named unfit with the node's reason", SOON, || async {
        let pods = pods_of(admin, "ptp").await;
        let mut nodes: Vec<Option<String>> = pods.iter().map(|p| p.spec.node_name.clone()).collect();
        let before = nodes.len();
        nodes.sort();
        nodes.dedup();
        assert_eq!(nodes.len(), before, "one pod per node, every one bound: {nodes:?}");
        let d = admin.get_daemonset("ptp").await.ok()?;
        d.status?.unfit.iter().any(|u| u.node == "a" && u.message.contains("no room")).then_some(())
    })
    .await;
    eventually("made again on a", SOON, || async {
        let pods = pods_of(admin, "ptp").await;
        pods.iter().any(|p| p.spec.node_name.as_deref() == Some("a") && p.metadata.uid != uid).then_some(())
    })
    .await;
    on_nodes(admin, "ptp", &["a", "b"]).await;
    s.stop().await;
}

/// The DaemonSet's revision and history once the controller has seen generation `generation`.
async fn revisions(c: &Client, name: &str, generation: u64) -> (u64, Vec<u64>, String) {
    eventually(format!("{name} observed at generation {generation}"), SOON, || async {
        let s = c.get_daemonset(name).await.ok()?.status?;
        (s.observed_generation == generation)
            .then(|| (s.revision, s.history.iter().map(|r| r.number).collect(), s.template_hash.clone()))
    })
    .await
}

/// Waits until every pod of the DaemonSet on `nodes` runs the template of `hash`.
async fn all_of(c: &Client, name: &str, nodes: &[&str], hash: &str) {
    eventually(format!("{name}'s pods on {nodes:?} all of {hash}"), SOON, || async {
        let pods = pods_of(c, name).await;
        let mut on: Vec<&str> = pods.iter().filter_map(|p| p.spec.node_name.as_deref()).collect();
        on.sort();
        let same = pods.iter().all(|p| specs::deployment::pod_template_hash(p) == Some(hash));
        (on == nodes && same).then_some(())
    })
    .await
}

/// `rollout history|undo|restart daemonset`: revisions kept in the status as
/// a Deployment's, an undo putting an old template back as a new revision
/// and every node rolled to it, a restart a new revision of the same
/// template; the errors of an undo with nothing to go back to; another's
/// DaemonSet absent, a viewer refused.
#[tokio::test]
async fn a_daemonsets_revisions_are_kept_undone_and_restarted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = TestServer::start(dir.path(), |_| {}).await;
    let admin = &s.admin;
    node(&s, dir.path(), "a", 4, true).await;
    node(&s, dir.path(), "b", 4, true).await;
    admin.apply_daemonset(manifest("ptp", "inf", "100m")).await.expect("create");
    let (rev, history, v1) = revisions(admin, "ptp", 1).await;
    assert_eq!((rev, history), (1, vec![1]));
    all_of(admin, "ptp", &["a", "b"], &v1).await;
    match admin.undo_daemonset("ptp", None).await {
        Err(ClientError::Api(e)) => {
            assert_eq!(e.code, 409);
            assert!(e.message.contains("no revision before its current one"), "{}", e.message);
        }
        other => panic!("expected a 409, got {other:?}"),
    }

    admin.apply_daemonset(manifest("ptp", "1000", "100m")).await.expect("a new template");
    let (rev, history, v2) = revisions(admin, "ptp", 2).await;
    assert_eq!((rev, history), (2, vec![1, 2]));
    all_of(admin, "ptp", &["a", "b"], &v2).await;

    // Back one: revision 1's template is revision 3, and both nodes run it.
    let undone = admin.undo_daemonset("ptp", None).await.expect("undo");
    assert_eq!(undone.metadata.generation, Some(3));
    assert_eq!(undone.spec.template.spec.containers[0].command, ["sleep", "inf"]);
    let (rev, history, hash) = revisions(admin, "ptp", 3).await;
    assert_eq!((rev, history, hash.as_str()), (3, vec![2, 3], v1.as_str()));
    all_of(admin, "ptp", &["a", "b"], &v1).await;
    assert_eq!(code(admin.undo_daemonset("ptp", Some(3)).await), 409, "the current one");
    assert_eq!(code(admin.undo_daemonset("ptp", Some(1)).await), 409, "renumbered: 1 is no more");
    assert_eq!(code(admin.undo_daemonset("nothing", None).await), 404);

    // A restart: a new revision, every node's pod replaced.
    let restarted = admin.restart_daemonset("ptp").await.expect("restart");
    let annotations = restarted.spec.template.metadata.clone().unwrap_or_default().annotations;
    assert!(annotations.contains_key(specs::deployment::RESTARTED_AT_ANNOTATION), "{annotations:?}");
    let (rev, history, v4) = revisions(admin, "ptp", 4).await;
    assert_eq!((rev, history), (4, vec![2, 3, 4]));
    assert_ne!(v4, v1);
    all_of(admin, "ptp", &["a", "b"], &v4).await;
    // And undo to a number kept: revision 2's template.
    admin.undo_daemonset("ptp", Some(2)).await.expect("undo to 2");
    let (_, _, hash) = revisions(admin, "ptp", 5).await;
    assert_eq!(hash, v2);

    // Another's DaemonSet is absent; a viewer changes none.
    let bob = add(&s, &user("bob", Role::User)).await;
    let audit = add(&s, &user("audit", Role::Viewer)).await;
    assert_eq!(code(bob.restart_daemonset("ptp").await), 404);
    assert_eq!(code(bob.undo_daemonset("ptp", None).await), 404);
    assert_eq!(code(audit.restart_daemonset("ptp").await), 403);
    s.stop().await;
}
