use super::*;
use crate::job::{JobSpec, PodTemplate};

/// A job of `members` members of `cpus` CPUs each, its time limit and partition.
fn job(members: u32, cpus: &str, time: Option<u64>, partition: Option<&str>) -> Job {
    let spec = crate::testing::pod("m").host_rootfs().command(&["true"]).guaranteed(cpus, "64Mi").build().spec;
    Job {
        api_version: API_VERSION.into(),
        kind: "Job".into(),
        metadata: ObjectMeta { name: "sweep".into(), ..Default::default() },
        spec: JobSpec {
            template: PodTemplate { metadata: None, spec },
            parallelism: members,
            active_deadline_seconds: time,
            partition: partition.map(String::from),
            ..Default::default()
        },
        status: None,
    }
}

fn partition(name: &str, spec: PartitionSpec) -> Partition {
    Partition {
        api_version: API_VERSION.into(),
        kind: KIND.into(),
        metadata: ObjectMeta { name: name.into(), ..Default::default() },
        spec,
    }
}

/// The cluster of these tests: `batch` (the default: an hour by default, a
/// day at most, 8 CPUs per job, on `pool=cpu` nodes), `gpu` (alice only, a
/// maximum time and no default), `debug` (no limits).
fn cluster() -> Vec<Partition> {
    vec![
        partition(
            "batch",
            PartitionSpec {
                node_selector: [("pool".to_string(), "cpu".to_string())].into(),
                default_time_seconds: Some(3600),
                max_time_seconds: Some(86_400),
                max_cpus_per_job: Some(8),
                default: true,
                ..Default::default()
            },
        ),
        partition(
            "gpu",
            PartitionSpec { max_time_seconds: Some(7200), allowed_users: vec!["alice".into()], ..Default::default() },
        ),
        partition("debug", PartitionSpec::default()),
    ]
}

const BOB: Submitter<'static> = Submitter { name: Some("bob"), admin: false };

/// What `place` makes of `given`: the partition, the time limit and the
/// node selector, or the refused fields.
type Outcome = Result<(Option<&'static str>, Option<u64>, Vec<(&'static str, &'static str)>), Vec<&'static str>>;

fn check(given: Job, partitions: &[Partition], who: Submitter<'_>, expected: Outcome) {
    let mut job = given.clone();
    let got = match place(&mut job, partitions, who) {
        Ok(()) => Ok((
            job.spec.partition.clone(),
            job.spec.active_deadline_seconds,
            job.spec.template.spec.node_selector.clone(),
        )),
        Err(problems) => {
            for p in &problems {
                assert!(!p.message.is_empty(), "{p:?}");
            }
            Err(problems.into_iter().map(|p| p.field).collect::<Vec<_>>())
        }
    };
    let expected = expected
        .map(|(p, t, sel)| {
            (p.map(String::from), t, sel.into_iter().map(|(k, v)| (k.to_string(), v.to_string())).collect())
        })
        .map_err(|fields| fields.into_iter().map(String::from).collect::<Vec<_>>());
    assert_eq!(got, expected, "{:?} by {who:?}", given.spec);
}

#[test]
fn a_job_goes_to_its_partition_or_the_default_and_gets_its_time_and_nodes() {
    let all = cluster();
    // No partition named: the default's, with its default time and nodes.
    check(job(2, "2", None, None), &all, BOB, Ok((Some("batch"), Some(3600), vec![("pool", "cpu")])));
    // A time of its own within the maximum is kept.
    check(job(1, "1", Some(600), None), &all, BOB, Ok((Some("batch"), Some(600), vec![("pool", "cpu")])));
    // A partition without a default time gives its maximum (Slurm's rule).
    let alice = Submitter { name: Some("alice"), admin: false };
    check(job(1, "1", None, Some("gpu")), &all, alice, Ok((Some("gpu"), Some(7200), vec![])));
    // No limits at all: nothing added but the name.
    check(job(64, "4", None, Some("debug")), &all, BOB, Ok((Some("debug"), None, vec![])));
    // A cluster without partitions, or without a default, leaves the job as it is.
    check(job(1, "1", None, None), &[], BOB, Ok((None, None, vec![])));
    check(job(1, "1", None, None), &all[1..], BOB, Ok((None, None, vec![])));
}

#[test]
fn a_job_over_its_partitions_limits_is_refused_at_the_field() {
    let all = cluster();
    check(job(1, "1", Some(86_401), None), &all, BOB, Err(vec!["spec.activeDeadlineSeconds"]));
    // 3 members of 3 CPUs: 9 over 8; 8 exactly passes; a fraction counts.
    let cpu_field = "spec.template.spec.containers[*].resources.requests.cpu";
    check(job(3, "3", None, None), &all, BOB, Err(vec![cpu_field]));
    check(job(4, "2", None, None), &all, BOB, Ok((Some("batch"), Some(3600), vec![("pool", "cpu")])));
    check(job(2, "4100m", None, None), &all, BOB, Err(vec![cpu_field]));
    // Both at once: each at its field.
    check(job(9, "1", Some(90_000), Some("batch")), &all, BOB, Err(vec!["spec.activeDeadlineSeconds", cpu_field]));
    // A partition that is not there, or not the submitter's.
    check(job(1, "1", None, Some("nope")), &all, BOB, Err(vec!["spec.partition"]));
    check(job(1, "1", None, Some("nope")), &[], BOB, Err(vec!["spec.partition"]));
    check(job(1, "1", None, Some("gpu")), &all, BOB, Err(vec!["spec.partition"]));
    check(job(1, "1", None, Some("gpu")), &all, Submitter { name: None, admin: false }, Err(vec!["spec.partition"]));
    // Admins may use any partition (still within its limits).
    let admin = Submitter { name: Some("root"), admin: true };
    check(job(1, "1", None, Some("gpu")), &all, admin, Ok((Some("gpu"), Some(7200), vec![])));
    check(job(1, "1", Some(7201), Some("gpu")), &all, admin, Err(vec!["spec.activeDeadlineSeconds"]));
}

#[test]
fn a_node_selector_is_merged_with_the_partitions_and_may_not_leave_it() {
    let all = cluster();
    let mut own = job(1, "1", None, None);
    own.spec.template.spec.node_selector.insert("rack".into(), "a".into());
    check(own.clone(), &all, BOB, Ok((Some("batch"), Some(3600), vec![("pool", "cpu"), ("rack", "a")])));
    own.spec.template.spec.node_selector.insert("pool".into(), "gpu".into());
    check(own, &all, BOB, Err(vec!["spec.template.spec.nodeSelector[pool]"]));
}

#[test]
fn validation_names_each_bad_field() {
    let check = |spec: PartitionSpec, name: &str, fields: &[&str]| {
        let got: Vec<String> = validate_partition(&partition(name, spec)).into_iter().map(|e| e.field).collect();
        assert_eq!(got, fields, "{name}");
    };
    check(cluster()[0].spec.clone(), "batch", &[]);
    check(PartitionSpec::default(), "Batch_1", &["metadata.name"]);
    // Its labels are labels (Schemathesis found "\u{84}" accepted).
    let mut labelled = partition("p", PartitionSpec::default());
    labelled.metadata.labels.insert("0".into(), "\u{84}".into());
    let got: Vec<String> = validate_partition(&labelled).into_iter().map(|e| e.field).collect();
    assert_eq!(got, ["metadata.labels[0]"]);
    check(
        PartitionSpec { default_time_seconds: Some(7200), max_time_seconds: Some(3600), ..Default::default() },
        "p",
        &["spec.defaultTimeSeconds"],
    );
    check(
        PartitionSpec { default_time_seconds: Some(0), max_time_seconds: Some(u64::MAX), ..Default::default() },
        "p",
        &["spec.defaultTimeSeconds", "spec.maxTimeSeconds"],
    );
    check(PartitionSpec { max_cpus_per_job: Some(0), ..Default::default() }, "p", &["spec.maxCpusPerJob"]);
    check(
        PartitionSpec { allowed_users: vec!["ok".into(), "no way".into()], ..Default::default() },
        "p",
        &["spec.allowedUsers[1]"],
    );
    check(
        PartitionSpec { node_selector: [("bad key!".to_string(), "v".to_string())].into(), ..Default::default() },
        "p",
        &["spec.nodeSelector[bad key!]"],
    );
}

#[test]
fn times_are_written_as_slurm_writes_them() {
    for (secs, text) in
        [(0, "0:00"), (59, "0:59"), (61, "1:01"), (3600, "1:00:00"), (86_399, "23:59:59"), (90_061, "1-01:01:01")]
    {
        assert_eq!(time(secs), text, "{secs}");
    }
}

/// A node `name` with `labels`, 8 CPUs on 2 NUMA nodes, CPU 0 reserved,
/// `free` of 1-7 free, `offline` offline, Ready or not.
fn node(name: &str, labels: &[(&str, &str)], numa: usize, free: &str, offline: &str, ready: bool) -> crate::api::Node {
    use crate::api::{NodeCondition, NodeSpec, NodeStatus, NumaStatus};
    let topology = crate::topology::synthetic::parse(&format!("pack:1 numa:{numa} core:{} pu:1", 8 / numa)).expect("t");
    let set = |l: &str| crate::CpuSet::parse_list(l).expect("cpus");
    let settings = crate::NodeSettings { reserved_cpus: set("0"), ..Default::default() };
    let zones = vec![NumaStatus {
        id: 0,
        cpus: set("0-7"),
        free_cpus: set(free),
        memory_bytes: 0,
        free_memory_bytes: 0,
        hugepages: vec![],
        devices: Default::default(),
    }];
    crate::api::Node {
        api_version: API_VERSION.into(),
        kind: "Node".into(),
        metadata: ObjectMeta {
            name: name.into(),
            labels: labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            ..Default::default()
        },
        spec: NodeSpec { topology, settings, ..Default::default() },
        status: NodeStatus {
            condition: if ready { NodeCondition::Ready } else { NodeCondition::NotReady },
            numa: zones,
            offline_cpus: set(offline),
            ..Default::default()
        },
    }
}

#[test]
fn nodes_rows_count_each_partitions_nodes_by_state_and_their_cpus() {
    let cpu = [("pool", "cpu")];
    let nodes = [
        node("n1", &cpu, 1, "1-7", "", true),
        node("n2", &cpu, 2, "1-7", "", true),
        node("n3", &cpu, 2, "5-7", "7", true),
        node("n4", &cpu, 1, "", "", true),
        node("n5", &cpu, 1, "1-7", "", false),
        node("g1", &[("pool", "gpu")], 1, "1-3", "", true),
    ];
    let rows = nodes_rows(&cluster(), &nodes);
    // (partition, state, nodes, A/I/O/T, NUMA)
    let got: Vec<(String, &str, String, String, String)> = rows
        .iter()
        .map(|r| (r.partition.clone(), r.state, r.nodes.join(","), r.cpus.slashed(), r.numa.clone()))
        .collect();
    // Every partition holds n4, n5, n1 and n2 alike; batch's selector leaves g1 out.
    let same = |p: &str, mixed: &'static str, mixed_cpus: &'static str, numa: &'static str| {
        vec![
            (p.to_string(), "alloc", "n4".to_string(), "7/0/1/8".to_string(), "1".to_string()),
            (p.to_string(), "down", "n5".to_string(), "0/0/8/8".to_string(), "1".to_string()),
            (p.to_string(), "idle", "n1,n2".to_string(), "0/14/2/16".to_string(), "1-2".to_string()),
            (p.to_string(), "mix", mixed.to_string(), mixed_cpus.to_string(), numa.to_string()),
        ]
    };
    // n3: 7 is offline, other with the reserved 0; 1-4 held.
    let want = [
        same("batch*", "n3", "4/2/2/8", "2"),
        same("debug", "g1,n3", "8/5/3/16", "1-2"),
        same("gpu", "g1,n3", "8/5/3/16", "1-2"),
    ]
    .concat();
    assert_eq!(got, want);
    assert_eq!(rows[0].time_limit, Some(86_400));
    // Without partitions: every node under `all`.
    let all = nodes_rows(&[], &nodes[..2]);
    assert_eq!(all.len(), 1);
    assert_eq!((all[0].partition.as_str(), all[0].state, all[0].nodes.len()), ("all", "idle", 2));
}
