//! Many people, one cluster (issue 27), through a real server on
//! 127.0.0.1:0 with a real sled store: each person sees and touches only
//! their own pods and jobs (another's are absent: 404), a viewer reads and
//! writes nothing, a person's pod runs as their Unix user and is held to
//! their profile (each refusal at its field), a viewer reads another's env
//! names but not their values, and a revoked person's certificate is
//! refused from the next request on.

use orchestrator::testing::server::TestServer;
use orchestrator::tls::Credentials;
use pinion_wire::{Client, ClientError};
use specs::api::{Role, User, UserSpec};
use specs::security::Profile;
use specs::Pod;

fn user(name: &str, role: Role, uid: Option<u32>) -> User {
    User {
        api_version: "pinion.io/v1".into(),
        kind: "User".into(),
        metadata: specs::pod::ObjectMeta { name: name.into(), ..Default::default() },
        spec: UserSpec {
            role,
            uid,
            gid: uid,
            groups: vec![],
            profile: None,
            capabilities: vec![],
            host_network: false,
            revoked: None,
        },
    }
}

/// Adds `u` as the admin; their client.
async fn add(s: &TestServer, u: &User) -> (Credentials, Client) {
    let added = s.admin.add_user(u).await.expect("add the user");
    let creds = Credentials {
        servers: vec![s.url.clone()],
        ca_cert: added.ca_cert,
        client_cert: added.client_cert,
        client_key: added.client_key,
    };
    let client = Client::new(&creds).expect("client");
    (creds, client)
}

fn code<T: std::fmt::Debug>(r: Result<T, ClientError>) -> u16 {
    match r {
        Ok(_) => 200,
        Err(ClientError::Api(e)) => e.code,
        Err(e) => panic!("expected an HTTP answer, got {e}"),
    }
}

fn api_error<T: std::fmt::Debug>(r: Result<T, ClientError>) -> specs::api::ApiError {
    match r {
        Err(ClientError::Api(e)) => e,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

fn manifest(name: &str, extra: &str) -> bytes::Bytes {
    bytes::Bytes::from(format!(
        "apiVersion: pinion.io/v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  restartPolicy: Never\n  containers:\n  - name: main\n    rootfs: host\n    command: [\"true\"]\n{extra}"
    ))
}

#[tokio::test]
async fn each_person_sees_and_touches_only_their_own() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = TestServer::start(dir.path(), |o| o.allowed_host_paths = vec!["/srv".into()]).await;
    let (_, alice) = add(&s, &user("alice", Role::User, Some(1001))).await;
    let (_, bob) = add(&s, &user("bob", Role::User, None)).await;
    let (_, audit) = add(&s, &user("audit", Role::Viewer, None)).await;

    let (code_, pod) = alice.create_pod(manifest("alices", "")).await.expect("alice creates a pod");
    assert_eq!(code_, 201);
    assert_eq!(pod.metadata.owner.as_deref(), Some("alice"), "the server sets the owner");
    let sc = pod.spec.security_context.clone().expect("filled in");
    assert_eq!((sc.run_as_user, sc.run_as_group), (Some(1001), Some(1001)), "runs as her uid");
    let (_, bobs) = bob.create_pod(manifest("bobs", "")).await.expect("bob creates a pod");
    assert_eq!(
        bobs.spec.security_context.and_then(|s| s.run_as_user_name).as_deref(),
        Some("bob"),
        "without a uid, the node looks him up by name"
    );

    // An owner given by the client is not believed.
    let forged = "  owner: alice\n";
    let text = String::from_utf8(manifest("forged", "").to_vec())
        .expect("utf8")
        .replace("metadata: {name: forged}", &format!("metadata:\n  name: forged\n{forged}"));
    let (_, p) = bob.create_pod(bytes::Bytes::from(text)).await.expect("create");
    assert_eq!(p.metadata.owner.as_deref(), Some("bob"));

    // Another's pod is absent: get, delete, logs, exec, events; lists leave it out.
    assert_eq!(code(bob.get_pod("alices").await), 404);
    assert_eq!(api_error(bob.get_pod("alices").await).message, "pod \"alices\" not found");
    assert_eq!(code(bob.delete_pod("alices").await), 404);
    assert_eq!(code(bob.events("Pod", "alices").await), 404);
    let names = |l: specs::api::List<Pod>| l.items.into_iter().map(|p| p.metadata.name).collect::<Vec<_>>();
    assert_eq!(names(bob.list_pods(None).await.expect("list")), ["bobs", "forged"]);
    assert_eq!(names(alice.list_pods(None).await.expect("list")), ["alices"]);
    assert_eq!(names(s.admin.list_pods(None).await.expect("list")), ["alices", "bobs", "forged"]);
    assert!(s.admin.get_pod("alices").await.is_ok());
    // A name another holds cannot be taken over.
    assert_eq!(code(bob.create_pod(manifest("alices", "")).await), 409);

    // The viewer reads everything and writes nothing.
    assert_eq!(names(audit.list_pods(None).await.expect("list")), ["alices", "bobs", "forged"]);
    assert!(audit.get_pod("alices").await.is_ok());
    assert_eq!(code(audit.create_pod(manifest("v", "")).await), 403);
    assert_eq!(code(audit.delete_pod("alices").await), 403);
    assert_eq!(code(audit.revoke_user("alice").await), 403);
    assert!(audit.list_users().await.is_ok());
    // A user manages no one.
    assert_eq!(code(alice.list_users().await), 403);
    assert_eq!(code(alice.add_user(&user("eve", Role::Admin, None)).await), 403);

    // Her own pod she deletes.
    assert!(alice.delete_pod("alices").await.is_ok());
    s.stop().await;
}

/// Env values may hold secrets: a viewer reads every pod and job, but of
/// another's env only the names; the owner and an admin read the values.
#[tokio::test]
async fn a_viewer_reads_env_names_but_not_values() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = TestServer::start(dir.path(), |_| {}).await;
    let (_, alice) = add(&s, &user("alice", Role::User, Some(1001))).await;
    let (_, audit) = add(&s, &user("audit", Role::Viewer, None)).await;
    let env = "    env: [{name: DB_PASSWORD, value: hunter2}]\n";
    let pod = String::from_utf8(manifest("alices", "").to_vec()).expect("utf8") + env;
    alice.create_pod(bytes::Bytes::from(pod)).await.expect("alice creates a pod");
    let job = format!(
        "apiVersion: pinion.io/v1\nkind: Job\nmetadata: {{name: alicejob}}\nspec:\n  parallelism: 1\n  template:\n    spec:\n      restartPolicy: Never\n      containers:\n      - name: main\n        rootfs: host\n        command: [\"true\"]\n    {env}"
    );
    alice.create_job(bytes::Bytes::from(job)).await.expect("alice creates a job");
    // Her env, (name, value), as each caller reads it through each route.
    let env_of = |spec: &specs::pod::PodSpec| {
        spec.containers[0].env.iter().map(|v| (v.name.clone(), v.value.clone())).collect::<Vec<_>>()
    };
    let shown = [("DB_PASSWORD".to_string(), "hunter2".to_string())];
    let hidden = [("DB_PASSWORD".to_string(), String::new())];
    for (who, client, expected) in [("alice", &alice, &shown), ("admin", &s.admin, &shown), ("viewer", &audit, &hidden)]
    {
        let got = env_of(&client.get_pod("alices").await.expect("get pod").spec);
        assert_eq!(&got, expected, "{who}: get pod");
        let listed = client.list_pods(None).await.expect("list pods");
        let listed = listed.items.iter().find(|p| p.metadata.name == "alices").expect("listed");
        assert_eq!(&env_of(&listed.spec), expected, "{who}: list pods");
        let mut watch = client.watch_pods(None, None, None).await.expect("watch pods");
        let added = loop {
            let (_, p) = watch.next().await.expect("watch").expect("an ADDED event");
            if p.metadata.name == "alices" {
                break p;
            }
        };
        assert_eq!(&env_of(&added.spec), expected, "{who}: watch pods");
        let got = env_of(&client.get_job("alicejob").await.expect("get job").spec.template.spec);
        assert_eq!(&got, expected, "{who}: get job");
        let listed = client.list_jobs(None).await.expect("list jobs");
        assert_eq!(&env_of(&listed.items[0].spec.template.spec), expected, "{who}: list jobs");
    }
    // Changes reach a viewer's watch without the values too: hers, and
    // those of her job's pod (the job's own env, set by the server).
    let from = s.admin.get_pod("alices").await.expect("get").metadata.resource_version;
    let mut watch = audit.watch_pods(None, None, from).await.expect("watch pods");
    alice.delete_pod("alices").await.expect("alice deletes her pod");
    loop {
        let next = tokio::time::timeout(std::time::Duration::from_secs(10), watch.next()).await.expect("a change");
        let (_, changed) = next.expect("watch").expect("an event");
        let env = env_of(&changed.spec);
        assert!(env.iter().all(|(_, value)| value.is_empty()), "{}: {env:?}", changed.metadata.name);
        if changed.metadata.name == "alices" {
            assert_eq!(env, hidden);
            break;
        }
    }
    s.stop().await;
}

#[tokio::test]
async fn a_baseline_persons_pods_are_refused_at_the_field_with_the_profile() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = TestServer::start(dir.path(), |o| o.allowed_host_paths = vec!["/srv".into()]).await;
    let (_, alice) = add(&s, &user("alice", Role::User, Some(1001))).await;
    let caps = |c: &str| format!("    securityContext: {{capabilities: {{add: [{c}]}}}}\n");
    let cases = [
        ("sysadmin", caps("SYS_ADMIN"), "spec.containers[0].securityContext.capabilities.add[0]", "SYS_ADMIN"),
        (
            "dacread",
            caps("DAC_READ_SEARCH"),
            "spec.containers[0].securityContext.capabilities.add[0]",
            "DAC_READ_SEARCH",
        ),
        (
            "root",
            "  volumes: [{name: root, hostPath: {path: /}}]\n".into(),
            "spec.volumes[0].hostPath.path",
            "host path \"/\"",
        ),
        ("hostnet", "  hostNetwork: true\n".into(), "spec.hostNetwork", "the host's network"),
        ("uid0", "  securityContext: {runAsUser: 0}\n".into(), "spec.securityContext.runAsUser", "uid 0"),
    ];
    for (name, extra, field, what) in cases {
        let e = api_error(alice.create_pod(manifest(name, &extra)).await);
        assert_eq!(e.code, 403, "{name}: {e:?}");
        assert_eq!(e.details.len(), 1, "{name}: {e:?}");
        assert_eq!(e.details[0].field, field, "{name}");
        assert_eq!(e.details[0].message, format!("{what} is not allowed for user alice (profile baseline)"), "{name}");
        assert_eq!(code(s.admin.get_pod(name).await), 404, "{name}: nothing stored");
    }
    // Allowed: a host path under /srv, NET_BIND_SERVICE.
    let fine = [
        ("srv", "  volumes: [{name: d, hostPath: {path: /srv/data}}]\n".to_string()),
        ("bind", caps("NET_BIND_SERVICE")),
    ];
    for (name, extra) in fine {
        alice.create_pod(manifest(name, &extra)).await.unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    // Root inside a user namespace of the pod's own is nobody on the host:
    // a baseline person may run it, as they say (not as their uid).
    let (_, userns) = alice
        .create_pod(manifest("userns", "  hostUsers: false\n  securityContext: {runAsUser: 0}\n"))
        .await
        .expect("root in a user namespace");
    let sc = userns.spec.security_context.clone().unwrap_or_default();
    assert_eq!((userns.spec.host_users, sc.run_as_user), (Some(false), Some(0)));
    // Not with the host's network, whose namespace is not the pod's own.
    let e = api_error(alice.create_pod(manifest("usernet", "  hostUsers: false\n  hostNetwork: true\n")).await);
    assert!(e.code == 422 && e.details.iter().any(|d| d.field == "spec.hostUsers"), "{e:?}");
    // An admin's pod is privileged, as today.
    s.admin.create_pod(manifest("adm", &caps("SYS_ADMIN"))).await.expect("admin");
    // A person granted SYS_NICE with the privileged profile: as an admin's.
    let mut ran = user("ran", Role::User, Some(1002));
    ran.spec.profile = Some(Profile::Privileged);
    let (_, ran) = add(&s, &ran).await;
    ran.create_pod(manifest("ranpod", &caps("SYS_ADMIN"))).await.expect("privileged profile");
    s.stop().await;
}

#[tokio::test]
async fn a_revoked_person_is_refused_from_the_next_request_and_an_old_certificate_after_they_are_added_again() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = TestServer::start(dir.path(), |_| {}).await;
    let (_, alice) = add(&s, &user("alice", Role::User, Some(1001))).await;
    alice.list_pods(None).await.expect("alice reads");
    let mut watch = alice.watch_pods(None, None, None).await.expect("alice watches");
    // Adding her again while she holds valid credentials is refused.
    assert_eq!(code(s.admin.add_user(&user("alice", Role::User, Some(1001))).await), 409);
    s.admin.revoke_user("alice").await.expect("revoke");
    // Her open watch ends with a 401, not silently.
    let ended = tokio::time::timeout(std::time::Duration::from_secs(10), watch.next()).await.expect("the watch ends");
    assert_eq!(api_error(ended).code, 401);
    let e = api_error(alice.list_pods(None).await);
    assert_eq!(e.code, 401, "{e:?}");
    assert!(e.message.contains("revoked"), "{e:?}");
    // Health stays open to her, as to anyone.
    assert!(alice.get("/healthz").await.is_ok());
    let (_, again) = add(&s, &user("alice", Role::User, Some(1001))).await;
    again.list_pods(None).await.expect("the new certificate works");
    assert_eq!(code(alice.list_pods(None).await), 401, "the old one stays refused");
    let listed = s.admin.list_users().await.expect("list");
    assert_eq!(listed.items.len(), 1);
    assert_eq!(listed.items[0].spec.revoked, None);
    s.stop().await;
}

/// A revoked person and a deleted node are refused on every server of a
/// three-server cluster on three etcd members, within the time the other
/// servers' mirrors take to see the write (bounded here at 10 s; it is
/// milliseconds), and their requests never succeed again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_etcd_a_revoked_person_and_a_deleted_nodes_old_certificate_are_refused_on_every_server() {
    use orchestrator::testing::etcd::{available, EtcdCluster};
    use std::time::Duration;
    if !available("people on etcd") {
        return;
    }
    let etcd = EtcdCluster::start(3).await.expect("etcd");
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().expect("tempdir")).collect();
    let mut servers = Vec::new();
    for d in &dirs {
        servers.push(TestServer::start(d.path(), |o| o.etcd = Some(etcd.config("/people"))).await);
    }
    let (alice_creds, _) = add(&servers[0], &user("alice", Role::User, Some(1001))).await;
    let node_creds = servers[0].join(dirs[0].path(), "edge-1").await;
    // Each server, as alice and as the node: they work everywhere first.
    let on = |creds: &Credentials, s: &TestServer| {
        Client::new(&Credentials { servers: vec![s.url.clone()], ..creds.clone() }).expect("client")
    };
    for s in &servers {
        let alice = on(&alice_creds, s);
        pinion_wire::testing::eventually("alice is known on every server", Duration::from_secs(10), || async {
            alice.list_pods(None).await.is_ok()
        })
        .await;
        let node = on(&node_creds, s);
        pinion_wire::testing::eventually("the node is known on every server", Duration::from_secs(10), || async {
            code(node.get_node("edge-1").await) == 404
        })
        .await;
    }
    servers[0].admin.revoke_user("alice").await.expect("revoke");
    servers[1].admin.delete_node("edge-1").await.expect("delete the node");
    for s in &servers {
        let (alice, node) = (on(&alice_creds, s), on(&node_creds, s));
        pinion_wire::testing::eventually("alice is refused on every server", Duration::from_secs(10), || async {
            code(alice.list_pods(None).await) == 401
        })
        .await;
        pinion_wire::testing::eventually("the node is refused on every server", Duration::from_secs(10), || async {
            code(node.get_node("edge-1").await) == 401
        })
        .await;
    }
    // The deleted node's certificate stays refused after the name joins again.
    let again = servers[2].join(dirs[2].path(), "edge-1").await;
    for s in &servers {
        let (old, new) = (on(&node_creds, s), on(&again, s));
        pinion_wire::testing::eventually("the new join works on every server", Duration::from_secs(10), || async {
            code(new.get_node("edge-1").await) == 404
        })
        .await;
        assert_eq!(code(old.get_node("edge-1").await), 401, "{}: the old certificate", s.url);
    }
    for s in servers {
        s.stop().await;
    }
}
