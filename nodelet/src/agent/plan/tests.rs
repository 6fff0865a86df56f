//! The planner alone: a state, an event, the actions it plans. No runtime, no
//! clock (every `now` is a fixed instant plus an offset), no files.

use std::path::Path;

use specs::topology::{Cpu, NumaNode};
use specs::{NodeSettings, NodeTopology, PodPhase, RestartPolicy};

use super::super::status;
use super::*;

/// Two CPUs, CPU 0 reserved: one allocatable CPU, as on the test host.
fn state(t0: Instant) -> State {
    let topology = NodeTopology {
        cpus: (0..2).map(|id| Cpu { id, core: id, socket: 0, die: None, numa: Some(0), uncore_cache: None }).collect(),
        numa_nodes: vec![NumaNode {
            kind: Default::default(),
            id: 0,
            cpus: CpuSet::range(0, 1).expect("id within MAX_ID"),
            memory_bytes: 1 << 30,
            ..Default::default()
        }],
        ..Default::default()
    };
    let settings = NodeSettings { reserved_cpus: CpuSet::single(0).expect("id within MAX_ID"), ..Default::default() };
    let mut cfg = AgentConfig::new("n1".into(), "/d".into(), topology, settings);
    cfg.backoff = super::super::Backoff {
        base: Duration::from_secs(10),
        cap: Duration::from_secs(40),
        reset_after: Duration::from_secs(600),
    };
    cfg.recheck_interval = Duration::from_secs(3600);
    State::new(cfg, Allocations::default(), t0)
}

fn pod(name: &str, command: &[&str], policy: RestartPolicy) -> Pod {
    specs::testing::pod(name).restart(policy).grace_seconds(3).command(command).limits("1", "64Mi").build()
}

/// A fractional limit and no request: a shared container that takes none
/// of the one allocatable CPU.
fn shared_cpu(p: &mut Pod) {
    let r = &mut p.spec.containers[0].resources;
    r.limits.insert("cpu".into(), specs::Quantity::parse("500m").unwrap());
    r.requests.insert("cpu".into(), specs::Quantity::parse("0").unwrap());
}

fn apply(key: &str, p: Pod) -> DesiredChange {
    DesiredChange::Apply { key: key.into(), pod: Box::new(p), plan: None }
}

/// An action in a few words: runtime ids lose their hash (`static-a_main_0`).
fn brief(a: &Action) -> String {
    let short = |id: &str| {
        let parts: Vec<&str> = id.split('_').collect();
        match parts.as_slice() {
            [key, ctr, _hash, n] => format!("{key}_{ctr}_{n}"),
            _ => id.to_string(),
        }
    };
    match a {
        Action::WriteCheckpoint { generation, checkpoint } => {
            let alloc: Vec<&str> = checkpoint.allocations.pods.keys().map(String::as_str).collect();
            let ids: Vec<String> = checkpoint
                .pods
                .values()
                .flat_map(|p| p.containers.values())
                .filter_map(|c| c.runtime_id.as_deref())
                .map(short)
                .collect();
            format!("checkpoint {generation} alloc=[{}] ids=[{}]", alloc.join(" "), ids.join(" "))
        }
        Action::Start { config, .. } => format!("start {} cpus={}", short(&config.id), config.cpus),
        Action::Stop { key, ids, grace } => {
            format!("stop {key} [{}] {}s", ids.iter().map(|i| short(i)).collect::<Vec<_>>().join(" "), grace.as_secs())
        }
        Action::Remove { id } => format!("remove {}", short(id)),
        Action::UpdateCpuset { key, container, cpus, .. } => format!("cpuset {key}/{container} {cpus}"),
        Action::Recheck { ids } => format!("recheck [{}]", ids.iter().map(|i| short(i)).collect::<Vec<_>>().join(" ")),
        Action::RemoveLogs { dir } => {
            format!("remove logs {}", dir.strip_prefix("/d/logs").unwrap_or(dir).display())
        }
        Action::Probe { key, container, kind, target, .. } => {
            format!("probe {key}/{container} {} {target:?}", kind.field())
        }
        Action::Kill { id, grace, .. } => format!("kill {} {}s", short(id), grace.as_secs()),
    }
}

/// Plans `event` at `now` and checks the actions, in order.
#[track_caller]
fn check(st: &mut State, event: Event, now: Instant, expected: &[&str]) -> Vec<Action> {
    let actions = plan(st, event, now);
    let got: Vec<String> = actions.iter().map(brief).collect();
    assert_eq!(got, expected, "actions");
    actions
}

fn id_of(st: &State, key: &str) -> String {
    st.pods[key].ctrs[0].runtime_id.clone().unwrap()
}

fn phase(st: &State, key: &str) -> Option<PodPhase> {
    status::build(st).pods.get(key).map(|p| p.phase)
}

fn written(generation: u64) -> Event {
    Event::CheckpointWritten { generation, result: Ok(()) }
}

fn started(st: &State, key: &str) -> Event {
    Event::Started { key: key.into(), container: "main".into(), id: id_of(st, key), result: Ok(()) }
}

fn exited(st: &State, key: &str, code: i32) -> Event {
    Event::Exited { id: id_of(st, key), code, oom_killed: false, usage: None }
}

/// Runs `key` up to Running; returns the next checkpoint generation.
fn run_pod(st: &mut State, t: Instant, key: &str, p: Pod, generation: u64) {
    let a = plan(st, Event::Changes(vec![apply(key, p)]), t);
    assert!(matches!(a.as_slice(), [Action::WriteCheckpoint { .. }]), "{a:?}");
    let a = plan(st, written(generation), t);
    assert!(matches!(a.as_slice(), [Action::Start { .. }]), "{a:?}");
    let ev = started(st, key);
    plan(st, ev, t);
}

/// Two pods learned of in one pass, room for one: the first to arrive is
/// admitted, whatever the names (the scheduler bound them in that order).
#[test]
fn pods_arriving_together_are_admitted_first_come_first_served() {
    let t = Instant::now();
    let mut st = state(t);
    check(
        &mut st,
        Event::Changes(vec![
            apply("static/zed", pod("zed", &["sleep", "inf"], RestartPolicy::Never)),
            apply("static/abe", pod("abe", &["sleep", "inf"], RestartPolicy::Never)),
        ]),
        t,
        &["checkpoint 1 alloc=[static/zed] ids=[static-zed_main_0]"],
    );
}

#[test]
fn a_new_pod_starts_only_after_the_checkpoint_holding_it() {
    let t = Instant::now();
    let mut st = state(t);
    check(
        &mut st,
        Event::Changes(vec![apply("static/a", pod("a", &["sleep", "inf"], RestartPolicy::Never))]),
        t,
        &["checkpoint 1 alloc=[static/a] ids=[static-a_main_0]"],
    );
    assert_eq!(phase(&st, "static/a"), Some(PodPhase::Pending), "admitted, not started");
    check(&mut st, written(1), t, &["start static-a_main_0 cpus=1"]);
    let ev = started(&st, "static/a");
    check(&mut st, ev, t, &[]);
    assert_eq!(phase(&st, "static/a"), Some(PodPhase::Running));
}

#[test]
fn one_checkpoint_covers_every_pod_of_a_pass_and_waits_for_the_write_in_flight() {
    let t = Instant::now();
    let mut st = state(t);
    // Shared pods (no exclusive CPU) fit together.
    let shared = |n: &str| {
        let mut p = pod(n, &["sleep", "inf"], RestartPolicy::Never);
        shared_cpu(&mut p);
        p
    };
    check(
        &mut st,
        Event::Changes(vec![
            apply("static/a", shared("a")),
            apply("static/b", shared("b")),
            apply("static/c", shared("c")),
        ]),
        t,
        &["checkpoint 1 alloc=[static/a static/b static/c] ids=[static-a_main_0 static-b_main_0 static-c_main_0]"],
    );
    // A pod arriving while the write is in flight waits for the next one.
    check(&mut st, Event::Changes(vec![apply("static/d", shared("d"))]), t, &[]);
    check(
        &mut st,
        written(1),
        t,
        &[
            "start static-a_main_0 cpus=0-1",
            "start static-b_main_0 cpus=0-1",
            "start static-c_main_0 cpus=0-1",
            "checkpoint 2 alloc=[static/a static/b static/c static/d] ids=[static-a_main_0 static-b_main_0 static-c_main_0 static-d_main_0]",
        ],
    );
    check(&mut st, written(2), t, &["start static-d_main_0 cpus=0-1"]);
}

#[test]
fn an_exit_frees_the_cpus_at_once_for_the_next_pod() {
    let t = Instant::now();
    let mut st = state(t);
    run_pod(&mut st, t, "static/a", pod("a", &["true"], RestartPolicy::Never), 1);
    check(&mut st, written(1), t, &[]);
    // b does not fit beside a.
    check(&mut st, Event::Changes(vec![apply("static/b", pod("b", &["true"], RestartPolicy::Never))]), t, &[]);
    assert_eq!(status::build(&st).pods["static/b"].reason.as_deref(), Some("InsufficientCpu"));
    // a's exit: its CPU freed and b admitted in the same pass, one write;
    // a's container is removed once that write (which no longer names it) is durable.
    let ev = exited(&st, "static/a", 0);
    check(&mut st, ev, t, &["checkpoint 2 alloc=[static/b] ids=[static-b_main_0]"]);
    assert_eq!(phase(&st, "static/a"), Some(PodPhase::Succeeded));
    assert!(status::build(&st).pods["static/a"].placement.is_none());
    check(&mut st, written(2), t, &["remove static-a_main_0", "start static-b_main_0 cpus=1"]);
}

/// A finished pod's network goes to the next pod only when none of its
/// containers held an added capability (`NET_ADMIN` could have changed its
/// routes or rules); a running pod's never.
#[test]
fn only_a_finished_pod_without_added_capabilities_gives_its_network_on() {
    let t = Instant::now();
    let mut st = state(t);
    let sandbox = |st: &State, key: &str| {
        let e = &st.pods[key];
        crate::cni::sandbox_id(key, &reconcile::log_uid(&e.pod, &e.hash))
    };
    run_pod(&mut st, t, "static/a", pod("a", &["true"], RestartPolicy::Never), 1);
    assert!(super::super::reusable_networks(&st).is_empty(), "a runs");
    let ev = exited(&st, "static/a", 0);
    plan(&mut st, ev, t);
    plan(&mut st, written(2), t);
    let mut b = pod("b", &["true"], RestartPolicy::Never);
    b.spec.containers[0].security_context = Some(specs::pod::SecurityContext {
        capabilities: Some(specs::pod::Capabilities { add: vec!["NET_ADMIN".into()], drop: vec![] }),
        ..Default::default()
    });
    run_pod(&mut st, t, "static/b", b, 3);
    let ev = exited(&st, "static/b", 1);
    plan(&mut st, ev, t);
    assert_eq!(phase(&st, "static/b"), Some(PodPhase::Failed));
    let reusable = super::super::reusable_networks(&st);
    assert_eq!(reusable.into_iter().collect::<Vec<_>>(), vec![sandbox(&st, "static/a")]);
}

#[test]
fn an_exit_reported_before_the_start_returned_is_kept() {
    let t = Instant::now();
    let mut st = state(t);
    plan(&mut st, Event::Changes(vec![apply("static/a", pod("a", &["false"], RestartPolicy::Never))]), t);
    plan(&mut st, written(1), t);
    let ev = exited(&st, "static/a", 1);
    check(&mut st, ev, t, &[]);
    let ev = started(&st, "static/a");
    check(&mut st, ev, t, &["checkpoint 2 alloc=[] ids=[]"]);
    assert_eq!(phase(&st, "static/a"), Some(PodPhase::Failed));
    check(&mut st, written(2), t, &["remove static-a_main_0"]);
}

/// A restarted agent reads a checkpointed id the runtime lacks as "never
/// created": so a dead incarnation goes only once a checkpoint that no longer
/// names it is durable, and a failed write keeps it for the next one.
#[test]
fn a_dead_container_is_removed_only_once_a_checkpoint_without_it_is_durable() {
    let t = Instant::now();
    let mut st = state(t);
    run_pod(&mut st, t, "static/a", pod("a", &["true"], RestartPolicy::Never), 1);
    check(&mut st, written(1), t, &[]);
    let ev = exited(&st, "static/a", 0);
    check(&mut st, ev, t, &["checkpoint 2 alloc=[] ids=[]"]);
    check(&mut st, Event::CheckpointWritten { generation: 2, result: Err("disk full".into()) }, t, &[]);
    check(&mut st, Event::Tick, t + RETRY_AFTER, &["checkpoint 3 alloc=[] ids=[]"]);
    check(&mut st, written(3), t + RETRY_AFTER, &["remove static-a_main_0"]);
    check(&mut st, Event::Tick, t + RETRY_AFTER * 2, &[]);
}

#[test]
fn restarts_wait_for_their_backoff_with_a_new_incarnation() {
    let t = Instant::now();
    let mut st = state(t);
    run_pod(&mut st, t, "static/a", pod("a", &["sleep", "inf"], RestartPolicy::Always), 1);
    check(&mut st, written(1), t, &[]);
    // The first crash restarts at once: the new incarnation goes in the
    // checkpoint that records the exit (one write, as the kubelet restarts
    // a first crash with no backoff).
    let ev = exited(&st, "static/a", 2);
    check(&mut st, ev, t, &["checkpoint 2 alloc=[static/a] ids=[static-a_main_1]"]);
    check(&mut st, written(2), t, &["remove static-a_main_0", "start static-a_main_1 cpus=1"]);
    let ev = started(&st, "static/a");
    plan(&mut st, ev, t);
    // The next one waits for the first backoff.
    let ev = exited(&st, "static/a", 2);
    check(&mut st, ev, t, &["checkpoint 3 alloc=[static/a] ids=[]"]);
    check(&mut st, written(3), t, &["remove static-a_main_1"]);
    assert_eq!(st.next_wake(), t + Duration::from_secs(10), "the first backoff");
    check(&mut st, Event::Tick, t + Duration::from_secs(9), &[]);
    check(&mut st, Event::Tick, t + Duration::from_secs(10), &["checkpoint 4 alloc=[static/a] ids=[static-a_main_2]"]);
    check(&mut st, written(4), t + Duration::from_secs(10), &["start static-a_main_2 cpus=1"]);
}

#[test]
fn a_deleted_pod_is_stopped_and_forgotten_with_its_logs() {
    let t = Instant::now();
    let mut st = state(t);
    run_pod(&mut st, t, "static/a", pod("a", &["sleep", "inf"], RestartPolicy::Always), 1);
    check(&mut st, written(1), t, &[]);
    let logs = reconcile::pod_log_dir(
        Path::new(""),
        "static/a",
        &reconcile::log_uid(&st.pods["static/a"].pod, &st.pods["static/a"].hash),
    );
    check(
        &mut st,
        Event::Changes(vec![DesiredChange::Remove { key: "static/a".into() }]),
        t,
        &["stop static/a [static-a_main_0] 3s"],
    );
    // The container's exit on SIGTERM changes nothing: the stop's result decides.
    let ev = exited(&st, "static/a", 143);
    check(&mut st, ev, t, &[]);
    assert!(st.alloc.pods.contains_key("static/a"), "CPUs held until the stop returns");
    check(
        &mut st,
        Event::Stopped { key: "static/a".into(), errors: vec![] },
        t,
        &[&format!("remove logs {}", logs.strip_prefix("logs").unwrap().display()), "checkpoint 2 alloc=[] ids=[]"],
    );
    assert!(!st.pods.contains_key("static/a"));
    // Stopped, then removed once the checkpoint without it is durable.
    check(&mut st, written(2), t, &["remove static-a_main_0"]);
}

/// A pod deleted and applied again unchanged gets the same runtime id: its
/// container starts only once the old one is removed.
#[test]
fn a_pod_replaced_by_an_equal_spec_starts_after_the_old_container_is_removed() {
    let t = Instant::now();
    let mut st = state(t);
    run_pod(&mut st, t, "static/a", pod("a", &["sleep", "inf"], RestartPolicy::Always), 1);
    check(&mut st, written(1), t, &[]);
    let old = id_of(&st, "static/a");
    let remove = Event::Changes(vec![DesiredChange::Remove { key: "static/a".into() }]);
    check(&mut st, remove, t, &["stop static/a [static-a_main_0] 3s"]);
    plan(&mut st, Event::Changes(vec![apply("static/a", pod("a", &["sleep", "inf"], RestartPolicy::Always))]), t);
    let stopped = Event::Stopped { key: "static/a".into(), errors: vec![] };
    check(&mut st, stopped, t, &["checkpoint 2 alloc=[static/a] ids=[]"]);
    check(&mut st, written(2), t, &["remove static-a_main_0"]);
    // A removal that fails keeps the id busy and is tried again later.
    check(&mut st, Event::Removed { id: old.clone(), ok: false }, t, &[]);
    check(&mut st, Event::Tick, t + RETRY_AFTER, &["remove static-a_main_0"]);
    let removed = Event::Removed { id: old.clone(), ok: true };
    check(&mut st, removed, t + RETRY_AFTER, &["checkpoint 3 alloc=[static/a] ids=[static-a_main_0]"]);
    assert_eq!(id_of(&st, "static/a"), old, "the same id, free again");
    check(&mut st, written(3), t + RETRY_AFTER, &["start static-a_main_0 cpus=1"]);
}

#[test]
fn a_failed_stop_keeps_the_cpus_and_is_retried_later() {
    let t = Instant::now();
    let mut st = state(t);
    run_pod(&mut st, t, "static/a", pod("a", &["sleep", "inf"], RestartPolicy::Always), 1);
    check(&mut st, written(1), t, &[]);
    plan(&mut st, Event::Changes(vec![DesiredChange::Remove { key: "static/a".into() }]), t);
    check(&mut st, Event::Stopped { key: "static/a".into(), errors: vec!["stop: busy".into()] }, t, &[]);
    assert!(st.alloc.pods.contains_key("static/a"));
    check(&mut st, Event::Tick, t + RETRY_AFTER, &["stop static/a [static-a_main_0] 3s"]);
}

#[test]
fn a_command_that_cannot_run_fails_a_never_pod_without_retry() {
    let t = Instant::now();
    let mut st = state(t);
    plan(&mut st, Event::Changes(vec![apply("static/a", pod("a", &["nope"], RestartPolicy::Never))]), t);
    plan(&mut st, written(1), t);
    let failure = StartFailure::CannotRun { code: 127, message: "command \"nope\" not found in $PATH".into() };
    let event = Event::Started {
        key: "static/a".into(),
        container: "main".into(),
        id: id_of(&st, "static/a"),
        result: Err(failure),
    };
    // Nothing to remove: a failed start leaves nothing behind.
    check(&mut st, event, t, &["checkpoint 2 alloc=[] ids=[]"]);
    let report = status::build(&st);
    let p = &report.pods["static/a"];
    assert_eq!(p.phase, PodPhase::Failed);
    let c = &p.container_statuses[0];
    assert_eq!((c.last_exit_code, c.reason.as_deref()), (Some(127), Some("ContainerCannotRun")));
    assert_eq!(p.message.as_deref(), Some("container main: command \"nope\" not found in $PATH (exit code 127)"));
    check(&mut st, Event::Tick, t + Duration::from_secs(60), &[]);
}

#[test]
fn a_failed_start_is_a_crash_of_the_container() {
    let t = Instant::now();
    let mut st = state(t);
    plan(&mut st, Event::Changes(vec![apply("static/a", pod("a", &["sleep", "inf"], RestartPolicy::OnFailure))]), t);
    plan(&mut st, written(1), t);
    let event = Event::Started {
        key: "static/a".into(),
        container: "main".into(),
        id: id_of(&st, "static/a"),
        result: Err(StartFailure::Other("start x: timed out after 90s".into())),
    };
    // Removed in case the start still finishes; restarted (the first time at once).
    check(&mut st, event, t, &["remove static-a_main_0", "checkpoint 2 alloc=[static/a] ids=[static-a_main_1]"]);
    let p = &status::build(&st).pods["static/a"];
    let c = &p.container_statuses[0];
    assert_eq!((c.last_exit_code, c.reason.as_deref()), (Some(128), Some("ContainerCreating")));
    assert_eq!(p.message.as_deref(), Some("start x: timed out after 90s"));
}

#[test]
fn a_failed_pull_waits_in_image_pull_backoff_without_a_restart_and_a_pull_is_said() {
    let t = Instant::now();
    let mut st = state(t);
    plan(&mut st, Event::Changes(vec![apply("static/a", pod("a", &["sleep", "inf"], RestartPolicy::Never))]), t);
    plan(&mut st, written(1), t);
    check(&mut st, Event::Pulling { key: "static/a".into(), reference: "reg:5000/upf:1".into() }, t, &[]);
    assert_eq!(status::build(&st).pods["static/a"].message.as_deref(), Some("pulling image reg:5000/upf:1"));
    let failed = |st: &State| Event::Started {
        key: "static/a".into(),
        container: "main".into(),
        id: id_of(st, "static/a"),
        result: Err(StartFailure::ImagePull { message: "reg:5000/upf:1: MANIFEST_UNKNOWN".into(), never: false }),
    };
    // Nothing ran: no removal, no restart, even under restartPolicy Never.
    let e = failed(&st);
    check(&mut st, e, t, &[]);
    let p = &status::build(&st).pods["static/a"];
    let c = &p.container_statuses[0];
    assert_eq!((p.phase, p.reason.as_deref()), (PodPhase::Pending, Some("ErrImagePull")));
    assert_eq!((c.reason.as_deref(), c.restart_count), (Some("ImagePullBackOff"), 0));
    assert_eq!(p.message.as_deref(), Some("ErrImagePull: reg:5000/upf:1: MANIFEST_UNKNOWN"));
    // Tried again after the backoff, with a new checkpoint and start.
    let first = st.cfg.backoff.delay(1);
    assert!(first > Duration::ZERO, "not at once");
    check(&mut st, Event::Tick, t + first / 2, &[]);
    check(&mut st, Event::Tick, t + first, &["checkpoint 2 alloc=[static/a] ids=[static-a_main_0]"]);
    check(&mut st, written(2), t + first, &["start static-a_main_0 cpus=1"]);
    // The second failure waits longer; a start that works clears the words.
    let e = failed(&st);
    check(&mut st, e, t + first, &[]);
    let second = st.cfg.backoff.delay(2);
    assert!(second > first, "{second:?} after {first:?}");
    check(&mut st, Event::Tick, t + first + second, &["checkpoint 3 alloc=[static/a] ids=[static-a_main_0]"]);
    plan(&mut st, written(3), t + first + second);
    let e = started(&st, "static/a");
    check(&mut st, e, t + first + second, &[]);
    let p = &status::build(&st).pods["static/a"];
    assert_eq!((p.phase, p.message.as_deref()), (PodPhase::Running, None));
}

#[test]
fn a_failed_checkpoint_write_starts_nothing_and_is_retried() {
    let t = Instant::now();
    let mut st = state(t);
    plan(&mut st, Event::Changes(vec![apply("static/a", pod("a", &["sleep", "inf"], RestartPolicy::Never))]), t);
    check(&mut st, Event::CheckpointWritten { generation: 1, result: Err("disk full".into()) }, t, &[]);
    assert_eq!(status::build(&st).pods["static/a"].message.as_deref(), Some("disk full"));
    check(&mut st, Event::Tick, t + RETRY_AFTER, &["checkpoint 2 alloc=[static/a] ids=[static-a_main_0]"]);
    check(&mut st, written(2), t + RETRY_AFTER, &["start static-a_main_0 cpus=1"]);
}

#[test]
fn a_pod_deleted_while_starting_is_stopped_once_the_start_returns() {
    let t = Instant::now();
    let mut st = state(t);
    plan(&mut st, Event::Changes(vec![apply("static/a", pod("a", &["sleep", "inf"], RestartPolicy::Never))]), t);
    plan(&mut st, written(1), t);
    check(&mut st, Event::Changes(vec![DesiredChange::Remove { key: "static/a".into() }]), t, &[]);
    let ev = started(&st, "static/a");
    check(&mut st, ev, t, &["stop static/a [static-a_main_0] 3s"]);
}

#[test]
fn exclusive_admissions_move_the_shared_pool_in_place() {
    let t = Instant::now();
    let mut st = state(t);
    let mut shared = pod("s", &["sleep", "inf"], RestartPolicy::Always);
    shared_cpu(&mut shared);
    run_pod(&mut st, t, "static/s", shared, 1);
    check(&mut st, written(1), t, &[]);
    check(
        &mut st,
        Event::Changes(vec![apply("static/x", pod("x", &["sleep", "inf"], RestartPolicy::Always))]),
        t,
        &["cpuset static/s/main 0", "checkpoint 2 alloc=[static/s static/x] ids=[static-s_main_0 static-x_main_0]"],
    );
    let done = Event::CpusetUpdated {
        key: "static/s".into(),
        container: "main".into(),
        id: id_of(&st, "static/s"),
        cpus: CpuSet::single(0).expect("id within MAX_ID"),
        mems: NumaSet::new(),
        result: Ok(()),
    };
    check(&mut st, done, t, &[]);
}

#[test]
fn exits_of_unknown_containers_and_stale_results_change_nothing() {
    let t = Instant::now();
    let mut st = state(t);
    check(&mut st, Event::Exited { id: "other_main_0".into(), code: 1, oom_killed: false, usage: None }, t, &[]);
    // A start nobody waits for any more: what it created is removed.
    let stale =
        Event::Started { key: "static/gone".into(), container: "main".into(), id: "x_main_h_0".into(), result: Ok(()) };
    check(&mut st, stale, t, &["remove x_main_0"]);
}

/// A node with a CNI network (in a folder no test reads).
fn with_network(mut st: State) -> State {
    st.cfg.cni = Some(crate::cni::CniConfig::new("/c".into(), vec!["/cni".into()]));
    st
}

/// Whether a start joins the pod's network: its request and its namespace.
fn networked(a: &Action) -> (bool, bool) {
    match a {
        Action::Start { config, network, .. } => (network.is_some(), config.netns.is_some()),
        other => panic!("not a start: {other:?}"),
    }
}

fn kernel_says_no() -> crate::netcheck::Unfit {
    crate::netcheck::Unfit::KernelUnsupported { message: r#"could not add "pinion0": operation not supported"#.into() }
}

/// A pod network that fails for a reason of the host is not a crash loop:
/// the pod starts again at once with `lo` only (no restart counted), later
/// pods start so from the first, and the node says why once, as a condition.
#[test]
fn a_pod_network_the_host_cannot_run_starts_pods_with_lo_only() {
    let t = Instant::now();
    let mut st = with_network(state(t));
    let mut p = pod("a", &["sleep", "inf"], RestartPolicy::Always);
    shared_cpu(&mut p);
    check(
        &mut st,
        Event::Changes(vec![apply("static/a", p.clone())]),
        t,
        &["checkpoint 1 alloc=[static/a] ids=[static-a_main_0]"],
    );
    let a = check(&mut st, written(1), t, &["start static-a_main_0 cpus=0-1"]);
    assert_eq!(networked(&a[0]), (true, true), "the first start asks for the network");
    let failure = StartFailure::HostNetwork {
        unfit: kernel_says_no(),
        message: r#"pod network: CNI plugin bridge ADD failed: could not add "pinion0": operation not supported"#
            .into(),
    };
    let ev = Event::Started {
        key: "static/a".into(),
        container: "main".into(),
        id: id_of(&st, "static/a"),
        result: Err(failure),
    };
    let a = plan(&mut st, ev, t);
    // Started again at once (after the checkpoint of its new id, if any), without the network.
    let start = a.iter().find(|a| matches!(a, Action::Start { .. }));
    let start = match start {
        Some(s) => s.clone(),
        None => {
            let gen = a.iter().find_map(|a| match a {
                Action::WriteCheckpoint { generation, .. } => Some(*generation),
                _ => None,
            });
            let gen = gen.unwrap_or_else(|| panic!("neither a start nor a checkpoint: {a:?}"));
            let a = plan(&mut st, written(gen), t);
            a.into_iter().find(|a| matches!(a, Action::Start { .. })).expect("a start")
        }
    };
    assert_eq!(networked(&start), (false, false), "lo only");
    let report = status::build(&st);
    let shown = &report.pods["static/a"];
    assert_eq!(shown.container_statuses[0].restart_count, 0, "not a restart");
    assert_ne!(shown.container_statuses[0].reason.as_deref(), Some("CrashLoopBackOff"));
    assert!(shown.message.as_deref().is_some_and(|m| m.contains("started without its pod network")), "{shown:?}");
    assert_eq!(report.conditions, [kernel_says_no().condition()]);

    // The next pod goes without it from the start.
    let mut q = pod("b", &["sleep", "inf"], RestartPolicy::Always);
    shared_cpu(&mut q);
    let a = plan(&mut st, Event::Changes(vec![apply("static/b", q)]), t);
    let gen = a.iter().find_map(|a| match a {
        Action::WriteCheckpoint { generation, .. } => Some(*generation),
        _ => None,
    });
    let a = match gen {
        Some(g) => plan(&mut st, written(g), t),
        None => a,
    };
    let b = a
        .iter()
        .find(|a| matches!(a, Action::Start { config, .. } if config.id.starts_with("static-b")))
        .expect("b starts");
    assert_eq!(networked(b), (false, false));
}

/// `pinion up` found the host unfit before the agent started: no pod asks
/// for the network, and the first report already carries the condition.
#[test]
fn a_host_known_unfit_at_start_runs_pods_with_lo_only() {
    let t = Instant::now();
    let mut st = state(t);
    st.cfg.cni = None;
    st.network_down =
        Some(crate::netcheck::Unfit::PluginMissing { plugin: "bridge".into(), dirs: "/usr/lib/cni".into() });
    assert_eq!(status::build(&st).conditions.len(), 1);
    let mut with_cni = with_network(state(t));
    with_cni.network_down = st.network_down.clone();
    check(
        &mut with_cni,
        Event::Changes(vec![apply("static/a", pod("a", &["sleep", "inf"], RestartPolicy::Never))]),
        t,
        &["checkpoint 1 alloc=[static/a] ids=[static-a_main_0]"],
    );
    let a = check(&mut with_cni, written(1), t, &["start static-a_main_0 cpus=1"]);
    assert_eq!(networked(&a[0]), (false, false));
}

/// A finished pod keeps the address it had after its network is removed,
/// as Kubernetes shows it; the address goes with the pod.
#[test]
fn a_finished_pod_keeps_its_address() {
    let t = Instant::now();
    let mut st = with_network(state(t));
    run_pod(&mut st, t, "static/a", pod("a", &["true"], RestartPolicy::Never), 1);
    let e = &st.pods["static/a"];
    let sandbox = crate::cni::sandbox_id("static/a", &reconcile::log_uid(&e.pod, &e.hash));
    let ip = vec!["10.213.0.5".to_string()];
    plan(&mut st, Event::PodNetwork { key: "static/a".into(), sandbox: sandbox.clone(), ips: ip.clone() }, t);
    let ev = exited(&st, "static/a", 0);
    plan(&mut st, ev, t);
    assert_eq!(phase(&st, "static/a"), Some(PodPhase::Succeeded));
    // The network is removed: `PodNetwork` with no address.
    plan(&mut st, Event::PodNetwork { key: String::new(), sandbox: sandbox.clone(), ips: Vec::new() }, t);
    let shown = &status::build(&st).pods["static/a"];
    assert_eq!((shown.pod_ip.as_deref(), &shown.pod_ips), (Some("10.213.0.5"), &ip));
    plan(&mut st, Event::Changes(vec![DesiredChange::Remove { key: "static/a".into() }]), t);
    assert!(st.pod_ips.is_empty(), "{:?}", st.pod_ips);
}

fn exec_probe(period: u32, failures: u32) -> specs::probe::Probe {
    specs::probe::Probe {
        exec: Some(specs::probe::ExecAction { command: vec!["check".into()] }),
        period_seconds: Some(period),
        failure_threshold: Some(failures),
        ..Default::default()
    }
}

/// `run_pod`, then the actions of the start's result: the probes due at once.
fn run_probed(st: &mut State, t: Instant, key: &str, p: Pod) -> Vec<String> {
    let a = plan(st, Event::Changes(vec![apply(key, p)]), t);
    assert!(matches!(a.as_slice(), [Action::WriteCheckpoint { .. }]), "{a:?}");
    let a = plan(st, written(1), t);
    assert!(matches!(a.as_slice(), [Action::Start { .. }]), "{a:?}");
    let ev = started(st, key);
    plan(st, ev, t).iter().map(brief).collect()
}

fn probed(st: &State, key: &str, kind: ProbeKind, at: Instant, result: ProbeResult) -> Event {
    Event::Probed {
        key: key.into(),
        container: "main".into(),
        id: id_of(st, key),
        kind,
        at,
        result,
        message: Some("exit 1".into()),
    }
}

#[test]
fn a_failing_liveness_probe_stops_the_container_and_its_exit_restarts_it() {
    let t0 = Instant::now();
    let s = Duration::from_secs;
    let mut st = state(t0);
    let mut p = pod("a", &["sleep", "1000"], RestartPolicy::Always);
    p.spec.containers[0].liveness_probe = Some(exec_probe(2, 2));
    let first = run_probed(&mut st, t0, "static-a", p);
    assert_eq!(first, ["probe static-a/main livenessProbe InsideNetns"], "due at once (no initial delay)");
    check(&mut st, Event::Tick, t0 + s(1), &[]);
    let first = probed(&st, "static-a", ProbeKind::Liveness, t0, ProbeResult::Failure);
    check(&mut st, first, t0 + s(1), &[]);
    assert_eq!(st.next_wake(), t0 + s(2), "one period after the run began");
    check(&mut st, Event::Tick, t0 + s(2), &["probe static-a/main livenessProbe InsideNetns"]);
    let second = probed(&st, "static-a", ProbeKind::Liveness, t0 + s(2), ProbeResult::Timeout);
    check(&mut st, second, t0 + s(2), &["kill static-a_main_0 3s"]);
    check(&mut st, Event::Tick, t0 + s(10), &[]);
    let report = status::build(&st);
    let c = &report.pods["static-a"].container_statuses[0];
    assert_eq!((c.restart_count, c.ready), (0, true), "still running until it exits");
    // The stop's SIGTERM ends it: the restart policy's path, with the probe's reason.
    let exit = exited(&st, "static-a", 143);
    plan(&mut st, exit, t0 + s(3));
    let report = status::build(&st);
    let c = &report.pods["static-a"].container_statuses[0];
    assert_eq!(c.restart_count, 1);
    assert!(!c.ready);
    assert_eq!(c.reason.as_deref(), Some("ContainerCreating"), "restarted at once, the first time");
    // Once running again, the status says how the last run ended.
    assert_eq!(st.pods["static-a"].ctrs[0].last_reason.as_deref(), Some("Liveness probe failed: exit 1"));
    assert!(
        report.pods["static-a"].message.as_deref().is_some_and(|m| m.contains("Liveness probe failed")),
        "{:?}",
        report.pods["static-a"].message
    );
}

#[test]
fn readiness_decides_the_containers_ready_flag_and_the_pods_condition() {
    let t0 = Instant::now();
    let s = Duration::from_secs;
    let mut st = state(t0);
    let mut p = pod("a", &["sleep", "1000"], RestartPolicy::Always);
    let mut ready = exec_probe(1, 1);
    ready.http_get = Some(specs::probe::HttpGetAction { path: None, port: 80, scheme: None, http_headers: vec![] });
    ready.exec = None;
    p.spec.containers[0].readiness_probe = Some(ready);
    p.spec.host_network = true;
    let first = run_probed(&mut st, t0, "static-a", p);
    let ready_now = |st: &mut State| {
        status::stamp_ready(st);
        let r = status::build(st);
        let pod = &r.pods["static-a"];
        (pod.container_statuses[0].ready, pod.conditions.first().map(|c| c.status))
    };
    use specs::api::ConditionStatus::{False, True};
    assert_eq!(ready_now(&mut st), (false, Some(False)), "not ready before a readiness success");
    assert_eq!(first, ["probe static-a/main readinessProbe Addr(127.0.0.1)"]);
    let ok = probed(&st, "static-a", ProbeKind::Readiness, t0, ProbeResult::Success);
    check(&mut st, ok, t0, &[]);
    assert_eq!(ready_now(&mut st), (true, Some(True)));
    check(&mut st, Event::Tick, t0 + s(1), &["probe static-a/main readinessProbe Addr(127.0.0.1)"]);
    let bad = probed(&st, "static-a", ProbeKind::Readiness, t0 + s(1), ProbeResult::Failure);
    check(&mut st, bad, t0 + s(1), &[]);
    assert_eq!(ready_now(&mut st), (false, Some(False)), "readiness never restarts, it only says not ready");
    assert_eq!(status::build(&st).pods["static-a"].container_statuses[0].restart_count, 0);
}

#[test]
fn a_pod_with_an_address_is_probed_there_and_a_stale_result_changes_nothing() {
    let t0 = Instant::now();
    let mut st = state(t0);
    let mut p = pod("a", &["sleep", "1000"], RestartPolicy::Always);
    let mut tcp = exec_probe(1, 1);
    tcp.exec = None;
    tcp.tcp_socket = Some(specs::probe::TcpSocketAction { port: 8080 });
    tcp.initial_delay_seconds = Some(5);
    p.spec.containers[0].liveness_probe = Some(tcp);
    run_pod(&mut st, t0, "static-a", p, 1);
    let e = &st.pods["static-a"];
    let sandbox = crate::cni::sandbox_id("static-a", &reconcile::log_uid(&e.pod, &e.hash));
    plan(&mut st, Event::PodNetwork { key: "static-a".into(), sandbox, ips: vec!["10.88.0.5/24".into()] }, t0);
    check(&mut st, Event::Tick, t0 + Duration::from_secs(4), &[]);
    check(&mut st, Event::Tick, t0 + Duration::from_secs(5), &["probe static-a/main livenessProbe Addr(10.88.0.5)"]);
    // A result for another incarnation's id is ignored.
    let stale = Event::Probed {
        key: "static-a".into(),
        container: "main".into(),
        id: "static-a_main_x_9".into(),
        kind: ProbeKind::Liveness,
        at: t0,
        result: ProbeResult::Failure,
        message: None,
    };
    check(&mut st, stale, t0, &[]);
}

#[test]
fn grpc_and_https_probes_run_from_the_agent() {
    let t0 = Instant::now();
    let mut st = state(t0);
    let mut p = pod("a", &["sleep", "1000"], RestartPolicy::Always);
    p.spec.host_network = true;
    p.spec.containers[0].liveness_probe = Some(specs::probe::Probe {
        grpc: Some(specs::probe::GrpcAction { port: 9000, service: None }),
        ..Default::default()
    });
    p.spec.containers[0].readiness_probe = Some(specs::probe::Probe {
        http_get: Some(specs::probe::HttpGetAction {
            path: None,
            port: 8443,
            scheme: Some(specs::probe::Scheme::Https),
            http_headers: vec![],
        }),
        ..Default::default()
    });
    let first = run_probed(&mut st, t0, "static-a", p);
    assert_eq!(
        first,
        ["probe static-a/main livenessProbe Addr(127.0.0.1)", "probe static-a/main readinessProbe Addr(127.0.0.1)"]
    );
    let report = status::build(&st);
    let pod = &report.pods["static-a"];
    assert!(!pod.container_statuses[0].ready, "not ready before its HTTPS readiness probe succeeds");
    assert_eq!(pod.message, None);
}

#[test]
fn what_an_ended_container_used_is_in_the_status_that_says_it_ended() {
    let t = Instant::now();
    let mut st = state(t);
    run_pod(&mut st, t, "static/a", pod("a", &["true"], RestartPolicy::Never), 1);
    let usage = specs::status::ContainerUsage { cpu_nanos: Some(7), max_rss_bytes: Some(4096), missing: None };
    let ended = Event::Exited { id: id_of(&st, "static/a"), code: 0, oom_killed: false, usage: Some(usage.clone()) };
    plan(&mut st, ended, t);
    let report = status::build(&st);
    let p = &report.pods["static/a"];
    assert_eq!((p.phase, p.container_statuses[0].usage.as_ref()), (PodPhase::Succeeded, Some(&usage)));
}
