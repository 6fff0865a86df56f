//! `pinion queue` and partitions on a hollow node of 7 free CPUs, through an
//! in-process server and the `pinion` binary: an admin applies a default
//! partition with `pinion apply` and a user cannot; jobs submitted get its
//! name and default time, and one over its CPUs is refused naming the
//! field; the queue shows a running job (R, its node), one waiting for
//! room (PD, Resources), one behind it (Priority), one waiting for its
//! dependency and one held, in Slurm's columns; a user sees only their own
//! jobs, and `-u`, `--me`, `-t`, `-p` narrow the list. A user's priority is
//! refused; a cancelled running job is charged to its user (`pinion
//! share`), whose next job goes behind another's submitted after it.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::Cluster;
use pinion_wire::testing::eventually;

const LONG: Duration = Duration::from_secs(30);

fn job(name: &str, cpus: u32, extra: &str) -> Bytes {
    Bytes::from(format!(
        "apiVersion: pinion.io/v1\nkind: Job\nmetadata: {{name: {name}}}\nspec:\n  parallelism: 1\n{extra}  template:\n    spec:\n      restartPolicy: Never\n      terminationGracePeriodSeconds: 0\n      containers:\n      - name: main\n        rootfs: host\n        command: [sleep, inf]\n        resources: {{limits: {{cpu: \"{cpus}\", memory: 16Mi}}}}\n"
    ))
}

/// `pinion ARGS` with the credentials in `config`: success and output.
fn cli(config: &std::path::Path, args: &[&str]) -> (bool, String) {
    let out = std::process::Command::new(common::PINION)
        .args(args)
        .env("PINION_CONFIG", config)
        .output()
        .expect("run pinion");
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

/// The queue's lines as (JOBID, every column) for `args`.
fn queue(config: &std::path::Path, args: &[&str]) -> Vec<Vec<String>> {
    let (ok, out) = cli(config, &[&["queue"], args].concat());
    assert!(ok, "{out}");
    let mut lines = out.lines().filter(|l| !l.starts_with("first waiting job"));
    let header: Vec<&str> = lines.next().unwrap_or_default().split_whitespace().collect();
    assert_eq!(
        header,
        ["JOBID", "PARTITION", "NAME", "USER", "ST", "TIME", "TIME_LIMIT", "NODES", "PRIORITY", "NODELIST(REASON)"]
    );
    lines.map(|l| l.split_whitespace().map(str::to_string).collect()).collect()
}

fn ids(rows: &[Vec<String>]) -> Vec<&str> {
    rows.iter().map(|r| r[0].as_str()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queue_shows_slurms_states_and_reasons_and_partitions_apply() {
    let mut c = Cluster::start().await;
    c.labelled_node("n1", &[("pool", "cpu")]);
    eventually("node n1 Ready", LONG, || async {
        let nodes = c.admin.list_nodes(None).await.ok()?.items;
        nodes.iter().any(|n| n.status.condition == specs::api::NodeCondition::Ready).then_some(())
    })
    .await;
    let admin_conf = c.relayed_config.clone();
    let bob_conf = c.dir.path().join("bob.conf");
    let wire = serde_json::json!({"apiVersion": "pinion.io/v1", "kind": "User", "metadata": {"name": "bob"}, "spec": {"role": "user"}});
    let added = c.admin.add_user(&serde_json::from_value(wire).expect("user")).await.expect("add bob");
    let bob_creds = orchestrator::tls::Credentials {
        servers: c.creds.servers.clone(),
        ca_cert: added.ca_cert,
        client_cert: added.client_cert,
        client_key: added.client_key,
    };
    bob_creds.save(&bob_conf).expect("save bob's credentials");
    let bob = pinion_wire::Client::new(&bob_creds).expect("bob's client");

    // The partition, by the admin only.
    let file = c.dir.path().join("batch.yaml");
    std::fs::write(
        &file,
        "apiVersion: pinion.io/v1\nkind: Partition\nmetadata: {name: batch}\nspec: {nodeSelector: {pool: cpu}, defaultTimeSeconds: 3600, maxCpusPerJob: 6, default: true}\n",
    )
    .expect("write");
    let path = file.to_str().expect("utf-8");
    let (ok, out) = cli(&bob_conf, &["apply", "-f", path]);
    assert!(!ok && out.contains("may not create, change or delete partitions"), "{out}");
    let (ok, out) = cli(&admin_conf, &["apply", "-f", path]);
    assert!(ok && out.contains("partition/batch created"), "{out}");
    let (ok, out) = cli(&bob_conf, &["get", "partitions"]);
    assert!(ok && out.contains("batch") && out.contains("pool=cpu") && out.contains("1:00:00"), "{out}");

    // Over the partition's CPUs: refused, naming the field.
    let e = bob.create_job(job("huge", 7, "")).await.expect_err("over maxCpusPerJob");
    assert!(e.to_string().contains("resources.requests.cpu") && e.to_string().contains("maxCpusPerJob"), "{e}");

    bob.create_job(job("big", 6, "")).await.expect("big");
    eventually("big running", LONG, || async {
        let j = c.admin.get_job("big").await.ok()?;
        (j.status?.phase == specs::job::JobPhase::Running).then_some(())
    })
    .await;
    bob.create_job(job("wide", 4, "")).await.expect("wide");
    c.admin.create_job(job("after", 2, "")).await.expect("after");
    bob.create_job(job("dep", 1, "  dependency: afterok:wide\n")).await.expect("dep");
    c.admin.create_job(job("later", 1, "  dependency: afterok:wide\n")).await.expect("later");
    c.admin.hold_job("later").await.expect("hold later");

    let rows = eventually("the queue's reasons", LONG, || async {
        let rows = queue(&admin_conf, &[]);
        let reasons: Vec<(&str, &str)> = rows.iter().map(|r| (r[0].as_str(), r[9].as_str())).collect();
        let want = [
            ("wide", "(Resources)"),
            ("after", "(Priority)"),
            ("dep", "(Dependency)"),
            ("later", "(JobHeldUser)"),
            ("big", "n1"),
        ];
        (reasons == want).then_some(rows)
    })
    .await;
    // big runs for at most an hour (the partition's default): wide, first
    // in line, is expected to start within it.
    let (ok, out) = cli(&admin_conf, &["queue"]);
    assert!(ok && out.contains("first waiting job wide: expected to start within "), "{out}");
    // sinfo's view: n1 of batch (the default), 6 CPUs of big's held, CPU 0
    // reserved, one idle, one NUMA node.
    // (Once the node has reported big's CPUs.)
    eventually("pinion nodes shows n1 mixed", LONG, || async {
        let (ok, out) = cli(&bob_conf, &["nodes"]);
        assert!(ok, "{out}");
        let line = out.lines().find(|l| l.starts_with("batch*")).unwrap_or_default().to_string();
        let words: Vec<&str> = line.split_whitespace().collect();
        (words == ["batch*", "up", "infinite", "1", "mix", "6/1/1/8", "1", "n1"]).then_some(())
    })
    .await;
    let big = &rows[4];
    assert_eq!(
        (big[1].as_str(), big[2].as_str(), big[3].as_str(), big[4].as_str(), big[6].as_str(), big[7].as_str()),
        ("batch", "big", "bob", "R", "1:00:00", "1"),
        "{big:?}"
    );
    assert!(rows[..4].iter().all(|r| r[4] == "PD" && r[5] == "0:00"), "{rows:?}");

    // A user sees their own; the filters narrow.
    assert_eq!(ids(&queue(&bob_conf, &[])), ["wide", "dep", "big"]);
    assert_eq!(ids(&queue(&admin_conf, &["--me"])), ["after", "later"]);
    assert_eq!(ids(&queue(&admin_conf, &["-u", "bob", "-t", "R"])), ["big"]);
    assert_eq!(ids(&queue(&admin_conf, &["-t", "pd", "-j", "dep,later"])), ["dep", "later"]);
    assert!(queue(&admin_conf, &["-p", "gpu"]).is_empty());
    assert!(queue(&admin_conf, &["-t", "CD,F,TO"]).is_empty());
    let (ok, out) = cli(&admin_conf, &["queue", "-t", "XX"]);
    assert!(!ok && out.contains("unknown state"), "{out}");
    // Held and waiting for a dependency: no members, no priority yet.
    assert!(rows[2][8] == "-" && rows[3][8] == "-", "{rows:?}");

    // Only an admin sets a priority.
    let e = bob.create_job(job("vip", 1, "  priority: 5\n")).await.expect_err("a user's priority");
    assert!(e.to_string().contains("spec.priority"), "{e}");

    // bob's running job cancelled: its CPU time is his usage, and his next
    // job goes behind the admin's, submitted after it.
    let (ok, out) = cli(&bob_conf, &["cancel", "big"]);
    assert!(ok, "{out}");
    let (ok, out) = cli(&bob_conf, &["share"]);
    assert!(ok, "{out}");
    let bob_share: Vec<&str> = out
        .lines()
        .find(|l| l.starts_with("user") && l.contains("bob"))
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert!(bob_share.len() == 5 && bob_share[4].parse::<f64>().is_ok_and(|f| f < 1.0), "{out}");
    eventually("wide and after placed", LONG, || async {
        let rows = queue(&admin_conf, &["-t", "R"]);
        (ids(&rows) == ["after", "wide"] || ids(&rows) == ["wide", "after"]).then_some(())
    })
    .await;
    bob.create_job(job("bobnext", 2, "")).await.expect("bobnext");
    c.admin.create_job(job("adminnext", 2, "")).await.expect("adminnext");
    let rows = queue(&admin_conf, &["-t", "PD", "-j", "bobnext,adminnext"]);
    assert_eq!(ids(&rows), ["adminnext", "bobnext"], "fair share orders them: {rows:?}");
    let p = |r: &Vec<String>| r[8].parse::<i64>().expect("a priority");
    assert!(p(&rows[0]) > p(&rows[1]), "{rows:?}");
    c.stop().await;
}
