use super::*;
use crate::pod::Container;
use crate::status::{ContainerState, ContainerStatus, PodStatus};

fn job(parallelism: u32) -> Job {
    let spec = PodSpec {
        containers: vec![Container {
            name: "main".into(),
            rootfs: Some(crate::pod::RootfsSource::Host),
            command: vec!["true".into()],
            ..Default::default()
        }],
        restart_policy: RestartPolicy::Never,
        ..Default::default()
    };
    Job {
        api_version: API_VERSION.into(),
        kind: "Job".into(),
        metadata: ObjectMeta { name: "solver".into(), ..Default::default() },
        spec: JobSpec { template: PodTemplate { metadata: None, spec }, parallelism, ..Default::default() },
        status: None,
    }
}

fn member(phase: PodPhase, node: Option<&str>, exit: Option<i32>) -> Pod {
    let mut p = Pod::new("m", PodSpec::default());
    p.spec.node_name = node.map(String::from);
    let state = if phase.is_terminal() { ContainerState::Terminated } else { ContainerState::Running };
    p.status = Some(PodStatus {
        phase,
        container_statuses: vec![ContainerStatus {
            name: "main".into(),
            state,
            restart_count: 0,
            last_exit_code: exit,
            reason: exit.map(|c| if c == 0 { "Completed".into() } else { "Error".into() }),
            ready: !phase.is_terminal(),
            usage: None,
        }],
        ..Default::default()
    });
    p
}

#[test]
fn members_carry_the_gang_and_each_rank_its_identity() {
    let mut j = job(3);
    j.spec.gang.placement = GangPlacement::Spread;
    j.spec.gang.min_members = Some(2);
    j.spec.priority = 5;
    let ms = members(&j);
    assert_eq!(ms.iter().map(|p| p.metadata.name.as_str()).collect::<Vec<_>>(), ["solver-0", "solver-1", "solver-2"]);
    let g = Gang::of(&ms[1]).expect("a member");
    assert_eq!(
        g,
        Gang {
            job: "solver".into(),
            attempt: 0,
            rank: 1,
            size: 3,
            min_members: 2,
            placement: GangPlacement::Spread,
            max_nodes: None,
            per_node: None,
            priority: 5,
            eligible: None,
            time_limit: None,
        }
    );
    let env: Vec<(&str, &str)> =
        ms[2].spec.containers[0].env.iter().map(|v| (v.name.as_str(), v.value.as_str())).collect();
    assert_eq!(env, [("PINION_JOB", "solver"), ("PINION_RANK", "2"), ("PINION_WORLD_SIZE", "3")]);
    for m in &ms {
        assert!(crate::validate::validate_pod(m).is_empty(), "{:?}", crate::validate::validate_pod(m));
    }
    assert_eq!(Gang::of(&Pod::new("plain", PodSpec::default())), None);
}

#[test]
fn validation_names_each_field() {
    type Edit = Box<dyn Fn(&mut Job)>;
    let cases: Vec<(&str, Edit, &str)> = vec![
        ("zero members", Box::new(|j| j.spec.parallelism = 0), "spec.parallelism"),
        ("too many members", Box::new(|j| j.spec.parallelism = MAX_MEMBERS + 1), "spec.parallelism"),
        ("completions apart", Box::new(|j| j.spec.completions = Some(2)), "spec.completions"),
        ("min above size", Box::new(|j| j.spec.gang.min_members = Some(5)), "spec.gang.minMembers"),
        ("min zero", Box::new(|j| j.spec.gang.min_members = Some(0)), "spec.gang.minMembers"),
        ("no time", Box::new(|j| j.spec.active_deadline_seconds = Some(0)), "spec.activeDeadlineSeconds"),
        ("a bad dependency", Box::new(|j| j.spec.dependency = Some("before:x".into())), "spec.dependency"),
        ("a bad partition", Box::new(|j| j.spec.partition = Some("Batch".into())), "spec.partition"),
        ("itself", Box::new(|j| j.spec.dependency = Some("afterok:solver".into())), "spec.dependency"),
        (
            "never ends",
            Box::new(|j| j.spec.template.spec.restart_policy = RestartPolicy::Always),
            "spec.template.spec.restartPolicy",
        ),
        (
            "placed by hand",
            Box::new(|j| j.spec.template.spec.node_name = Some("n1".into())),
            "spec.template.spec.nodeName",
        ),
        ("bad name", Box::new(|j| j.metadata.name = "Solver".into()), "metadata.name"),
        ("member name too long", Box::new(|j| j.metadata.name = "a".repeat(62)), "metadata.name"),
        ("template container", Box::new(|j| j.spec.template.spec.containers.clear()), "spec.template.spec.containers"),
        ("kind", Box::new(|j| j.kind = "Pod".into()), "kind"),
        ("zero nodes", Box::new(|j| j.spec.gang.nodes = Some(0)), "spec.gang.nodes"),
        ("more nodes than members", Box::new(|j| j.spec.gang.nodes = Some(5)), "spec.gang.nodes"),
        (
            "nodes too few to hold them",
            Box::new(|j| {
                j.spec.gang.nodes = Some(1);
                j.spec.gang.per_node = Some(3)
            }),
            "spec.gang.perNode",
        ),
    ];
    assert!(validate_job(&job(4)).is_empty(), "{:?}", validate_job(&job(4)));
    let mut ok = job(4);
    ok.spec.dependency = Some("afterok:a:b,afterany:c".into());
    ok.spec.active_deadline_seconds = Some(60);
    assert!(validate_job(&ok).is_empty(), "{:?}", validate_job(&ok));
    ok.spec.dependency = Some("singleton".into());
    assert!(validate_job(&ok).is_empty(), "singleton: {:?}", validate_job(&ok));
    for (what, change, field) in cases {
        let mut j = job(4);
        change(&mut j);
        let errs = validate_job(&j);
        assert!(errs.iter().any(|e| e.field == field), "{what}: want {field}, got {errs:?}");
    }
}

#[test]
fn judge_table() {
    use PodPhase::*;
    struct Case {
        what: &'static str,
        members: Vec<Option<Pod>>,
        backoff_limit: u32,
        policy: FailurePolicy,
        phase: JobPhase,
        action: JobAction,
    }
    let run = |n: &str| Some(member(Running, Some(n), None));
    let ok = || Some(member(Succeeded, Some("n1"), Some(0)));
    let bad = || Some(member(Failed, Some("n2"), Some(3)));
    let pending = || Some(member(Pending, None, None));
    let cases = vec![
        Case {
            what: "nothing placed",
            members: vec![pending(), pending()],
            backoff_limit: 0,
            policy: FailurePolicy::StopAll,
            phase: JobPhase::Pending,
            action: JobAction::None,
        },
        Case {
            what: "half placed",
            members: vec![run("n1"), pending()],
            backoff_limit: 0,
            policy: FailurePolicy::StopAll,
            phase: JobPhase::Pending,
            action: JobAction::None,
        },
        Case {
            what: "all running",
            members: vec![run("n1"), run("n2")],
            backoff_limit: 0,
            policy: FailurePolicy::StopAll,
            phase: JobPhase::Running,
            action: JobAction::None,
        },
        Case {
            what: "one done, one running",
            members: vec![ok(), run("n2")],
            backoff_limit: 0,
            policy: FailurePolicy::StopAll,
            phase: JobPhase::Running,
            action: JobAction::None,
        },
        Case {
            what: "all done",
            members: vec![ok(), ok()],
            backoff_limit: 0,
            policy: FailurePolicy::StopAll,
            phase: JobPhase::Succeeded,
            action: JobAction::None,
        },
        Case {
            what: "a failure stops the rest",
            members: vec![run("n1"), bad(), pending()],
            backoff_limit: 0,
            policy: FailurePolicy::StopAll,
            phase: JobPhase::Failed,
            action: JobAction::Stop(vec!["solver-0".into(), "solver-2".into()]),
        },
        Case {
            what: "a failure, nothing left to stop",
            members: vec![ok(), bad()],
            backoff_limit: 0,
            policy: FailurePolicy::StopAll,
            phase: JobPhase::Failed,
            action: JobAction::None,
        },
        Case {
            what: "keep running",
            members: vec![run("n1"), bad()],
            backoff_limit: 0,
            policy: FailurePolicy::KeepRunning,
            phase: JobPhase::Running,
            action: JobAction::None,
        },
        Case {
            what: "keep running, all ended",
            members: vec![ok(), bad()],
            backoff_limit: 0,
            policy: FailurePolicy::KeepRunning,
            phase: JobPhase::Failed,
            action: JobAction::None,
        },
        Case {
            what: "a retry left",
            members: vec![run("n1"), bad()],
            backoff_limit: 1,
            policy: FailurePolicy::StopAll,
            phase: JobPhase::Pending,
            action: JobAction::Retry,
        },
        Case {
            what: "a member deleted",
            members: vec![run("n1"), None],
            backoff_limit: 0,
            policy: FailurePolicy::StopAll,
            phase: JobPhase::Failed,
            action: JobAction::Stop(vec!["solver-0".into()]),
        },
    ];
    for c in cases {
        let mut j = job(c.members.len() as u32);
        j.spec.backoff_limit = c.backoff_limit;
        j.spec.failure_policy = c.policy;
        let refs: Vec<Option<&Pod>> = c.members.iter().map(Option::as_ref).collect();
        let v = judge(&j, &refs, None);
        assert_eq!((v.status.phase, &v.action), (c.phase, &c.action), "{}", c.what);
    }
}

#[test]
fn the_first_failure_is_kept_and_an_ended_job_stays_ended() {
    let j = job(2);
    let (a, b) = (member(PodPhase::Failed, Some("n2"), Some(3)), member(PodPhase::Running, Some("n1"), None));
    let v = judge(&j, &[Some(&b), Some(&a)], None);
    assert_eq!(v.status.first_failure.as_deref(), Some("rank 1 (solver-1) on n2 failed: exit code 3 (Error)"));
    assert_eq!(v.status.members[0].reason.as_deref(), Some("StoppedByJob"));
    let mut ended = j.clone();
    ended.status = Some(v.status.clone());
    let again = judge(&ended, &[None, None], None);
    assert_eq!(again.status, v.status);
    assert_eq!(again.action, JobAction::None);
}

#[test]
fn a_retry_counts_its_attempt_and_new_members_carry_it() {
    let mut j = job(2);
    j.spec.backoff_limit = 2;
    let failed = member(PodPhase::Failed, Some("n1"), Some(1));
    let v = judge(&j, &[Some(&failed), None], None);
    assert_eq!((v.action, v.status.attempt), (JobAction::Retry, 1));
    j.status = Some(v.status);
    let ms = members(&j);
    assert_eq!(Gang::of(&ms[0]).map(|g| g.attempt), Some(1));
    assert_eq!(ms[1], crate::job::member(&j, 1));
    // Attempt 1 fails too: a retry is left, and the first failure stays attempt 0's.
    let again = member(PodPhase::Failed, Some("n2"), Some(2));
    let v = judge(&j, &[None, Some(&again)], None);
    assert_eq!((v.action, v.status.attempt), (JobAction::Retry, 2));
    assert_eq!(
        v.status.first_failure.as_deref(),
        Some("attempt 0: rank 0 (solver-0) on n1 failed: exit code 1 (Error)")
    );
}

#[test]
fn a_job_past_its_time_limit_fails_and_stops_its_members() {
    let run = |n: &str| Some(member(PodPhase::Running, Some(n), None));
    let ok = || Some(member(PodPhase::Succeeded, Some("n1"), Some(0)));
    // (what, limit, running for, members, phase, reason, action)
    type Case = (&'static str, Option<u64>, Option<u64>, Vec<Option<Pod>>, JobPhase, Option<&'static str>, JobAction);
    let cases: Vec<Case> = vec![
        ("no limit", None, Some(10_000), vec![run("n1")], JobPhase::Running, None, JobAction::None),
        (
            "not started",
            Some(60),
            None,
            vec![Some(member(PodPhase::Pending, None, None))],
            JobPhase::Pending,
            None,
            JobAction::None,
        ),
        ("within", Some(60), Some(59), vec![run("n1"), run("n2")], JobPhase::Running, None, JobAction::None),
        (
            "at the limit",
            Some(60),
            Some(60),
            vec![run("n1"), ok()],
            JobPhase::Failed,
            Some(DEADLINE_EXCEEDED),
            JobAction::Stop(vec!["solver-0".into()]),
        ),
        ("past it, all succeeded", Some(60), Some(90), vec![ok(), ok()], JobPhase::Succeeded, None, JobAction::None),
    ];
    for (what, limit, running_for, members, phase, reason, action) in cases {
        let mut j = job(members.len() as u32);
        j.spec.active_deadline_seconds = limit;
        let refs: Vec<Option<&Pod>> = members.iter().map(Option::as_ref).collect();
        let v = judge(&j, &refs, running_for);
        assert_eq!((v.status.phase, v.status.reason.as_deref(), &v.action), (phase, reason, &action), "{what}");
        if reason.is_some() {
            assert_eq!(v.status.members[0].reason.as_deref(), Some(DEADLINE_EXCEEDED), "{what}");
            assert_eq!(v.status.message.as_deref(), Some("the job ran past its time limit of 60 s"), "{what}");
        }
    }
    let mut j = job(1);
    assert_eq!(time_left(&j, Some(5)), None);
    j.spec.active_deadline_seconds = Some(60);
    assert_eq!((time_left(&j, None), time_left(&j, Some(5)), time_left(&j, Some(100))), (None, Some(55), Some(0)));
}
