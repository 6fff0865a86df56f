//! The cluster's rules, table-tested over a real store in a temporary folder:
//! no server, no network.

use specs::api::{NodeStatusReport, PodRejection};
use specs::job::{Job, JobPhase};
use specs::{Pod, PodPhase, PodStatus};

use super::authorize::{authorize, pods_visible_to, Request};
use super::{jobs, nodes, pods, tokens, ClusterError};
use crate::store::{Claim, Kind, Store, Txn};
use crate::tls::Identity;

fn pod(name: &str) -> Pod {
    specs::testing::pod(name).image("busybox:1").build()
}

fn bound(name: &str, node: &str) -> Pod {
    let mut p = pod(name);
    p.spec.node_name = Some(node.into());
    p
}

fn job(name: &str, parallelism: u32) -> Job {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "pinion.io/v1", "kind": "Job", "metadata": {"name": name},
        "spec": {"parallelism": parallelism, "template": {"spec": {"containers": [{"name": "main", "image": "busybox:1"}]}}}
    }))
    .expect("job")
}

fn status(phase: PodPhase) -> PodStatus {
    PodStatus { phase, ..PodStatus::default() }
}

/// A registration under the default pod ranges (10.213.0.0/16, a /24 each).
fn register(t: &mut Txn<'_>, node: &specs::api::Node) -> Result<(bool, specs::api::Node), ClusterError> {
    nodes::register(t, node, &specs::net::PodRanges::default())
}

struct World {
    _dir: tempfile::TempDir,
    store: Store,
}

impl World {
    fn new() -> World {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(dir.path(), Default::default()).expect("store");
        World { _dir: dir, store }
    }

    /// One command in one write, as the API runs it.
    async fn run<T: Send + 'static>(
        &self,
        f: impl FnMut(&mut Txn<'_>) -> Result<T, ClusterError> + Send + 'static,
    ) -> Result<T, ClusterError> {
        self.store.write(f).await
    }

    async fn put_pod(&self, p: Pod) -> Pod {
        self.run(move |t| {
            let mut p = p.clone();
            t.put(&mut p)?;
            Ok(p)
        })
        .await
        .expect("put")
    }

    fn pod(&self, name: &str) -> Option<Pod> {
        self.store.get::<Pod>(name).expect("get")
    }

    fn reasons(&self, kind: Kind, name: &str) -> Vec<String> {
        self.store.events(kind, name).expect("events").into_iter().map(|e| e.reason).collect()
    }
}

fn kind_of(r: &Result<(), ClusterError>) -> &'static str {
    match r {
        Ok(()) => "ok",
        Err(ClusterError::Unauthorized(_)) => "401",
        Err(ClusterError::Forbidden(_)) => "403",
        Err(ClusterError::NotFound { .. }) => "404",
        Err(_) => "other",
    }
}

fn person(name: &str, role: specs::api::Role) -> Identity {
    Identity::Person(std::sync::Arc::new(specs::api::User {
        api_version: "pinion.io/v1".into(),
        kind: "User".into(),
        metadata: specs::pod::ObjectMeta { name: name.into(), uid: Some(format!("{name}-1")), ..Default::default() },
        spec: specs::api::UserSpec {
            role,
            uid: Some(1001),
            gid: None,
            groups: vec![],
            profile: None,
            capabilities: vec![],
            host_network: false,
            revoked: None,
        },
    }))
}

fn owned_by(mut p: Pod, owner: &str) -> Pod {
    p.metadata.owner = Some(owner.into());
    p
}

#[test]
fn every_request_by_every_identity() {
    use super::Access::{Read, Write};
    use specs::api::Role;
    let ids = [
        Identity::Admin,
        person("ops", Role::Admin),
        person("alice", Role::User),
        person("audit", Role::Viewer),
        Identity::Node("n1".into()),
        Identity::Anonymous,
        Identity::Other("someone".into()),
        // A person's certificate not yet found in the store.
        Identity::User("mallory".into()),
    ];
    let on_n1 = owned_by(bound("p", "n1"), "bob");
    let on_n2 = owned_by(bound("q", "n2"), "alice");
    let unbound = pod("r");
    let alices = Request::Owned { kind: "Pod", name: "a", owner: Some("alice"), access: Read };
    let alices_w = Request::Owned { kind: "Pod", name: "a", owner: Some("alice"), access: Write };
    let bobs = Request::Owned { kind: "Job", name: "b", owner: Some("bob"), access: Read };
    let bobs_w = Request::Owned { kind: "Job", name: "b", owner: Some("bob"), access: Write };
    // (request, [admin, admin role, user alice, viewer, node n1, anonymous, another certificate, unknown person])
    let table: Vec<(Request, [&str; 8])> = vec![
        (Request::Public, ["ok", "ok", "ok", "ok", "ok", "ok", "ok", "ok"]),
        (Request::Join, ["ok", "ok", "ok", "ok", "ok", "ok", "ok", "ok"]),
        (Request::Known, ["ok", "ok", "ok", "ok", "ok", "401", "403", "401"]),
        (Request::ReadMetrics, ["ok", "ok", "403", "ok", "403", "401", "403", "401"]),
        (Request::ReadPods { node: None }, ["ok", "ok", "ok", "ok", "ok", "401", "403", "401"]),
        (Request::ReadPods { node: Some("n1") }, ["ok", "ok", "ok", "ok", "ok", "401", "403", "401"]),
        (Request::ReadPods { node: Some("n2") }, ["ok", "ok", "ok", "ok", "403", "401", "403", "401"]),
        (Request::Pod(&on_n1), ["ok", "ok", "404", "ok", "ok", "401", "403", "401"]),
        (Request::Pod(&on_n2), ["ok", "ok", "ok", "ok", "403", "401", "403", "401"]),
        (Request::Pod(&unbound), ["ok", "ok", "404", "ok", "403", "401", "403", "401"]),
        (Request::ReportPod(&on_n1), ["ok", "ok", "403", "403", "ok", "401", "403", "401"]),
        (Request::ReportPod(&on_n2), ["ok", "ok", "403", "403", "403", "401", "403", "401"]),
        (alices, ["ok", "ok", "ok", "ok", "403", "401", "403", "401"]),
        (alices_w, ["ok", "ok", "ok", "403", "403", "401", "403", "401"]),
        (bobs, ["ok", "ok", "404", "ok", "403", "401", "403", "401"]),
        (bobs_w, ["ok", "ok", "404", "403", "403", "401", "403", "401"]),
        (Request::CreatePod, ["ok", "ok", "ok", "403", "403", "401", "403", "401"]),
        (Request::DeletePod, ["ok", "ok", "ok", "403", "403", "401", "403", "401"]),
        (Request::PodLogs, ["ok", "ok", "ok", "ok", "403", "401", "403", "401"]),
        (Request::AttachPod, ["ok", "ok", "ok", "ok", "403", "401", "403", "401"]),
        (Request::ExecPod, ["ok", "ok", "ok", "403", "403", "401", "403", "401"]),
        (Request::ListNodes, ["ok", "ok", "ok", "ok", "ok", "401", "403", "401"]),
        (Request::WatchNodes, ["ok", "ok", "ok", "ok", "ok", "401", "403", "401"]),
        (Request::ActForNode("n1"), ["ok", "ok", "403", "403", "ok", "401", "403", "401"]),
        (Request::ActForNode("n2"), ["ok", "ok", "403", "403", "403", "401", "403", "401"]),
        (Request::DeleteNode, ["ok", "ok", "403", "403", "403", "401", "403", "401"]),
        (Request::ListJobs, ["ok", "ok", "ok", "ok", "403", "401", "403", "401"]),
        (Request::ReadJob, ["ok", "ok", "ok", "ok", "403", "401", "403", "401"]),
        (Request::CreateJob, ["ok", "ok", "ok", "403", "403", "401", "403", "401"]),
        (Request::DeleteJob, ["ok", "ok", "ok", "403", "403", "401", "403", "401"]),
        (Request::ReadEvents, ["ok", "ok", "ok", "ok", "403", "401", "403", "401"]),
        (Request::ListUsers, ["ok", "ok", "403", "ok", "403", "401", "403", "401"]),
        (Request::ManageUsers, ["ok", "ok", "403", "403", "403", "401", "403", "401"]),
    ];
    for (request, want) in table {
        let got: Vec<&str> = ids.iter().map(|id| kind_of(&authorize(id, request))).collect();
        assert_eq!(got, want, "{request:?}");
    }
    // A refusal names who asked and what they may not do; another's object
    // is absent, not forbidden.
    let (n1, alice, viewer) = (&ids[4], &ids[2], &ids[3]);
    let e = authorize(n1, Request::DeletePod).expect_err("refused");
    assert_eq!(e.to_string(), "node \"n1\" may not delete pods");
    let e = authorize(n1, Request::Pod(&on_n2)).expect_err("refused");
    assert_eq!(e.to_string(), "node \"n1\" may not access pod \"q\" (not bound to it)");
    let e = authorize(alice, bobs_w).expect_err("refused");
    assert_eq!(e.to_string(), "job \"b\" not found");
    let e = authorize(viewer, Request::CreatePod).expect_err("refused");
    assert_eq!(e.to_string(), "viewer \"audit\" may not create pods");
    // A node lists its peers without their status (the pods they run).
    let shown: Vec<bool> = ids.iter().map(super::node_status_shown).collect();
    assert_eq!(shown, [true, true, true, true, false, true, true, true]);
}

#[test]
fn lists_and_watches_of_a_user_hold_only_their_own() {
    use super::{owner_filter, sees};
    use specs::api::Role;
    let (alice, viewer) = (person("alice", Role::User), person("audit", Role::Viewer));
    assert!(sees(&alice, Some("alice")));
    assert!(!sees(&alice, Some("bob")));
    assert!(!sees(&alice, None));
    assert!(sees(&viewer, Some("bob")) && sees(&Identity::Admin, None));
    assert_eq!(owner_filter(&alice).as_deref(), Some("alice"));
    assert_eq!(owner_filter(&viewer), None);
}

#[test]
fn env_values_are_shown_to_the_owner_admins_and_nodes_only() {
    use super::authorize::env_values;
    use specs::api::Role;
    // (identity, sees the values of alice's object, of an object with no owner)
    let cases = [
        (Identity::Admin, true, true),
        (person("boss", Role::Admin), true, true),
        (Identity::Node("n1".into()), true, true),
        (person("alice", Role::User), true, false),
        (person("audit", Role::Viewer), false, false),
        (person("alice", Role::Viewer), true, false),
        (Identity::Anonymous, false, false),
    ];
    for (id, hers, nobodys) in cases {
        let shown = env_values(&id);
        assert_eq!((shown.shows(Some("alice")), shown.shows(None)), (hers, nobodys), "{id:?}");
    }
}

#[test]
fn a_node_sees_only_its_own_pods() {
    let n1 = Identity::Node("n1".into());
    assert_eq!(pods_visible_to(&n1, None).as_deref(), Some("n1"));
    assert_eq!(pods_visible_to(&Identity::Admin, None), None);
    assert_eq!(pods_visible_to(&Identity::Admin, Some("n2".into())).as_deref(), Some("n2"));
}

#[tokio::test]
async fn creating_a_pod() {
    let w = World::new();
    // New: Pending with the given uid; naming a node: Scheduled there.
    let c = w.run(|t| pods::create(t, &pod("a"), "uid-a", None)).await.expect("create");
    assert!(c.new);
    assert_eq!(c.pod.metadata.uid.as_deref(), Some("uid-a"));
    assert_eq!(c.pod.status.as_ref().map(|s| s.phase), Some(PodPhase::Pending));
    let c = w.run(|t| pods::create(t, &bound("b", "n1"), "uid-b", None)).await.expect("create");
    let s = c.pod.status.expect("status");
    assert_eq!(
        (s.phase, s.reason.as_deref(), s.node_name.as_deref()),
        (PodPhase::Scheduled, Some("NodeNameSet"), Some("n1"))
    );

    // The same create again is answered with the stored pod; another spec is refused.
    let again = w.run(|t| pods::create(t, &pod("a"), "uid-x", None)).await.expect("repeat");
    assert!(!again.new);
    assert_eq!(again.pod.metadata.uid.as_deref(), Some("uid-a"));
    let mut other = pod("a");
    other.metadata.labels.insert("k".into(), "v".into());
    let e = w.run(move |t| pods::create(t, &other, "uid-y", None)).await.expect_err("conflict");
    assert!(matches!(e, ClusterError::Conflict(ref m) if m.contains("already exists with a different spec")), "{e}");

    // A finished pod's name is free again: the old pod goes in the same write.
    let mut done = w.pod("a").expect("a");
    done.status = Some(status(PodPhase::Succeeded));
    w.put_pod(done).await;
    let from = w.store.resource_version();
    let mut changes = w.store.watch(from).await.expect("watch");
    let c = w.run(|t| pods::create(t, &pod("a"), "uid-a2", None)).await.expect("over finished");
    assert!(c.new);
    assert_eq!(w.pod("a").and_then(|p| p.metadata.uid).as_deref(), Some("uid-a2"));
    // The controller learns both from the store's watch: the old pod deleted, the new one added.
    let mut seen = Vec::new();
    for _ in 0..2 {
        let change = changes.next().await.expect("change");
        let uid = serde_json::from_str::<Pod>(&change.object).expect("pod").metadata.uid;
        seen.push((change.event_type, uid.unwrap_or_default()));
    }
    assert_eq!(
        seen,
        [
            (specs::api::WatchEventType::Deleted, "uid-a".into()),
            (specs::api::WatchEventType::Added, "uid-a2".to_string())
        ]
    );

    // A pod no node could hold is refused and nothing is stored.
    let e = w.run(|t| pods::create(t, &pod("huge"), "u", Some("0/1 nodes fit"))).await.expect_err("never");
    assert!(matches!(e, ClusterError::Unschedulable(ref m) if m.starts_with("0/1 nodes fit (annotate")), "{e}");
    assert!(w.pod("huge").is_none());
}

#[tokio::test]
async fn deleting_a_pod() {
    let w = World::new();
    let e = w.run(|t| pods::delete(t, &Identity::Admin, "none")).await.expect_err("missing");
    assert!(matches!(e, ClusterError::NotFound { kind: "Pod", .. }));
    assert_eq!(e.to_string(), "pod \"none\" not found");
    w.put_pod(pod("a")).await;
    let deleted = w.run(|t| pods::delete(t, &Identity::Admin, "a")).await;
    assert!(matches!(deleted, Ok(pods::Deleted::Pod(p)) if p.metadata.name == "a"));
    assert!(w.pod("a").is_none());

    // A user deletes their own pod; another's is absent to them, and stays.
    let (alice, bob) = (person("alice", specs::api::Role::User), person("bob", specs::api::Role::User));
    w.put_pod(owned_by(pod("b"), "bob")).await;
    let e = w.run(move |t| pods::delete(t, &alice, "b")).await.expect_err("not theirs");
    assert_eq!(e.to_string(), "pod \"b\" not found");
    assert!(w.pod("b").is_some());
    assert!(w.run(move |t| pods::delete(t, &bob, "b")).await.is_ok());
    assert!(w.pod("b").is_none());
}

#[tokio::test]
async fn a_name_held_by_anothers_pod_or_job_stays_theirs() {
    let w = World::new();
    let mut done = owned_by(pod("x"), "bob");
    done.status = Some(status(PodPhase::Succeeded));
    w.put_pod(done).await;
    // Finished or not, alice's create does not replace bob's pod.
    let e = w.run(|t| pods::create(t, &owned_by(pod("x"), "alice"), "u", None)).await.expect_err("taken");
    assert!(matches!(e, ClusterError::Conflict(_)), "{e}");
    assert_eq!(w.pod("x").and_then(|p| p.metadata.owner).as_deref(), Some("bob"));
    // Bob's own create replaces his finished pod.
    let created = w.run(|t| pods::create(t, &owned_by(pod("x"), "bob"), "u2", None)).await.expect("his own");
    assert!(created.new);

    let mut j = job("solve", 2);
    j.metadata.owner = Some("bob".into());
    w.run(move |t| jobs::create(t, &j, "j1", None)).await.expect("bob's job");
    let member = w.pod("solve-0").expect("member");
    assert_eq!(member.metadata.owner.as_deref(), Some("bob"), "a member is its job's owner's");
    let mut j = job("solve", 2);
    j.metadata.owner = Some("alice".into());
    let e = w.run(move |t| jobs::create(t, &j, "j2", None)).await.expect_err("taken");
    assert!(matches!(e, ClusterError::Conflict(_)), "{e}");
    let alice = person("alice", specs::api::Role::User);
    let e = w.run(move |t| jobs::delete_for(t, &alice, "solve")).await.expect_err("not hers");
    assert_eq!(e.to_string(), "job \"solve\" not found");
    assert!(w.pod("solve-0").is_some());
}

#[tokio::test]
async fn a_nodes_report_of_one_pod() {
    let w = World::new();
    let mut p = bound("p", "n1");
    p.metadata.uid = Some("u1".into());
    p.status = Some(status(PodPhase::Scheduled));
    w.put_pod(p).await;
    let n1 = Identity::Node("n1".into());
    let n2 = Identity::Node("n2".into());
    let report = |phase, uid: Option<&str>| PodStatus { pod_uid: uid.map(str::to_string), ..status(phase) };
    // (who, status reported, outcome: "ok" + finished, or the refusal)
    let table: Vec<(&Identity, PodStatus, &str)> = vec![
        (&n2, report(PodPhase::Running, None), "forbidden"),
        (&n1, report(PodPhase::Running, Some("u0")), "conflict"),
        (&n1, report(PodPhase::Running, Some("u1")), "ok"),
        (&n1, report(PodPhase::Succeeded, None), "ok finished"),
        // A terminal phase is final.
        (&n1, report(PodPhase::Running, None), "conflict"),
    ];
    for (who, reported, want) in table {
        let who2 = who.clone();
        let r2 = reported.clone();
        let got = match w.run(move |t| pods::report_status(t, &who2, "p", &r2)).await {
            Ok((_, true)) => "ok finished",
            Ok((_, false)) => "ok",
            Err(ClusterError::Forbidden(_)) => "forbidden",
            Err(ClusterError::Conflict(_)) => "conflict",
            Err(e) => panic!("{e}"),
        };
        assert_eq!(got, want, "{who:?} {:?}", reported.phase);
    }
    let stored = w.pod("p").and_then(|p| p.status).expect("status");
    assert_eq!((stored.phase, stored.pod_uid, stored.node_name.as_deref()), (PodPhase::Succeeded, None, Some("n1")));
}

#[tokio::test]
async fn a_rejected_binding_goes_back_to_pending() {
    let w = World::new();
    w.put_pod(pod("free")).await;
    let mut p = bound("p", "n1");
    p.status = Some(PodStatus { phase: PodPhase::Scheduled, node_name: Some("n1".into()), ..PodStatus::default() });
    w.put_pod(p).await;
    let n1 = Identity::Node("n1".into());
    let rejection = PodRejection { reason: "TopologyAffinityError".into(), message: "no NUMA node fits".into() };
    // A node may not touch a pod not bound to it; an admin is told it is unbound.
    let (id, r) = (n1.clone(), rejection.clone());
    let e = w.run(move |t| pods::reject(t, &id, "free", &r)).await.expect_err("not its pod");
    assert!(matches!(e, ClusterError::Forbidden(_)), "{e}");
    let r = rejection.clone();
    let e = w.run(move |t| pods::reject(t, &Identity::Admin, "free", &r)).await.expect_err("unbound");
    assert_eq!(e.to_string(), "pod \"free\" is not bound to a node");
    let (id, r) = (n1.clone(), rejection.clone());
    let (pod, node) = w.run(move |t| pods::reject(t, &id, "p", &r)).await.expect("reject");
    assert_eq!(node, "n1");
    assert_eq!(pod.spec.node_name, None);
    let s = pod.status.expect("status");
    assert_eq!((s.phase, s.reason.as_deref()), (PodPhase::Pending, Some("Rejected")));
    assert_eq!(s.message.as_deref(), Some("node n1 rejected the binding: TopologyAffinityError: no NUMA node fits"));
    assert_eq!(w.reasons(Kind::Pod, "p"), ["Rejected"]);
}

#[tokio::test]
async fn an_unconfirmed_binding_expires_back_to_pending() {
    let w = World::new();
    let scheduled = |name: &str, phase| {
        let mut p = bound(name, "n1");
        p.status = Some(PodStatus { phase, node_name: Some("n1".into()), ..PodStatus::default() });
        p
    };
    w.put_pod(scheduled("waiting", PodPhase::Scheduled)).await;
    w.put_pod(scheduled("running", PodPhase::Running)).await;
    let timeout = std::time::Duration::from_secs(30);
    // (pod, node the binding named, expired?)
    for (name, node, expired) in
        [("waiting", "n2", false), ("running", "n1", false), ("gone", "n1", false), ("waiting", "n1", true)]
    {
        let got = w.run(move |t| pods::expire_binding(t, name, node, timeout)).await.expect("expire");
        assert_eq!(got.is_some(), expired, "{name} on {node}");
    }
    let p = w.pod("waiting").expect("pod");
    let s = p.status.expect("status");
    assert_eq!((p.spec.node_name, s.phase, s.reason.as_deref()), (None, PodPhase::Pending, Some("BindingExpired")));
    assert_eq!(w.reasons(Kind::Pod, "waiting"), ["BindingExpired"]);
    assert_eq!(w.pod("running").and_then(|p| p.status).map(|s| s.phase), Some(PodPhase::Running));
}

/// A DaemonSet's pod belongs to its node: a rejection fails it there and an
/// unconfirmed binding leaves it bound; neither sends it to the queue, from
/// where another node could take it.
#[tokio::test]
async fn a_daemonsets_pod_stays_on_its_node() {
    let w = World::new();
    let daemon = |name: &str| {
        let mut p = bound(name, "n1");
        p.metadata.labels.insert(specs::daemonset::DAEMONSET_LABEL.into(), "ptp".into());
        p.status = Some(PodStatus { phase: PodPhase::Scheduled, node_name: Some("n1".into()), ..PodStatus::default() });
        p
    };
    w.put_pod(daemon("rejected")).await;
    w.put_pod(daemon("slow")).await;
    let n1 = Identity::Node("n1".into());
    let rejection = PodRejection { reason: "InsufficientCpu".into(), message: "no 4 free CPUs".into() };
    let (pod, node) = w.run(move |t| pods::reject(t, &n1, "rejected", &rejection)).await.expect("reject");
    assert_eq!((node.as_str(), pod.spec.node_name.as_deref()), ("n1", Some("n1")));
    let s = pod.status.expect("status");
    assert_eq!((s.phase, s.reason.as_deref()), (PodPhase::Failed, Some("Rejected")));
    assert_eq!(w.reasons(Kind::Pod, "rejected"), ["Rejected"]);
    let timeout = std::time::Duration::from_secs(30);
    let got = w.run(move |t| pods::expire_binding(t, "slow", "n1", timeout)).await.expect("expire");
    assert!(got.is_none(), "a daemonset's binding does not expire into the queue");
    let p = w.pod("slow").expect("pod");
    assert_eq!((p.spec.node_name.as_deref(), p.status.map(|s| s.phase)), (Some("n1"), Some(PodPhase::Scheduled)));
}

#[test]
fn picking_a_container() {
    let one = pod("p");
    let mut two = pod("q");
    let mut side = two.spec.containers[0].clone();
    side.name = "side".into();
    two.spec.containers.push(side);
    let table: Vec<(&Pod, Option<&str>, Result<&str, &str>)> = vec![
        (&one, None, Ok("main")),
        (&one, Some("main"), Ok("main")),
        (&one, Some("x"), Err("container: pod \"p\" has no container \"x\" (it has: main)")),
        (&two, None, Err("container: pod \"q\" has 2 containers: name one (main, side)")),
        (&two, Some("side"), Ok("side")),
    ];
    for (p, asked, want) in table {
        let got = pods::pick_container(p, asked.map(str::to_string)).map_err(|e| e.to_string());
        assert_eq!(got.as_deref().map_err(String::as_str), want, "{asked:?}");
    }
}

/// A join as the API makes it: `token` is `(id, secret)`, `record` the
/// node's join record (64 hex digits from one letter, as `new_join_attempt`
/// makes them long), a fresh incarnation each call.
async fn join(
    w: &World,
    name: &'static str,
    token: Option<(Option<&'static str>, &'static str)>,
    record: char,
) -> Result<nodes::Joined, ClusterError> {
    let proof = nodes::JoinProof {
        token: token.map(|(id, secret)| (id.map(str::to_string), pinion_wire::tls::sha256_hex(secret.as_bytes()))),
        attempt: record.to_string().repeat(64),
        new_incarnation: super::new_uid()?,
    };
    w.store.write(move |t| nodes::join(t, name, &proof, chrono::Utc::now())).await
}

fn token(id: &str, secret: &str, ttl: Option<u64>, uses: Option<u32>) -> tokens::NewToken {
    tokens::NewToken {
        id: id.into(),
        secret_sha256: pinion_wire::tls::sha256_hex(secret.as_bytes()),
        ttl: ttl.map(std::time::Duration::from_secs),
        uses,
        description: String::new(),
    }
}

#[tokio::test]
async fn one_join_per_name_and_a_join_record_that_joins_again() {
    let w = World::new();
    let now = chrono::Utc::now();
    w.run(move |t| {
        tokens::ensure_bootstrap(
            t,
            &pinion_wire::tls::sha256_hex(b"boot"),
            Some(std::time::Duration::from_secs(3600)),
            now,
        )
    })
    .await
    .expect("bootstrap token");
    let boot = Some((None, "boot"));
    let first = join(&w, "n1", boot, 'a').await.expect("first");
    assert_eq!(first.claim, Claim::New);
    assert_eq!(nodes::incarnation(&w.store, "n1").expect("read"), Some(first.incarnation.clone()));
    // The same record again (its reply was lost, or its certificate expired
    // while it was cut off) needs no token, registered or not.
    let again = join(&w, "n1", None, 'a').await.expect("retry");
    assert_eq!(again, nodes::Joined { claim: Claim::Again, incarnation: first.incarnation.clone() });
    w.run(|t| register(t, &nodes::joined_only("n1"))).await.expect("register");
    assert_eq!(join(&w, "n1", None, 'a').await.expect("registered").incarnation, first.incarnation);
    // Another record is another machine: a token lets it in, not under a held name.
    let e = join(&w, "n1", boot, 'b').await.expect_err("another record");
    assert!(matches!(&e, ClusterError::Conflict(m) if m.contains("has already joined")), "{e}");
    let e = join(&w, "n1", None, 'b').await.expect_err("no token");
    assert!(matches!(&e, ClusterError::Unauthorized(m) if m.contains("needs a join token")), "{e}");
    // A node registered before claims existed has no claim and is still taken.
    w.run(|t| register(t, &nodes::joined_only("old"))).await.expect("register");
    assert!(join(&w, "old", boot, 'c').await.is_err());
    assert_eq!(nodes::incarnation(&w.store, "old").expect("read"), None);
    // Deleted: the record alone no longer joins, and a join with a token,
    // even with the same record, is a new incarnation.
    w.run(|t| nodes::delete(t, "n1")).await.expect("delete");
    assert_eq!(nodes::incarnation(&w.store, "n1").expect("read"), None);
    assert!(matches!(join(&w, "n1", None, 'a').await, Err(ClusterError::Unauthorized(_))));
    let reborn = join(&w, "n1", boot, 'a').await.expect("joined again");
    assert_eq!(reborn.claim, Claim::New);
    assert_ne!(reborn.incarnation, first.incarnation);
    // A short record never stands in for a token.
    let short = nodes::JoinProof { token: None, attempt: "a".into(), new_incarnation: "x".into() };
    let e = w.store.write(move |t| nodes::join(t, "n1", &short, chrono::Utc::now())).await.expect_err("short");
    assert!(matches!(e, ClusterError::Unauthorized(_)), "{e}");
}

#[tokio::test]
async fn join_tokens_expire_run_out_and_are_revoked() {
    let w = World::new();
    let now = chrono::Utc::now();
    for t in [
        token("once", "s1", Some(3600), Some(1)),
        token("old", "s2", Some(1), None),
        token("gone", "s3", None, None),
        token("many", "s4", None, None),
    ] {
        // "old" was made two seconds ago and lived one.
        let at = if t.id == "old" { now - chrono::Duration::seconds(2) } else { now };
        w.run(move |txn| tokens::create(txn, &t, at)).await.expect("create");
    }
    w.run(move |t| tokens::revoke(t, "gone", now)).await.expect("revoke");
    let check = |e: Result<nodes::Joined, ClusterError>, needle: &str| match e {
        Err(ClusterError::Unauthorized(m)) => assert!(m.contains(needle), "{m} (wanted {needle:?})"),
        other => panic!("{other:?}, wanted a refusal with {needle:?}"),
    };
    check(join(&w, "x", Some((Some("old"), "s2")), 'x').await, "expired at");
    check(join(&w, "x", Some((Some("gone"), "s3")), 'x').await, "was revoked");
    check(join(&w, "x", Some((Some("many"), "nope")), 'x').await, "not valid");
    check(join(&w, "x", Some((Some("nobody"), "s4")), 'x').await, "not valid");
    // No bootstrap record: a token without an id admits nothing.
    check(join(&w, "x", Some((None, "s4")), 'x').await, "not valid");
    // A join refused for its name spends no use.
    join(&w, "n1", Some((Some("many"), "s4")), 'a').await.expect("n1");
    assert!(matches!(join(&w, "n1", Some((Some("once"), "s1")), 'b').await, Err(ClusterError::Conflict(_))));
    join(&w, "n2", Some((Some("once"), "s1")), 'c').await.expect("the single use");
    check(join(&w, "n3", Some((Some("once"), "s1")), 'd').await, "no uses left");
    // A restart keeps a revoked bootstrap record revoked.
    let digest = pinion_wire::tls::sha256_hex(b"boot");
    let d = digest.clone();
    w.run(move |t| tokens::ensure_bootstrap(t, &d, None, now)).await.expect("made");
    w.run(move |t| tokens::revoke(t, tokens::BOOTSTRAP, now)).await.expect("revoke");
    let (again, made) = w.run(move |t| tokens::ensure_bootstrap(t, &digest, None, now)).await.expect("kept");
    assert!(!made && again.spec.revoked.is_some());
    check(join(&w, "n4", Some((None, "boot")), 'e').await, "was revoked");
}

#[tokio::test]
async fn registering_and_deleting_a_node() {
    let w = World::new();
    let (new, first) = w.run(|t| register(t, &nodes::joined_only("n1"))).await.expect("register");
    assert!(new);
    let mut again = nodes::joined_only("n1");
    again.metadata.labels.insert("zone".into(), "a".into());
    let (new, second) = w.run(move |t| register(t, &again)).await.expect("register again");
    assert!(!new);
    assert_eq!(second.metadata.creation_timestamp, first.metadata.creation_timestamp);
    assert_eq!(second.metadata.labels.get("zone").map(String::as_str), Some("a"));
    assert_eq!(w.reasons(Kind::Node, "n1"), ["Registered", "Registered"]);

    assert!(matches!(w.run(|t| nodes::delete(t, "n1")).await, Ok(nodes::Deleted::Node(_))));
    // Joined (the name claimed) but never registered: only the name goes.
    join(&w, "n2", Some((Some("t"), "s")), 'a').await.expect_err("no such token");
    w.run(|t| tokens::create(t, &token("t", "s", None, None), chrono::Utc::now())).await.expect("token");
    join(&w, "n2", Some((Some("t"), "s")), 'a').await.expect("claim");
    assert!(matches!(w.run(|t| nodes::delete(t, "n2")).await, Ok(nodes::Deleted::NameOnly)));
    let e = w.run(|t| nodes::delete(t, "n2")).await.expect_err("gone");
    assert_eq!(e.to_string(), "node \"n2\" not found");
}

/// Pod ranges: the lowest free one at a first registration, kept at the
/// next, freed by a delete; a client's own value is ignored; one of other
/// flags is replaced, with a warning; none left is a refusal naming the flags.
#[tokio::test]
async fn each_node_gets_a_pod_range_of_its_own() {
    let w = World::new();
    // A /28 cut into /30s: four nodes at most.
    let ranges = specs::net::PodRanges::parse("10.213.0.0/28", 30).expect("ranges");
    let reg = |name: &str, sent: Option<&str>| {
        let mut node = nodes::joined_only(name);
        node.spec.pod_cidr = sent.map(str::to_string);
        w.run(move |t| nodes::register(t, &node, &ranges).map(|(_, n)| n.spec.pod_cidr.unwrap_or_default()))
    };
    // (node, podCIDR it sends, range it gets)
    let steps = [
        ("a", None, "10.213.0.0/30"),
        ("b", Some("10.213.0.0/30"), "10.213.0.4/30"),
        ("a", Some("192.0.2.0/24"), "10.213.0.0/30"),
        ("c", None, "10.213.0.8/30"),
        ("d", None, "10.213.0.12/30"),
    ];
    for (name, sent, want) in steps {
        assert_eq!(reg(name, sent).await.expect("register"), want, "{name} sending {sent:?}");
    }
    let e = reg("e", None).await.expect_err("no range left");
    assert!(matches!(e, ClusterError::PodRangesExhausted(_)), "{e:?}");
    assert_eq!(
        e.to_string(),
        "no free /30 pod range is left in the cluster range 10.213.0.0/28 (4 nodes hold one): delete a node that is gone, or run the servers with a larger --pod-cidr or a longer --node-cidr-mask-size"
    );
    w.run(|t| nodes::delete(t, "b")).await.expect("delete b");
    assert_eq!(reg("e", None).await.expect("register e"), "10.213.0.4/30", "b's range is free again");
    // Under other flags, a node's range that is not one of theirs is replaced.
    let wider = specs::net::PodRanges::parse("10.213.0.0/27", 29).expect("ranges");
    let node = nodes::joined_only("a");
    let (_, a) = w.run(move |t| nodes::register(t, &node, &wider)).await.expect("register a again");
    assert_eq!(a.spec.pod_cidr.as_deref(), Some("10.213.0.16/29"), "past the /30s the others hold");
    assert_eq!(w.reasons(Kind::Node, "a").last().map(String::as_str), Some("PodCIDRChanged"));
}

#[tokio::test]
async fn a_nodes_report_confirms_what_it_admitted() {
    let w = World::new();
    w.run(|t| register(t, &nodes::joined_only("n1"))).await.expect("register");
    let scheduled = |name: &str, node: &str, uid: &str| {
        let mut p = bound(name, node);
        p.metadata.uid = Some(uid.into());
        p.status = Some(status(PodPhase::Scheduled));
        p
    };
    for p in [
        scheduled("starting", "n1", "u"),
        scheduled("running", "n1", "u"),
        scheduled("done", "n1", "u"),
        scheduled("elsewhere", "n2", "u"),
        scheduled("replaced", "n1", "new"),
    ] {
        w.put_pod(p).await;
    }
    let mut report = NodeStatusReport::default();
    for (name, phase, uid) in [
        ("starting", PodPhase::Scheduled, "u"),
        ("running", PodPhase::Running, "u"),
        ("done", PodPhase::Succeeded, "u"),
        ("elsewhere", PodPhase::Running, "u"),
        ("replaced", PodPhase::Running, "old"),
        ("unknown", PodPhase::Running, "u"),
    ] {
        report.pods.insert(name.into(), PodStatus { pod_uid: Some(uid.into()), ..status(phase) });
    }
    let r = w.run(move |t| nodes::report(t, "n1", &report)).await.expect("report");
    assert_eq!(r.confirmed, ["done", "running"]);
    assert_eq!(r.finished.iter().map(|p| p.metadata.name.as_str()).collect::<Vec<_>>(), ["done"]);
    let phase = |n: &str| w.pod(n).and_then(|p| p.status).map(|s| s.phase);
    assert_eq!(phase("running"), Some(PodPhase::Running));
    // Bound elsewhere, or about an earlier pod of the name: left alone.
    assert_eq!(phase("elsewhere"), Some(PodPhase::Scheduled));
    assert_eq!(phase("replaced"), Some(PodPhase::Scheduled));

    let e = w.run(|t| nodes::report(t, "n9", &NodeStatusReport::default())).await.expect_err("unknown node");
    assert!(matches!(e, ClusterError::NotFound { kind: "Node", .. }));
}

#[tokio::test]
async fn a_misfit_an_incomplete_tuning_or_a_failed_pull_is_one_event_per_finding() {
    // (reason reported, event reason)
    for (reason, event) in [
        (specs::engine::SETTINGS_MISFIT, specs::engine::SETTINGS_MISFIT),
        (specs::status::TUNING_INCOMPLETE, specs::status::TUNING_INCOMPLETE),
        ("ErrImagePull", "Failed"),
    ] {
        let w = World::new();
        w.run(|t| register(t, &nodes::joined_only("n1"))).await.expect("register");
        let mut p = bound("p", "n1");
        p.status = Some(status(PodPhase::Running));
        w.put_pod(p).await;
        let said = |message: &str| {
            let mut r = NodeStatusReport::default();
            let s =
                PodStatus { reason: Some(reason.into()), message: Some(message.into()), ..status(PodPhase::Running) };
            r.pods.insert("p".into(), s);
            r
        };
        for message in ["first words", "first words", "other words"] {
            let r = said(message);
            w.run(move |t| nodes::report(t, "n1", &r)).await.expect("report");
        }
        let events = w.reasons(Kind::Pod, "p").into_iter().filter(|r| r == event).count();
        assert_eq!(events, 2, "{reason}");
    }
}

/// A finished pod keeps the address it ran with (its network is gone when
/// the node reports the end); a running pod's report is taken as it is.
#[tokio::test]
async fn a_finished_pod_keeps_its_address() {
    let w = World::new();
    w.run(|t| register(t, &nodes::joined_only("n1"))).await.expect("register");
    let mut p = bound("p", "n1");
    p.status = Some(status(PodPhase::Scheduled));
    w.put_pod(p).await;
    let with_ip = |phase, ip: Option<&str>| {
        let mut r = NodeStatusReport::default();
        let s = PodStatus {
            pod_ip: ip.map(str::to_string),
            pod_ips: ip.into_iter().map(str::to_string).collect(),
            ..status(phase)
        };
        r.pods.insert("p".into(), s);
        r
    };
    // (reported phase, reported address, stored address after)
    for (phase, ip, want) in [
        (PodPhase::Running, Some("10.213.0.7"), Some("10.213.0.7")),
        (PodPhase::Running, None, None),
        (PodPhase::Running, Some("10.213.0.7"), Some("10.213.0.7")),
        (PodPhase::Succeeded, None, Some("10.213.0.7")),
    ] {
        let r = with_ip(phase, ip);
        w.run(move |t| nodes::report(t, "n1", &r)).await.expect("report");
        let s = w.pod("p").and_then(|p| p.status).expect("status");
        assert_eq!(s.pod_ip.as_deref(), want, "{phase:?} {ip:?}");
        assert_eq!(s.pod_ips, want.into_iter().map(str::to_string).collect::<Vec<_>>(), "{phase:?} {ip:?}");
    }
}

/// A node's conditions are its report's, and each new one is one event.
#[tokio::test]
async fn a_nodes_conditions_are_its_last_reports() {
    let w = World::new();
    w.run(|t| register(t, &nodes::joined_only("n1"))).await.expect("register");
    let down = specs::api::Condition {
        kind: specs::api::POD_NETWORK.into(),
        status: specs::api::ConditionStatus::False,
        reason: "CNIPluginMissing".into(),
        message: "CNI plugin \"bridge\" not found in /usr/lib/cni".into(),
        fix: Some("apt-get install containernetworking-plugins".into()),
    };
    for (conditions, want_events) in [(vec![down.clone()], 1), (vec![down.clone()], 1), (vec![], 1)] {
        let r = NodeStatusReport { conditions: conditions.clone(), ..NodeStatusReport::default() };
        let node = w.run(move |t| nodes::report(t, "n1", &r)).await.expect("report").node;
        assert_eq!(node.status.conditions, conditions);
        let events = w.reasons(Kind::Node, "n1").into_iter().filter(|r| r == "CNIPluginMissing").count();
        assert_eq!(events, want_events);
    }
}

#[tokio::test]
async fn a_lost_node_and_its_pods() {
    let w = World::new();
    w.run(|t| register(t, &nodes::joined_only("n1"))).await.expect("register");
    let with = |name: &str, node: &str, phase| {
        let mut p = bound(name, node);
        let mut s = status(phase);
        s.conditions = vec![specs::status::PodCondition {
            kind: specs::status::POD_READY.into(),
            status: specs::api::ConditionStatus::True,
            last_transition_time: Some(1),
        }];
        p.status = Some(s);
        p
    };
    for p in [
        with("running", "n1", PodPhase::Running),
        with("done", "n1", PodPhase::Succeeded),
        with("moved", "n2", PodPhase::Running),
    ] {
        w.put_pod(p).await;
    }
    let names: Vec<String> = ["running", "done", "moved", "gone"].map(String::from).to_vec();
    let grace = std::time::Duration::from_secs(40);
    let node = w.run(move |t| nodes::mark_lost(t, "n1", &names, grace, 1_000)).await.expect("lost").expect("node");
    assert_eq!(node.status.condition, specs::api::NodeCondition::NotReady);
    assert_eq!(node.status.not_ready_since, Some(1_000), "kept in the store");
    let phase = |n: &str| w.pod(n).and_then(|p| p.status).map(|s| s.phase);
    // (pod, phase after): only the unfinished pod still bound to the node is Unknown.
    for (name, want) in [("running", PodPhase::Unknown), ("done", PodPhase::Succeeded), ("moved", PodPhase::Running)] {
        assert_eq!(phase(name), Some(want), "{name}");
    }
    assert_eq!(w.reasons(Kind::Pod, "running"), ["NodeLost"]);
    // Unknown is not Ready: a rollout stops counting it as available.
    let ready = |n: &str| w.pod(n).and_then(|p| p.status).and_then(|s| s.ready_since());
    assert_eq!((ready("running"), ready("moved")), (None, Some(1)));
    assert_eq!(w.reasons(Kind::Node, "n1"), ["Registered", "NodeNotReady"]);

    let node = w.run(|t| nodes::mark_ready(t, "n1")).await.expect("ready").expect("node");
    assert_eq!(node.status.condition, specs::api::NodeCondition::Ready);
    assert_eq!(node.status.not_ready_since, None);
    assert_eq!(w.reasons(Kind::Node, "n1"), ["Registered", "NodeNotReady", "NodeReady"]);
    assert!(w.run(|t| nodes::mark_ready(t, "n9")).await.expect("unknown").is_none());
}

#[tokio::test]
async fn creating_a_job() {
    let w = World::new();
    let c = w.run(|t| jobs::create(t, &job("j", 2), "uj", None)).await.expect("create");
    assert!(c.new);
    let members = |w: &World| w.store.list::<Pod>().expect("list").items.len();
    assert_eq!(members(&w), 2);
    let again = w.run(|t| jobs::create(t, &job("j", 2), "uj2", None)).await.expect("repeat");
    assert!(!again.new);
    assert_eq!(again.job.metadata.uid.as_deref(), Some("uj"));
    assert_eq!(members(&w), 2);
    let e = w.run(|t| jobs::create(t, &job("j", 3), "uj3", None)).await.expect_err("conflict");
    assert!(e.to_string().contains("has not ended"), "{e}");
    let e = w.run(|t| jobs::create(t, &job("k", 2), "uk", Some("no gang of 2 fits"))).await.expect_err("never");
    assert!(matches!(e, ClusterError::Unschedulable(_)));
    assert!(w.store.get::<Job>("k").expect("get").is_none());
}

/// `name`, of `owner`, `members` of 2 CPUs each.
fn owned_job(name: &str, owner: &str, members: u32) -> Job {
    let mut j = job(name, members);
    j.metadata.owner = Some(owner.into());
    j.metadata.labels.insert(specs::batch::ACCOUNT_LABEL.into(), "physics".into());
    let two = specs::Quantity::parse("2").expect("2");
    j.spec.template.spec.containers[0].resources.requests.insert("cpu".into(), two);
    j
}

fn member_priority(w: &World, name: &str) -> (i32, Option<i64>) {
    let g = specs::job::Gang::of(&w.pod(name).expect("member")).expect("a gang");
    (g.priority, g.eligible)
}

#[tokio::test]
async fn a_finished_job_is_charged_to_its_user_and_account_whose_next_job_goes_behind() {
    use specs::fairshare::{Holder, Usage};
    let w = World::new();
    let j = owned_job("j", "alice", 2);
    w.run(move |t| jobs::create(t, &j, "uj", None)).await.expect("create");
    // A newcomer's fair share is whole (no nodes: no size factor).
    let (priority, eligible) = member_priority(&w, "j-0");
    assert!(priority == 10_000 && eligible.is_some(), "{priority} {eligible:?}");
    w.run(|t| jobs::mark_running(t, "j")).await.expect("running");
    // Started 100 s ago; both members succeed.
    let started = (chrono::Utc::now() - chrono::Duration::seconds(100)).to_rfc3339();
    w.run(move |t| {
        let mut j = t.get::<Job>("j")?.expect("job");
        j.status.get_or_insert_with(Default::default).start_time = Some(started.clone());
        t.put(&mut j)?;
        Ok(())
    })
    .await
    .expect("started");
    for m in ["j-0", "j-1"] {
        let mut p = w.pod(m).expect("member");
        p.status = Some(status(PodPhase::Succeeded));
        w.put_pod(p).await;
    }
    w.run(|t| jobs::reconcile(t, "j", false)).await.expect("judged");
    assert_eq!(
        w.store.get::<Job>("j").expect("get").and_then(|j| j.status).map(|s| s.phase),
        Some(JobPhase::Succeeded)
    );
    // 2 members of 2 CPUs for 100 s, to alice and to her account.
    for holder in [Holder::User("alice"), Holder::Account("physics")] {
        let u = w.store.get::<Usage>(&holder.record()).expect("get").expect("a usage record");
        assert!((399.0..=402.0).contains(&u.usage.cpu_seconds), "{holder:?}: {u:?}");
    }
    // Judged again: charged once.
    w.run(|t| jobs::reconcile(t, "j", false)).await.expect("again");
    let u = w.store.get::<Usage>("user.alice").expect("get").expect("record");
    assert!(u.usage.cpu_seconds < 403.0, "{u:?}");

    // Her next job goes behind bob's, he has used nothing.
    let (a, b) = (owned_job("a", "alice", 1), owned_job("b", "bob", 1));
    w.run(move |t| jobs::create(t, &a, "ua", None)).await.expect("a");
    w.run(move |t| jobs::create(t, &b, "ub", None)).await.expect("b");
    let (alice, bob) = (member_priority(&w, "a-0").0, member_priority(&w, "b-0").0);
    assert!(alice < bob, "alice {alice}, bob {bob}");
    // A cancelled running job is charged too.
    w.run(|t| jobs::mark_running(t, "b")).await.expect("running");
    w.run(|t| jobs::delete(t, "b")).await.expect("cancel");
    assert!(w.store.get::<Usage>("user.bob").expect("get").is_some());
}

#[tokio::test]
async fn a_singleton_waits_for_the_earlier_job_of_its_name_and_owner() {
    let w = World::new();
    let named = |id: &str, owner: &str, singleton: bool| {
        let mut j = owned_job(id, owner, 1);
        j.metadata.labels.insert(specs::batch::NAME_LABEL.into(), "sim".into());
        if singleton {
            j.spec.dependency = Some("singleton".into());
        }
        j
    };
    let first = named("sim-1", "alice", false);
    w.run(move |t| jobs::create(t, &first, "u1", None)).await.expect("first");
    // Creation stamps are milliseconds: the second is later.
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    for (id, owner) in [("sim-2", "alice"), ("sim-b", "bob")] {
        let j = named(id, owner, true);
        w.run(move |t| jobs::create(t, &j, "u", None)).await.expect("a singleton");
    }
    for id in ["sim-2", "sim-b"] {
        w.run(move |t| jobs::reconcile(t, id, false)).await.expect("judged");
    }
    // alice's waits for her sim-1; bob's has no earlier sim: it starts.
    assert!(w.pod("sim-2-0").is_none(), "sim-2 waits");
    let reason = w.store.get::<Job>("sim-2").expect("get").and_then(|j| j.status).and_then(|s| s.reason);
    assert_eq!(reason.as_deref(), Some(specs::job::DEPENDENCY));
    assert!(w.pod("sim-b-0").is_some(), "bob's singleton starts");
    // sim-1 ends: sim-2 starts.
    w.run(|t| {
        let mut j = t.get::<Job>("sim-1")?.expect("sim-1");
        j.status.get_or_insert_with(Default::default).phase = JobPhase::Succeeded;
        t.put(&mut j)?;
        Ok(())
    })
    .await
    .expect("ended");
    w.run(|t| jobs::reconcile(t, "sim-2", false)).await.expect("judged again");
    assert!(w.pod("sim-2-0").is_some(), "sim-2 starts once sim-1 ended");
}

#[test]
fn a_store_fault_is_the_servers_and_a_refusal_is_the_objects() {
    let full = ClusterError::Store(crate::store::StoreError::DiskFull { dir: "/d".into(), available: 0, needed: 1 });
    for (e, server) in [
        (full, true),
        (ClusterError::NotLeader, true),
        (ClusterError::Internal("x".into()), true),
        (ClusterError::not_found("Pod", "p"), false),
        (ClusterError::Conflict("already bound".into()), false),
        (ClusterError::Forbidden("no".into()), false),
    ] {
        assert_eq!(e.is_server_fault(), server, "{e}");
    }
}

#[tokio::test]
async fn binding_a_pod_the_scheduler_placed() {
    let w = World::new();
    let mut p = pod("p");
    p.metadata.uid = Some("u1".into());
    w.put_pod(p).await;
    w.put_pod(bound("taken", "n2")).await;
    let b = crate::scheduler::Binding { node: "n1".into(), epoch: 7, placement: Default::default() };
    let uid = |s: &str| Some(s.to_string());
    // (pod, uid the decision saw, refused as)
    let refusals = [("gone", uid("u1"), "404"), ("p", uid("u0"), "409"), ("taken", None, "409")];
    for (name, seen, want) in refusals {
        let b = b.clone();
        let r = w.run(move |t| pods::bind(t, name, &seen, &b, None)).await;
        let got = match r {
            Err(ClusterError::NotFound { .. }) => "404",
            Err(ClusterError::Conflict(_)) => "409",
            _ => "other",
        };
        assert_eq!(got, want, "{name}");
    }
    let place = pods::GangPlace { local_rank: 1, nodes: "10.0.0.1,10.0.0.1".into() };
    let b2 = b.clone();
    w.run(move |t| pods::bind(t, "p", &uid("u1"), &b2, Some(&place))).await.expect("bind");
    let p = w.pod("p").expect("pod");
    let s = p.status.clone().expect("status");
    assert_eq!((p.spec.node_name.as_deref(), s.phase, s.attempts), (Some("n1"), PodPhase::Scheduled, 1));
    assert_eq!(s.plan.map(|plan| plan.epoch), Some(7));
    let env: Vec<(String, String)> =
        p.spec.containers[0].env.iter().map(|e| (e.name.clone(), e.value.clone())).collect();
    assert!(env.contains(&("PINION_LOCAL_RANK".into(), "1".into())), "{env:?}");
    assert!(env.contains(&("PINION_NODES".into(), "10.0.0.1,10.0.0.1".into())), "{env:?}");
    assert_eq!(w.reasons(Kind::Pod, "p"), ["Scheduled"]);
}

#[tokio::test]
async fn a_waiting_pod_says_why_once_per_reason() {
    let w = World::new();
    w.put_pod(pod("p")).await;
    w.put_pod(bound("b", "n1")).await;
    let why = |reason: &'static str, message: &str| pods::Waiting {
        reason,
        event_type: "Warning",
        event_reason: "FailedScheduling",
        message: message.into(),
    };
    // (pod, why, written?)
    let table = [
        ("p", why("Unschedulable", "no CPUs"), true),
        ("p", why("Unschedulable", "no CPUs"), false),
        ("p", why("Unschedulable", "no memory"), true),
        ("p", why("ArrayThrottled", "no memory"), true),
        ("b", why("Unschedulable", "no CPUs"), false),
        ("gone", why("Unschedulable", "no CPUs"), false),
    ];
    for (name, why, written) in table {
        let said = why.clone();
        let got = w.run(move |t| pods::say_waiting(t, name, &said)).await.expect("say");
        assert_eq!(got, written, "{name}: {why:?}");
    }
    let s = w.pod("p").and_then(|p| p.status).expect("status");
    assert_eq!(
        (s.phase, s.reason.as_deref(), s.message.as_deref()),
        (PodPhase::Pending, Some("ArrayThrottled"), Some("no memory"))
    );
    assert_eq!(w.reasons(Kind::Pod, "p").len(), 3);
}

#[tokio::test]
async fn a_finished_pod_is_removed_after_its_ttl_only_if_it_is_that_pod() {
    let w = World::new();
    let with = |name: &str, uid: &str, phase| {
        let mut p = pod(name);
        p.metadata.uid = Some(uid.into());
        p.status = Some(status(phase));
        p
    };
    w.put_pod(with("done", "u1", PodPhase::Succeeded)).await;
    w.put_pod(with("again", "u2", PodPhase::Running)).await;
    // (pod, uid the timer was set for, removed?)
    for (name, uid, removed) in
        [("done", "u0", false), ("again", "u2", false), ("gone", "u3", false), ("done", "u1", true)]
    {
        let got = w.run(move |t| pods::remove_finished(t, name, uid)).await.expect("remove");
        assert_eq!(got.is_some(), removed, "{name}/{uid}");
    }
    assert!(w.pod("done").is_none());
    assert!(w.pod("again").is_some());
}

/// A job with a dependency is stored without members (reason Dependency);
/// each reconcile decides again from the jobs it names: members made in the
/// write that finds it met, the job ended DependencyNeverSatisfied when it
/// can never be. Held, a pending job loses its members until released;
/// only its owner or an admin may hold it, and never once it started.
#[tokio::test]
async fn a_dependency_and_a_hold_keep_a_job_memberless() {
    let w = World::new();
    let with_dep = |name: &str, dep: &str| {
        let mut j = job(name, 1);
        j.spec.dependency = Some(dep.into());
        j
    };
    let members = |w: &World, job: &str| {
        w.store
            .list::<Pod>()
            .expect("list")
            .items
            .iter()
            .filter(|p| p.metadata.name.starts_with(&format!("{job}-")))
            .count()
    };
    let phase_reason = |w: &World, job: &str| {
        let s = w.store.get::<Job>(job).expect("get").expect("job").status.unwrap_or_default();
        (s.phase, s.reason)
    };
    let (first, ok, notok) = (job("first", 1), with_dep("ok", "afterok:first"), with_dep("notok", "afternotok:first"));
    for (j, uid) in [(first, "u1"), (ok, "u2"), (notok, "u3")] {
        w.run(move |t| jobs::create(t, &j, uid, None)).await.expect("create");
    }
    assert_eq!((members(&w, "first"), members(&w, "ok"), members(&w, "notok")), (1, 0, 0));
    let waiting = (specs::job::JobPhase::Pending, Some(specs::job::DEPENDENCY.to_string()));
    assert_eq!(phase_reason(&w, "ok"), waiting);
    // Nothing to decide yet: nothing written.
    w.run(|t| jobs::reconcile(t, "ok", false)).await.expect("reconcile");
    assert_eq!((phase_reason(&w, "ok"), members(&w, "ok")), (waiting.clone(), 0));
    // first succeeds: ok's members are made, notok can never run.
    w.put_pod({
        let mut p = w.pod("first-0").expect("member");
        p.status = Some(status(PodPhase::Succeeded));
        p
    })
    .await;
    w.run(|t| jobs::reconcile(t, "first", false)).await.expect("judge first");
    assert_eq!(phase_reason(&w, "first").0, specs::job::JobPhase::Succeeded);
    w.run(|t| jobs::reconcile(t, "ok", false)).await.expect("ok met");
    w.run(|t| jobs::reconcile(t, "notok", false)).await.expect("notok never");
    assert_eq!((phase_reason(&w, "ok"), members(&w, "ok")), ((specs::job::JobPhase::Pending, None), 1));
    assert_eq!(
        phase_reason(&w, "notok"),
        (specs::job::JobPhase::Failed, Some(specs::job::DEPENDENCY_NEVER_SATISFIED.to_string()))
    );
    assert_eq!(w.reasons(Kind::Job, "notok"), [specs::job::DEPENDENCY_NEVER_SATISFIED]);

    // Hold and release, by whom.
    let (alice, bob) = (person("alice", specs::api::Role::User), person("bob", specs::api::Role::User));
    let mut mine = job("mine", 2);
    mine.metadata.owner = Some("alice".into());
    w.run(move |t| jobs::create(t, &mine, "u4", None)).await.expect("create");
    let e = w.run(move |t| jobs::hold_for(t, &bob, "mine", true)).await.expect_err("not his");
    assert_eq!(kind_of(&Err(e)), "404");
    let a = alice.clone();
    let held = w.run(move |t| jobs::hold_for(t, &a, "mine", true)).await.expect("hold");
    assert_eq!(held.status.and_then(|s| s.reason).as_deref(), Some(specs::job::HELD));
    assert_eq!(members(&w, "mine"), 0);
    w.run(|t| jobs::reconcile(t, "mine", false)).await.expect("reconcile");
    assert_eq!(phase_reason(&w, "mine"), (specs::job::JobPhase::Pending, Some(specs::job::HELD.to_string())));
    let a = alice.clone();
    w.run(move |t| jobs::hold_for(t, &a, "mine", false)).await.expect("release");
    assert_eq!((phase_reason(&w, "mine"), members(&w, "mine")), ((specs::job::JobPhase::Pending, None), 2));
    let a = alice.clone();
    let e = w.run(move |t| jobs::hold_for(t, &a, "mine", false)).await.expect_err("not held");
    assert!(e.to_string().contains("is not held"), "{e}");
    // Placed: too late to hold.
    w.put_pod({
        let mut p = w.pod("mine-0").expect("member");
        p.spec.node_name = Some("n1".into());
        p
    })
    .await;
    let e = w.run(move |t| jobs::hold_for(t, &alice, "mine", true)).await.expect_err("started");
    assert!(e.to_string().contains("only a pending job can be held"), "{e}");
}

#[test]
fn a_container_started_or_restarted_since_the_last_report_is_named_once() {
    use specs::status::{ContainerState, ContainerStatus};
    let with = |ctrs: &[(&str, ContainerState, u32)]| PodStatus {
        container_statuses: ctrs
            .iter()
            .map(|(n, s, r)| ContainerStatus {
                name: n.to_string(),
                state: *s,
                restart_count: *r,
                ..Default::default()
            })
            .collect(),
        ..status(PodPhase::Running)
    };
    let (w, r) = (ContainerState::Waiting, ContainerState::Running);
    let table: &[(Option<PodStatus>, PodStatus, &[&str])] = &[
        (None, with(&[("main", r, 0)]), &["main"]),
        (Some(with(&[("main", w, 0)])), with(&[("main", r, 0), ("side", w, 0)]), &["main"]),
        // The same report again: nothing new.
        (Some(with(&[("main", r, 0)])), with(&[("main", r, 0)]), &[]),
        // Restarted between two reports: started again.
        (Some(with(&[("main", r, 0)])), with(&[("main", r, 1)]), &["main"]),
        (Some(with(&[("main", r, 0)])), with(&[("main", w, 1)]), &[]),
    ];
    for (before, now, want) in table {
        assert_eq!(pods::newly_started(before.as_ref(), Some(now)), *want, "{before:?} -> {now:?}");
    }
}

/// The cluster's CPUs (a job's size against it is part of its priority)
/// come from the counts kept with each registration, and from the nodes'
/// topologies while any node has no count (registered before counts were
/// kept).
#[tokio::test]
async fn the_cluster_cpus_follow_registrations_and_deletes() {
    let w = World::new();
    let with_cpus = |name: &str, cores: u32| {
        let mut n = nodes::joined_only(name);
        n.spec.topology = crate::scheduler::tests::machine(&[cores]);
        n
    };
    let cpus = |w: &World| {
        let store = w.store.clone();
        async move { store.write(|t| nodes::cluster_cpus(t)).await.expect("counted") }
    };
    let (a, b) = (with_cpus("a", 4), with_cpus("b", 8));
    w.run(move |t| register(t, &a)).await.expect("a");
    w.run(move |t| register(t, &b)).await.expect("b");
    assert_eq!(cpus(&w).await, 12);
    // Registering again with another machine replaces its count.
    let bigger = with_cpus("a", 6);
    w.run(move |t| register(t, &bigger)).await.expect("a again");
    assert_eq!(cpus(&w).await, 14);
    // A node stored without a count is still counted, from its topology.
    let mut old = with_cpus("old", 2);
    w.run(move |t| Ok(t.put(&mut old)?)).await.expect("old");
    assert_eq!(cpus(&w).await, 16);
    w.run(|t| nodes::delete(t, "old")).await.expect("delete old");
    w.run(|t| nodes::delete(t, "b")).await.expect("delete b");
    assert_eq!(cpus(&w).await, 6);
}

/// Node `n1` reports member or pod `name` in `phase`, its one container
/// with `code` and `usage`.
async fn report_ended(w: &World, name: &str, phase: PodPhase, code: i32, usage: (u64, u64)) {
    let uid = w.pod(name).and_then(|p| p.metadata.uid);
    let ctr = specs::status::ContainerStatus {
        name: "main".into(),
        last_exit_code: Some(code),
        usage: Some(specs::status::ContainerUsage {
            cpu_nanos: Some(usage.0),
            max_rss_bytes: Some(usage.1),
            missing: None,
        }),
        ..Default::default()
    };
    let n = name.to_string();
    for s in [
        PodStatus { pod_uid: uid.clone(), ..status(PodPhase::Running) },
        PodStatus { pod_uid: uid.clone(), container_statuses: vec![ctr.clone()], ..status(phase) },
    ] {
        let n = n.clone();
        w.run(move |t| pods::report_status(t, &Identity::Node("n1".into()), &n, &s)).await.expect("reported");
    }
}

async fn bind_to_n1(w: &World, name: &str) {
    let mut p = w.pod(name).expect("pod");
    p.spec.node_name = Some("n1".into());
    w.put_pod(p).await;
}

fn records(w: &World) -> Vec<specs::acct::Record> {
    let mut r = w.store.list::<specs::acct::Record>().expect("list").items;
    r.sort_by(|a, b| a.job_id.cmp(&b.job_id));
    r
}

#[tokio::test]
async fn a_finished_job_writes_its_records_in_its_last_write_and_they_outlive_its_pods() {
    use specs::acct::State;
    let w = World::new();
    let j = owned_job("j", "alice", 2);
    w.run(move |t| jobs::create(t, &j, "uj", None)).await.expect("create");
    w.run(|t| jobs::mark_running(t, "j")).await.expect("running");
    for (m, cpu, rss) in [("j-0", 3_000_000_000, 10 << 20), ("j-1", 1_000_000_000, 30 << 20)] {
        bind_to_n1(&w, m).await;
        report_ended(&w, m, PodPhase::Succeeded, 0, (cpu, rss)).await;
    }
    // The members' records came with their ends; the job's with its judgement.
    assert_eq!(records(&w).len(), 2);
    w.run(|t| jobs::reconcile(t, "j", false)).await.expect("judged");
    let got = records(&w);
    type Line<'a> = (&'a str, State, Option<u64>, Option<u64>, &'a str);
    let lines: Vec<Line<'_>> =
        got.iter().map(|r| (r.job_id.as_str(), r.state, r.cpu_nanos, r.max_rss_bytes, r.user.as_str())).collect();
    assert_eq!(
        lines,
        [
            ("j", State::Completed, Some(4_000_000_000), Some(30 << 20), "alice"),
            ("j.0", State::Completed, Some(3_000_000_000), Some(10 << 20), "alice"),
            ("j.1", State::Completed, Some(1_000_000_000), Some(30 << 20), "alice"),
        ]
    );
    let job_line = &got[0];
    assert_eq!(
        (job_line.ncpus, job_line.account.as_deref(), job_line.nodes.clone()),
        (4, Some("physics"), vec!["n1".into()])
    );
    assert!(job_line.start.is_some() && got[1].start.is_some() && got[1].member == Some(0));
    // Judged again: no second record. Deleted with its pods: the records stay.
    w.run(|t| jobs::reconcile(t, "j", false)).await.expect("again");
    w.run(|t| jobs::delete(t, "j")).await.expect("deleted");
    assert!(w.pod("j-0").is_none());
    assert_eq!(records(&w).len(), 3);

    // A failed pod of its own: FAILED with its code; a cancelled one: CANCELLED.
    let mut p = owned_by(pod("one"), "bob");
    p.metadata.uid = Some("u-one".into());
    w.put_pod(p).await;
    bind_to_n1(&w, "one").await;
    report_ended(&w, "one", PodPhase::Failed, 3, (5, 6)).await;
    let mut p = owned_by(pod("two"), "bob");
    p.metadata.uid = Some("u-two".into());
    w.put_pod(p).await;
    w.run(|t| pods::delete(t, &Identity::Admin, "two")).await.expect("cancelled");
    let got = records(&w);
    let of = |id: &str| got.iter().find(|r| r.job_id == id).map(|r| (r.state, r.exit_code, r.signal, r.user.clone()));
    assert_eq!(of("one"), Some((State::Failed, 3, 0, "bob".into())));
    assert_eq!(of("two"), Some((State::Cancelled, 0, 15, "bob".into())));

    // Past the retention, pruned; within it, kept.
    let names: Vec<String> = got.iter().map(|r| r.metadata.name.clone()).collect();
    let now = chrono::Utc::now().timestamp();
    let n = names.clone();
    assert_eq!(w.run(move |t| super::acct::prune(t, &n, now, 3600)).await.expect("kept"), 0);
    assert_eq!(w.run(move |t| super::acct::prune(t, &names, now + 3602, 3600)).await.expect("pruned"), 5);
    assert!(records(&w).is_empty());
}

/// A node that finished more pods at once than one etcd transaction holds
/// (each is its status, its accounting record and its log entries) has its
/// report stored in parts: every pod ends, each with its record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_too_large_for_one_etcd_transaction_is_stored_in_parts() {
    let test = "a_report_too_large_for_one_etcd_transaction_is_stored_in_parts";
    if !crate::testing::etcd::available(test) {
        return;
    }
    let cluster = crate::testing::etcd::EtcdCluster::start(1).await.unwrap_or_else(|e| panic!("{test}: {e}"));
    let prefix = "/report-parts/";
    let client = crate::store::connect(&cluster.config(prefix)).await.expect("connect");
    let etcd = crate::store::EtcdOptions { max_txn_ops: 32, ..Default::default() };
    let store = Store::open_etcd(client, prefix, Default::default(), etcd).await.expect("open");
    store.write(|t| register(t, &nodes::joined_only("n1"))).await.expect("register");
    let names: Vec<String> = (0..12).map(|i| format!("p{i:02}")).collect();
    let mut whole = NodeStatusReport::default();
    for n in &names {
        let p = bound(n, "n1");
        let stored = store
            .write(move |t| {
                let mut p = p.clone();
                p.metadata.uid = Some(format!("uid-{}", p.metadata.name));
                t.put(&mut p)?;
                Ok::<_, ClusterError>(p)
            })
            .await
            .expect("put");
        whole.pods.insert(n.clone(), PodStatus { pod_uid: stored.metadata.uid, ..status(PodPhase::Succeeded) });
    }
    let at_once = whole.clone();
    let e = store.write(move |t| nodes::report(t, "n1", &at_once)).await.expect_err("one write is too large");
    assert!(matches!(e, ClusterError::Store(crate::store::StoreError::TooLarge { .. })), "{e}");

    let reported = nodes::report_in_writes(&store, "n1", whole).await.expect("stored in parts");
    let mut finished: Vec<String> = reported.finished.iter().map(|p| p.metadata.name.clone()).collect();
    finished.sort();
    assert_eq!(finished, names);
    for n in &names {
        let phase = store.get::<Pod>(n).expect("get").and_then(|p| p.status).map(|s| s.phase);
        assert_eq!(phase, Some(PodPhase::Succeeded), "{n}");
    }
    assert_eq!(store.list::<specs::acct::Record>().expect("records").items.len(), names.len());
}
