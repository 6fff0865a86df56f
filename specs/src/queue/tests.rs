use super::*;
use crate::job::{JobSpec, JobStatus, MemberStatus, PodTemplate};
use crate::pod::{ObjectMeta, API_VERSION};
use crate::PodStatus;

fn job(name: &str, phase: JobPhase, reason: Option<&str>) -> Job {
    Job {
        api_version: API_VERSION.into(),
        kind: "Job".into(),
        metadata: ObjectMeta { name: name.into(), owner: Some("alice".into()), ..Default::default() },
        spec: JobSpec {
            template: PodTemplate::default(),
            parallelism: 2,
            active_deadline_seconds: Some(600),
            partition: Some("batch".into()),
            ..Default::default()
        },
        status: Some(JobStatus { phase, reason: reason.map(String::from), ..Default::default() }),
    }
}

/// Member `rank` of job `j`, on `node` if placed, in `phase` with `reason`.
fn member(j: &str, rank: u32, node: Option<&str>, phase: PodPhase, reason: Option<&str>) -> Pod {
    let mut p = Pod::new(job::member_name(j, rank), Default::default());
    p.metadata.labels.insert(job::JOB_LABEL.into(), j.into());
    p.metadata.annotations.insert(job::RANK_ANNOTATION.into(), rank.to_string());
    p.metadata.annotations.insert(job::SIZE_ANNOTATION.into(), "2".into());
    p.spec.node_name = node.map(String::from);
    p.status = Some(PodStatus { phase, reason: reason.map(String::from), ..Default::default() });
    p
}

const T: Times = Times { now: 1_000, submitted_ms: Some(100), started: Some(400), ended: None };

/// `job` with `pods` at `t`: its state, TIME, NODES and NODELIST(REASON).
fn check(job: &Job, pods: &[Pod], t: Times, expected: (State, u64, u32, &str)) {
    let members = members_of(job, pods);
    let r = row(job, &members, t);
    assert_eq!((r.state, r.time, r.nodes, r.nodelist_reason.as_str()), expected, "{}", job.metadata.name);
    assert_eq!((r.partition.as_str(), r.user.as_str(), r.time_limit), ("batch", "alice", Some(600)));
}

#[test]
fn states_times_and_reasons_as_squeue_shows_them() {
    use PodPhase::{Pending, Running, Succeeded};
    let waiting = |reason| vec![member("a", 0, None, Pending, reason), member("a", 1, None, Pending, reason)];
    let a = job("a", JobPhase::Pending, None);
    check(&a, &waiting(Some("Unschedulable")), T, (State::Pending, 0, 1, "(Resources)"));
    check(&a, &waiting(Some("Queued")), T, (State::Pending, 0, 1, "(Priority)"));
    check(&a, &waiting(Some("ArrayThrottled")), T, (State::Pending, 0, 1, "(JobArrayTaskLimit)"));
    check(&a, &waiting(None), T, (State::Pending, 0, 1, "(None)"));
    // Memberless while held or waiting for its dependency.
    check(&job("a", JobPhase::Pending, Some(job::HELD)), &[], T, (State::Pending, 0, 1, "(JobHeldUser)"));
    check(&job("a", JobPhase::Pending, Some(job::DEPENDENCY)), &[], T, (State::Pending, 0, 1, "(Dependency)"));
    // Spread: a node per member.
    let mut spread = a.clone();
    spread.spec.gang.placement = job::GangPlacement::Spread;
    check(&spread, &[], T, (State::Pending, 0, 2, "(None)"));

    // Running: the time since it started and its nodes in hostlist form.
    let r = job("r", JobPhase::Running, None);
    let on = vec![member("r", 0, Some("n01"), Running, None), member("r", 1, Some("n02"), Running, None)];
    check(&r, &on, T, (State::Running, 600, 2, "n[01-02]"));
    // Its priority: what its members carry, aged from their eligibility
    // (a day of the week's 1000 points is 143); none without members.
    let mut aged = on.clone();
    for p in &mut aged {
        p.metadata.annotations.insert(job::PRIORITY_ANNOTATION.into(), "5000".into());
        p.metadata.annotations.insert(job::ELIGIBLE_ANNOTATION.into(), "0".into());
    }
    let day = Times { now: 86_400, ..T };
    assert_eq!(row(&r, &members_of(&r, &aged), day).priority, Some(5_143));
    assert_eq!(row(&a, &[], day).priority, None);
    // Another job's pods are not its members.
    check(&r, &[on.clone(), waiting(None)].concat(), T, (State::Running, 600, 2, "n[01-02]"));

    // Ended: the time to its end; still stopping is CG.
    let ended = Times { ended: Some(700), ..T };
    let done = vec![member("d", 0, Some("n1"), Succeeded, None), member("d", 1, Some("n1"), Succeeded, None)];
    check(&job("d", JobPhase::Succeeded, None), &done, ended, (State::Completed, 300, 1, "n1"));
    let to = job("t", JobPhase::Failed, Some(job::DEADLINE_EXCEEDED));
    let stopping = vec![member("t", 0, Some("n1"), Running, Some(crate::status::TERMINATING))];
    check(&to, &stopping, ended, (State::Completing, 300, 1, "n1"));
    // Its members gone: where they ran is in the job's status.
    let mut to_gone = to.clone();
    to_gone.status.as_mut().expect("status").members =
        vec![MemberStatus { rank: 0, pod: "t-0".into(), node: Some("n4".into()), ..Default::default() }];
    check(&to_gone, &[], ended, (State::Timeout, 300, 1, "n4"));
    // Never placed: the reason it ended.
    let never = job("f", JobPhase::Failed, Some(job::DEPENDENCY_NEVER_SATISFIED));
    check(&never, &[], Times { started: None, ..ended }, (State::Failed, 0, 1, "(DependencyNeverSatisfied)"));
}

#[test]
fn hostlists_group_numbered_names() {
    let check = |names: &[&str], expected: &str| {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        assert_eq!(hostlist(&names), expected, "{names:?}");
    };
    check(&[], "");
    check(&["n1"], "n1");
    check(&["n1", "n2", "n3", "n5"], "n[1-3,5]");
    check(&["n09", "n10", "n11"], "n[09-11]");
    check(&["gpu2", "n1", "n2", "login"], "gpu2,n[1-2],login");
    // Different widths are different groups, as Slurm keeps them.
    check(&["n1", "n01"], "n1,n01");
}

#[test]
fn states_by_code_or_name_and_all() {
    use State::*;
    let check = |given: &str, expected: Result<Vec<State>, ()>| {
        let got = parse_states(given).map(|s| s.into_iter().collect::<Vec<_>>()).map_err(|_| ());
        assert_eq!(got, expected, "{given}");
    };
    check("PD", Ok(vec![Pending]));
    check("r,pd", Ok(vec![Pending, Running]));
    check("completing,TO,cd,F", Ok(vec![Completing, Completed, Failed, Timeout]));
    check("all", Ok(State::ALL.to_vec()));
    check("PD,XX", Err(()));
    check("", Err(()));
    assert!(State::ALL.iter().filter(|s| s.shown_by_default()).eq([Pending, Running, Completing].iter()));
}

#[test]
fn the_queue_lists_waiting_jobs_in_the_order_they_are_taken() {
    let row = |id: &str, state: State, priority: i64, submitted_ms: i64| Row {
        id: id.into(),
        partition: "-".into(),
        name: id.into(),
        user: "u".into(),
        state,
        time: 0,
        time_limit: None,
        nodes: 1,
        nodelist_reason: String::new(),
        priority: Some(priority),
        submitted_ms: Some(submitted_ms),
    };
    let mut rows = vec![
        row("run", State::Running, 9, 1),
        row("late", State::Pending, 0, 50),
        row("urgent", State::Pending, 5, 60),
        row("early", State::Pending, 0, 10),
        row("done", State::Completed, 0, 0),
    ];
    sort(&mut rows);
    let ids: Vec<&str> = rows.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(ids, ["urgent", "early", "late", "run", "done"]);
}
