//! The controller's deciders, table-tested on its in-memory state with the
//! real scheduler and no store; and the executor's one rule about a binding
//! the store refused, over a real store.

use super::*;

#[test]
fn a_node_is_lost_when_ready_and_silent_past_the_grace() {
    let now = Instant::now();
    let grace = Duration::from_secs(40);
    let ago = |s: u64| now - Duration::from_secs(s);
    // (name, ready, last heartbeat): lost?
    let table = [
        ("fresh", true, ago(1), false),
        ("at-grace", true, ago(40), false),
        ("silent", true, ago(41), true),
        ("already-not-ready", false, ago(500), false),
    ];
    let lost = lifecycle::silent_nodes(table.iter().map(|&(n, r, t, _)| (n, r, t)), now, grace);
    let want: Vec<String> = table.iter().filter(|r| r.3).map(|r| r.0.to_string()).collect();
    assert_eq!(lost, want);
    // A heartbeat from the future (a clock read across threads) is not silence.
    assert!(lifecycle::silent_nodes([("n", true, now + Duration::from_secs(5))].into_iter(), now, grace).is_empty());
}

#[test]
fn a_finished_pod_goes_at_its_time_and_only_that_incarnation() {
    let t0 = Instant::now();
    let at = |s: u64| t0 + Duration::from_secs(s);
    let mut e = expiry::Expiry::default();
    e.set(at(10), "a", "uid-a".into());
    e.set(at(5), "b", "uid-b".into());
    e.set(at(7), "c", "uid-c".into());
    // The pod of that name finished again (a new incarnation): its own timer only.
    e.set(at(20), "a", "uid-a2".into());
    e.forget("c");
    assert_eq!(e.next(), Some(at(5)));
    let words = |v: Vec<Effect>| -> Vec<String> {
        v.into_iter()
            .map(|x| match x {
                Effect::RemoveFinished { pod, uid } => format!("{pod}/{uid}"),
                other => format!("{other:?}"),
            })
            .collect()
    };
    // (now, removed then)
    let table: [(u64, &[&str]); 4] = [(4, &[]), (15, &["b/uid-b"]), (19, &[]), (20, &["a/uid-a2"])];
    for (now, want) in table {
        assert_eq!(words(e.due(at(now))), want, "at {now}s");
    }
    assert_eq!(e.next(), None);
}

fn node(name: &str, cores: u32) -> crate::scheduler::NodeInfo {
    crate::scheduler::NodeInfo {
        name: name.into(),
        labels: Default::default(),
        topology: Arc::new(crate::scheduler::tests::machine(&[cores])),
        settings: Default::default(),
        allocations: Default::default(),
        ready: true,
    }
}

fn exclusive(name: &str, cpus: u32) -> Pod {
    specs::testing::pod(name).guaranteed(&cpus.to_string(), "1Gi").build()
}

fn task(array: &str, index: u32, parallelism: u32) -> Pod {
    let mut p = exclusive(&format!("{array}-{index}"), 1);
    p.metadata.labels.insert(specs::pod::ARRAY_LABEL.into(), array.into());
    p.metadata.annotations.insert(specs::pod::ARRAY_TASK_ANNOTATION.into(), index.to_string());
    p.metadata.annotations.insert(specs::pod::ARRAY_PARALLELISM_ANNOTATION.into(), parallelism.to_string());
    p
}

/// `pod` as if created `second` seconds into the test cluster's life.
fn submitted(mut pod: Pod, second: u32) -> Pod {
    pod.metadata.creation_timestamp = Some(format!("2026-01-01T00:00:{second:02}Z"));
    pod
}

/// A job's members, each wanting `cpus` exclusive CPUs, all needed at once.
fn gang(job: &str, members: u32, cpus: u32) -> Vec<Pod> {
    let job: specs::job::Job = serde_json::from_value(serde_json::json!({
        "apiVersion": "pinion.io/v1", "kind": "Job", "metadata": {"name": job},
        "spec": {"parallelism": members, "template": {"spec": {"containers": [{
            "name": "main", "image": "busybox:1",
            "resources": {"requests": {"cpu": cpus.to_string(), "memory": "1Gi"},
                          "limits": {"cpu": cpus.to_string(), "memory": "1Gi"}}
        }]}}}
    }))
    .expect("job");
    (0..members).map(|rank| specs::job::member(&job, rank)).collect()
}

/// One pass of the queue's decider, as `Controller::pass` runs it, in words.
fn pass(st: &mut State, now: Instant) -> Vec<String> {
    let mut failed = HashMap::new();
    let due = st.due_pods(now, PASS);
    let effects: Vec<Effect> = due.iter().flat_map(|name| st.decide_any(name, now, &mut failed)).collect();
    effects
        .into_iter()
        .map(|e| match e {
            Effect::Bind { pod, binding } => format!("bind {} {}", pod.metadata.name, binding.node),
            Effect::BindGang(members) => {
                let names: Vec<&str> = members.iter().map(|m| m.pod.metadata.name.as_str()).collect();
                format!("bind-gang {}", names.join(","))
            }
            Effect::SayWaiting { pod, why } => format!("wait {pod} {}", why.reason),
            other => format!("{other:?}"),
        })
        .collect()
}

/// The queue's decider, pass by pass, on one node of `cores` CPUs: what
/// binds, what waits and says why (once per reason), in queue order.
#[test]
fn the_queue_decides_in_order_and_says_why_a_pod_waits_once() {
    struct Case {
        name: &'static str,
        cores: u32,
        pods: Vec<Pod>,
        /// Effects of the first pass, then of a second pass after every
        /// waiting pod is woken with nothing changed.
        first: &'static [&'static str],
        second: &'static [&'static str],
    }
    let cases = [
        Case {
            name: "what fits binds, in submission order",
            cores: 4,
            pods: vec![exclusive("a", 2), exclusive("b", 2)],
            first: &["bind a n1", "bind b n1"],
            second: &[],
        },
        Case {
            name: "a pod that fits nowhere says so once, and so does its twin",
            cores: 2,
            pods: vec![exclusive("a", 2), exclusive("b", 2), exclusive("c", 2)],
            first: &["bind a n1", "wait b Unschedulable", "wait c Unschedulable"],
            second: &[],
        },
        Case {
            name: "an array binds no more tasks than its parallelism",
            cores: 4,
            pods: vec![task("arr", 0, 1), task("arr", 1, 1), task("arr", 2, 1)],
            first: &["bind arr-0 n1", "wait arr-1 ArrayThrottled", "wait arr-2 ArrayThrottled"],
            second: &[],
        },
        Case {
            name: "an array's tasks go by index though submitted last first, seconds apart",
            cores: 4,
            pods: (0..3).rev().map(|i| submitted(task("arr", i, 2), 2 - i)).collect(),
            first: &["bind arr-0 n1", "bind arr-1 n1", "wait arr-2 ArrayThrottled"],
            second: &[],
        },
        Case {
            name: "a gang binds together",
            cores: 4,
            pods: gang("j", 2, 2),
            first: &["bind-gang j-0,j-1"],
            second: &[],
        },
        Case {
            name: "a gang that does not fit holds nothing and what queued behind it waits",
            cores: 2,
            pods: [gang("j", 2, 2), vec![exclusive("late", 1)]].concat(),
            first: &["wait j-0 Unschedulable", "wait j-1 Unschedulable", "wait late Queued"],
            second: &[],
        },
    ];
    for c in cases {
        let mut st = State::new(Scheduler::new(Default::default()), Default::default());
        st.sched.upsert_node(node("n1", c.cores));
        for p in c.pods {
            st.enqueue(Arc::new(p), Wait::Now, false);
        }
        let now = Instant::now();
        assert_eq!(pass(&mut st, now), c.first, "{}: first pass", c.name);
        st.wake_waiting();
        st.wake_array("arr");
        assert_eq!(pass(&mut st, now), c.second, "{}: second pass", c.name);
    }
}

/// A pod the scheduler bound and no node confirmed goes back to the queue
/// after the binding timeout: the timers' decider asks for it, with the jobs
/// to judge again.
#[test]
fn an_unconfirmed_binding_and_a_changed_job_are_due_at_the_next_pass() {
    let timeout = Duration::from_secs(30);
    let config = crate::scheduler::SchedulerConfig { assume_expiry: timeout, ..Default::default() };
    let mut st = State::new(Scheduler::new(config), Default::default());
    st.sched.upsert_node(node("n1", 2));
    st.enqueue(Arc::new(exclusive("a", 1)), Wait::Now, false);
    let now = Instant::now();
    assert_eq!(pass(&mut st, now), ["bind a n1"]);
    st.dirty_jobs.insert("j".into());
    let words = |v: Vec<Effect>| -> Vec<String> { v.into_iter().map(|e| format!("{e:?}")).collect() };
    assert_eq!(words(st.timers(now)), [r#"ReconcileJob("j")"#]);
    assert!(st.timers(now).is_empty(), "a job is judged once per change");
    let later = now + timeout + Duration::from_secs(1);
    assert_eq!(words(st.timers(later)), [r#"ExpireBinding { pod: "a", node: "n1" }"#]);
}

fn pod(name: &str) -> Pod {
    specs::testing::pod(name).image("busybox:1").build()
}

/// A binding the store refused goes back to the queue only when the
/// store was at fault (5xx), after the retry delay; a refusal about the
/// pod (404 gone, 409 replaced) leaves it out.
#[tokio::test]
async fn a_binding_the_store_refused_is_queued_again_only_for_the_stores_own_faults() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path(), Default::default()).expect("store");
    let (_stop, stopped) = watch::channel(false);
    let (c, _loops) =
        Controller::start(store, ControllerConfig::default(), Default::default(), stopped).expect("start");
    let binding = crate::scheduler::Binding { node: "n1".into(), epoch: 1, placement: Default::default() };
    let disk_full = || StoreError::DiskFull { dir: "/d".into(), available: 0, needed: 1 };
    let refusals = [
        ("full", ClusterError::Store(disk_full()), true),
        ("leader", ClusterError::NotLeader, true),
        ("gone", ClusterError::not_found("Pod", "x"), false),
        ("bound", ClusterError::Conflict("already bound".into()), false),
    ];
    for (code, e, requeued) in refusals {
        let p = pod(&format!("p{code}"));
        c.pod_created(&p);
        let mut inner = c.lock();
        // As `decide` leaves a pod it bound: out of the queue, its place kept.
        assert!(inner.dequeue(&p.metadata.name).is_some());
        inner.binding_not_stored(&p, &binding, &e, Duration::from_secs(60));
        let wait = inner.queue.get(&p.metadata.name).map(|e| e.wait);
        assert_eq!(matches!(wait, Some(Wait::Backoff(_))), requeued, "{code}: {wait:?}");
    }
}

/// A running job with a time limit is judged at its deadline, marked as
/// past it; an ended one keeps no timer; a job waiting for its dependency is
/// judged again at any other job's change, and stops being when it starts.
#[test]
fn a_jobs_deadline_and_its_dependency_are_timers_of_the_controller() {
    use specs::job::{Job, JobPhase, JobStatus};
    let mut st = State::new(Scheduler::new(Default::default()), Default::default());
    let job = |name: &str, phase: JobPhase, reason: Option<&str>| -> Job {
        let mut j: Job = serde_json::from_value(serde_json::json!({
            "apiVersion": specs::pod::API_VERSION, "kind": "Job", "metadata": {"name": name},
            "spec": {"parallelism": 1, "template": {"spec": {"containers": []}}}
        }))
        .expect("job");
        j.status = Some(JobStatus { phase, reason: reason.map(str::to_string), ..Default::default() });
        j
    };
    let words = |v: Vec<Effect>| -> Vec<String> { v.into_iter().map(|e| format!("{e:?}")).collect() };
    let now = Instant::now();
    st.learn_job(&job("slow", JobPhase::Running, None), Some(60), now);
    assert_eq!(st.next_timer(), Some(now + Duration::from_secs(60)));
    // Learnt again (another change of the job): the first deadline stands.
    st.learn_job(&job("slow", JobPhase::Running, None), Some(90), now + Duration::from_secs(5));
    assert!(words(st.timers(now + Duration::from_secs(59))).is_empty());
    assert_eq!(words(st.timers(now + Duration::from_secs(60))), [r#"ReconcileJob("slow")"#]);
    assert!(st.jobs_past_deadline.contains("slow"));
    st.learn_job(&job("slow", JobPhase::Failed, Some(specs::job::DEADLINE_EXCEEDED)), None, now);
    assert!(st.jobs_past_deadline.is_empty() && st.job_deadlines.is_empty() && st.next_timer().is_none());

    st.learn_job(&job("after", JobPhase::Pending, Some(specs::job::DEPENDENCY)), None, now);
    assert!(words(st.timers(now)).is_empty(), "its own change does not wake it");
    st.learn_job(&job("first", JobPhase::Succeeded, None), None, now);
    assert_eq!(words(st.timers(now)), [r#"ReconcileJob("after")"#]);
    st.learn_job(&job("after", JobPhase::Pending, None), None, now);
    st.learn_job(&job("other", JobPhase::Failed, None), None, now);
    assert!(words(st.timers(now)).is_empty(), "it no longer waits");
}
