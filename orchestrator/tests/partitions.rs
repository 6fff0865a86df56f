//! Partitions through a real server on 127.0.0.1:0 with a real sled store:
//! only admins write them, everyone known reads them, at most one is the
//! default; a job submitted gets its partition (the default one when it
//! names none), its default time and node selector, and a job over a
//! partition's limit, or in a partition not its owner's, is refused at
//! submission with a 422 naming the field.

use bytes::Bytes;
use orchestrator::testing::server::TestServer;
use pinion_wire::ClientError;
use specs::api::Role;

fn partition(name: &str, spec: &str) -> Bytes {
    Bytes::from(format!("apiVersion: pinion.io/v1\nkind: Partition\nmetadata: {{name: {name}}}\nspec: {spec}\n"))
}

fn job(name: &str, members: u32, cpu: &str, extra: &str) -> Bytes {
    Bytes::from(format!(
        "apiVersion: pinion.io/v1\nkind: Job\nmetadata: {{name: {name}}}\nspec:\n  parallelism: {members}\n{extra}  template:\n    spec:\n      restartPolicy: Never\n      containers:\n      - name: main\n        rootfs: host\n        command: [\"true\"]\n        resources: {{requests: {{cpu: \"{cpu}\", memory: 64Mi}}, limits: {{cpu: \"{cpu}\", memory: 64Mi}}}}\n"
    ))
}

/// The refusal's code and its fields with their messages.
fn refusal<T: std::fmt::Debug>(r: Result<T, ClientError>) -> (u16, Vec<(String, String)>) {
    match r {
        Err(ClientError::Api(e)) => (e.code, e.details.into_iter().map(|d| (d.field, d.message)).collect()),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[tokio::test]
async fn admins_write_partitions_and_jobs_get_their_defaults_or_are_refused_at_the_field() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = TestServer::start(dir.path(), |_| {}).await;
    let admin = &s.admin;
    let bob = s.person("bob", Role::User).await;
    let viewer = s.person("vera", Role::Viewer).await;

    // Admins write; users and viewers read only.
    let batch =
        "{nodeSelector: {pool: cpu}, defaultTimeSeconds: 3600, maxTimeSeconds: 86400, maxCpusPerJob: 4, default: true}";
    let (code, p) = admin.apply_partition(partition("batch", batch)).await.expect("create");
    assert_eq!((code, p.metadata.generation), (201, Some(1)));
    let (code, p) = admin.apply_partition(partition("batch", batch)).await.expect("again");
    assert_eq!((code, p.metadata.generation), (200, Some(1)), "the same again changes nothing");
    for (who, c) in [("user", &bob), ("viewer", &viewer)] {
        let (code, _) = refusal(c.apply_partition(partition("mine", "{}")).await);
        assert_eq!(code, 403, "a {who} may not create a partition");
        let (code, _) = refusal(c.delete_partition("batch").await);
        assert_eq!(code, 403, "a {who} may not delete a partition");
        let listed = c.list_partitions().await.expect("anyone known lists them");
        assert_eq!(listed.items.len(), 1);
        assert_eq!(c.get_partition("batch").await.expect("get").spec.max_cpus_per_job, Some(4));
    }
    let gpu = "{maxTimeSeconds: 7200, allowedUsers: [alice]}";
    assert_eq!(admin.apply_partition(partition("gpu", gpu)).await.expect("gpu").0, 201);
    // One default only, and the refusal names the one there is.
    let (code, fields) = refusal(admin.apply_partition(partition("other", "{default: true}")).await);
    assert_eq!(code, 409, "{fields:?}");
    // A bad partition is refused at its fields.
    let (code, fields) =
        refusal(admin.apply_partition(partition("bad", "{defaultTimeSeconds: 7200, maxTimeSeconds: 60}")).await);
    assert_eq!(code, 422);
    assert_eq!(fields.iter().map(|f| f.0.as_str()).collect::<Vec<_>>(), ["spec.defaultTimeSeconds"]);

    // A job naming no partition goes to the default and gets its time and nodes.
    let (code, j) = bob.create_job(job("small", 2, "2", "")).await.expect("a job within the limits");
    assert_eq!(code, 201);
    assert_eq!(j.spec.partition.as_deref(), Some("batch"));
    assert_eq!(j.spec.active_deadline_seconds, Some(3600), "the partition's default time");
    assert_eq!(j.spec.template.spec.node_selector.get("pool").map(String::as_str), Some("cpu"));
    let member = bob.get_pod("small-0").await.expect("its member");
    assert_eq!(member.spec.node_selector.get("pool").map(String::as_str), Some("cpu"), "the members go to its nodes");
    // The same job again is the same job (placed the same way).
    assert_eq!(bob.create_job(job("small", 2, "2", "")).await.expect("again").0, 200);

    // Over the limits: each refusal at its field, and nothing stored.
    let (code, fields) = refusal(bob.create_job(job("wide", 3, "2", "")).await);
    assert_eq!(code, 422);
    assert_eq!(fields[0].0, "spec.template.spec.containers[*].resources.requests.cpu");
    assert!(fields[0].1.contains("6 CPUs") && fields[0].1.contains("maxCpusPerJob"), "{fields:?}");
    let (code, fields) = refusal(bob.create_job(job("long", 1, "1", "  activeDeadlineSeconds: 90000\n")).await);
    assert_eq!((code, fields[0].0.as_str()), (422, "spec.activeDeadlineSeconds"));
    assert!(fields[0].1.contains("1-00:00:00"), "{fields:?}");
    let (code, fields) = refusal(bob.create_job(job("g", 1, "1", "  partition: gpu\n")).await);
    assert_eq!((code, fields[0].0.as_str()), (422, "spec.partition"), "bob is not in gpu's allowedUsers");
    let (code, fields) = refusal(bob.create_job(job("n", 1, "1", "  partition: nope\n")).await);
    assert_eq!((code, fields[0].0.as_str()), (422, "spec.partition"));
    assert!(fields[0].1.contains("batch, gpu"), "{fields:?}");
    for name in ["wide", "long", "g", "n"] {
        assert!(bob.get_job(name).await.is_err(), "{name} was refused whole");
    }
    // An admin may use any partition; its maximum time is the default there.
    let (_, j) = admin.create_job(job("g", 1, "1", "  partition: gpu\n")).await.expect("an admin's job in gpu");
    assert_eq!((j.spec.partition.as_deref(), j.spec.active_deadline_seconds), (Some("gpu"), Some(7200)));

    // Deleted: jobs named for it are refused, jobs placed in it keep it.
    admin.delete_partition("gpu").await.expect("delete");
    let (code, _) = refusal(admin.get_partition("gpu").await);
    assert_eq!(code, 404);
    assert_eq!(admin.get_job("g").await.expect("kept").spec.partition.as_deref(), Some("gpu"));
    s.stop().await;
}
