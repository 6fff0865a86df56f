//! Deployments through a real server on 127.0.0.1:0 with a real sled store
//! and no nodes (their pods stay Pending; `cli/tests/deployments.rs` runs
//! them on hollow nodes): the controller makes the pods, named
//! `NAME-HASH-XXXXX`, labelled and owned as the Deployment; a scale takes
//! pods away; a template change, a scale, an undo and a restart each move
//! `metadata.generation`; a delete takes the pods with it; a problem is a
//! 422 naming its field; a person sees only their own Deployments and a
//! viewer creates none.

use std::time::Duration;

use orchestrator::testing::server::TestServer;
use pinion_wire::testing::eventually;
use pinion_wire::{Client, ClientError};
use specs::api::{Role, User, UserSpec};
use specs::deployment::{Deployment, DEPLOYMENT_LABEL, TEMPLATE_HASH_LABEL};
use specs::Pod;

const SOON: Duration = Duration::from_secs(20);

fn manifest(name: &str, replicas: u32, command: &str) -> bytes::Bytes {
    bytes::Bytes::from(format!(
        "apiVersion: pinion.io/v1\nkind: Deployment\nmetadata: {{name: {name}}}\nspec:\n  replicas: {replicas}\n  selector: {{matchLabels: {{app: {name}}}}}\n  template:\n    metadata: {{labels: {{app: {name}}}}}\n    spec:\n      containers:\n      - name: main\n        rootfs: host\n        command: [sleep, \"{command}\"]\n"
    ))
}

fn code<T: std::fmt::Debug>(r: Result<T, ClientError>) -> u16 {
    match r {
        Ok(_) => 200,
        Err(ClientError::Api(e)) => e.code,
        Err(e) => panic!("expected an HTTP answer, got {e}"),
    }
}

async fn pods_of(c: &Client, name: &str) -> Vec<Pod> {
    c.list_pods(Some(&format!("{DEPLOYMENT_LABEL}={name}"))).await.expect("list pods").items
}

/// Waits until the Deployment has exactly `n` pods; returns them.
async fn has_pods(c: &Client, name: &str, n: usize) -> Vec<Pod> {
    eventually(format!("{name} has {n} pods"), SOON, || async {
        let pods = pods_of(c, name).await;
        (pods.len() == n).then_some(pods)
    })
    .await
}

fn user(name: &str, role: Role) -> User {
    User {
        api_version: "pinion.io/v1".into(),
        kind: "User".into(),
        metadata: specs::pod::ObjectMeta { name: name.into(), ..Default::default() },
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
async fn a_deployment_keeps_its_pods_scales_rolls_and_takes_them_when_deleted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = TestServer::start(dir.path(), |_| {}).await;
    let admin = &s.admin;

    let (c, d) = admin.apply_deployment(manifest("web", 3, "inf")).await.expect("create");
    assert_eq!((c, d.metadata.generation), (201, Some(1)));
    assert_eq!(d.metadata.owner.as_deref(), Some("admin"), "the server sets the owner");
    let (c, again) = admin.apply_deployment(manifest("web", 3, "inf")).await.expect("the same again");
    assert_eq!((c, again.metadata.generation), (200, Some(1)), "unchanged: the same generation");

    let pods = has_pods(admin, "web", 3).await;
    let d: Deployment = eventually("the status", SOON, || async {
        admin.get_deployment("web").await.ok().filter(|d| d.status.as_ref().is_some_and(|s| s.revision == 1))
    })
    .await;
    let hash = d.status.as_ref().map(|s| s.template_hash.clone()).expect("status");
    assert_eq!(hash.len(), specs::deployment::HASH_LEN);
    for p in &pods {
        let name = &p.metadata.name;
        let suffix = name.strip_prefix(&format!("web-{hash}-")).unwrap_or_else(|| panic!("{name}: NAME-HASH-XXXXX"));
        assert_eq!(suffix.len(), specs::deployment::SUFFIX_LEN, "{name}");
        assert_eq!(p.metadata.labels.get("app").map(String::as_str), Some("web"));
        assert_eq!(p.metadata.labels.get(TEMPLATE_HASH_LABEL), Some(&hash));
        assert_eq!(p.metadata.owner.as_deref(), Some("admin"));
        // An ordinary pod: queued for the scheduler like any other.
        assert_eq!(p.status.as_ref().map(|s| s.phase), Some(specs::PodPhase::Pending));
    }

    let scaled = admin.scale_deployment("web", 1).await.expect("scale");
    assert_eq!(scaled.metadata.generation, Some(2));
    has_pods(admin, "web", 1).await;

    // A template change: a new revision, its pods the new hash. With no
    // node nothing is ready, so the old pod (not available) goes at once.
    let (c, changed) = admin.apply_deployment(manifest("web", 1, "1000")).await.expect("change");
    assert_eq!((c, changed.metadata.generation), (200, Some(3)));
    let rolled = eventually("revision 2 alone", SOON, || async {
        let d = admin.get_deployment("web").await.ok()?;
        let s = d.status.clone()?;
        let pods = pods_of(admin, "web").await;
        let all_new = pods.len() == 1
            && pods.iter().all(|p| p.metadata.labels.get(TEMPLATE_HASH_LABEL) == Some(&s.template_hash));
        (s.revision == 2 && all_new).then_some(d)
    })
    .await;
    assert_ne!(rolled.status.as_ref().map(|s| s.template_hash.clone()), Some(hash.clone()));
    assert_eq!(rolled.status.as_ref().map(|s| s.history.len()), Some(2), "revision 1 kept for undo");

    let undone = admin.undo_deployment("web", None).await.expect("undo");
    assert_eq!(undone.metadata.generation, Some(4));
    eventually("back to the first template's hash", SOON, || async {
        let pods = pods_of(admin, "web").await;
        pods.len() == 1 && pods.iter().all(|p| p.metadata.labels.get(TEMPLATE_HASH_LABEL) == Some(&hash))
    })
    .await;
    let restarted = admin.restart_deployment("web").await.expect("restart");
    assert_eq!(restarted.metadata.generation, Some(5));

    let e = admin.scale_deployment("nothing", 2).await;
    assert_eq!(code(e), 404);

    admin.delete_deployment("web").await.expect("delete");
    has_pods(admin, "web", 0).await;
    assert_eq!(code(admin.get_deployment("web").await), 404);
    s.stop().await;
}

#[tokio::test]
async fn problems_name_their_fields() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = TestServer::start(dir.path(), |_| {}).await;
    let bad = String::from_utf8(manifest("web", 3, "inf").to_vec())
        .expect("utf-8")
        .replace("selector: {matchLabels: {app: web}}", "selector: {matchLabels: {app: other}}")
        .replace("replicas: 3", "replicas: 3\n  strategy: {type: Recreate, rollingUpdate: {maxSurge: 1}}");
    match s.admin.apply_deployment(bytes::Bytes::from(bad)).await {
        Err(ClientError::Api(e)) => {
            assert_eq!(e.code, 422);
            let fields: Vec<&str> = e.details.iter().map(|d| d.field.as_str()).collect();
            assert!(fields.contains(&"spec.selector.matchLabels"), "{fields:?}");
            assert!(fields.contains(&"spec.strategy.rollingUpdate"), "{fields:?}");
        }
        other => panic!("expected a 422, got {other:?}"),
    }
    let e = s.admin.scale_deployment("web", specs::limits::MAX_REPLICAS + 1).await;
    assert_eq!(code(e), 404, "no such deployment yet");
    s.admin.apply_deployment(manifest("web", 0, "inf")).await.expect("create");
    let e = s.admin.scale_deployment("web", specs::limits::MAX_REPLICAS + 1).await;
    assert_eq!(code(e), 422);
    s.stop().await;
}

#[tokio::test]
async fn a_person_sees_only_their_own_deployments_and_a_viewer_makes_none() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = TestServer::start(dir.path(), |_| {}).await;
    let alice = add(&s, &user("alice", Role::User)).await;
    let bob = add(&s, &user("bob", Role::User)).await;
    let audit = add(&s, &user("audit", Role::Viewer)).await;

    let (c, d) = alice.apply_deployment(manifest("alices", 2, "inf")).await.expect("alice creates one");
    assert_eq!((c, d.metadata.owner.as_deref()), (201, Some("alice")));
    let pods = has_pods(&s.admin, "alices", 2).await;
    assert!(pods.iter().all(|p| p.metadata.owner.as_deref() == Some("alice")), "her pods are hers");

    assert_eq!(code(bob.get_deployment("alices").await), 404, "another's is absent");
    assert_eq!(code(bob.scale_deployment("alices", 5).await), 404);
    assert_eq!(code(bob.delete_deployment("alices").await), 404);
    assert!(bob.list_deployments(None).await.expect("list").items.is_empty());
    assert_eq!(code(bob.apply_deployment(manifest("alices", 1, "inf")).await), 409, "the name is hers");

    assert_eq!(code(audit.apply_deployment(manifest("audits", 1, "inf")).await), 403);
    assert_eq!(code(audit.scale_deployment("alices", 5).await), 403);
    assert_eq!(audit.list_deployments(None).await.expect("a viewer reads all").items.len(), 1);
    assert_eq!(code(audit.get_deployment("alices").await), 200);

    assert_eq!(alice.list_deployments(None).await.expect("list").items.len(), 1);
    alice.delete_deployment("alices").await.expect("she deletes hers");
    has_pods(&s.admin, "alices", 0).await;
    s.stop().await;
}
