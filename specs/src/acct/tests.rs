use super::*;
use crate::status::{ContainerStatus, PodStatus};
use crate::PodPhase;

/// 2026-11-29T00:00:00Z.
const DAY: i64 = 1_795_910_400;

#[test]
fn times_in_slurms_forms() {
    let now = DAY + 13 * 3600 + 25 * 60;
    let check = |s: &str, offset: i32, want: Result<i64, ()>| {
        assert_eq!(parse_time(s, now, offset).map_err(|_| ()), want, "{s:?} at offset {offset}");
    };
    check("2026-11-29", 0, Ok(DAY));
    check("2026-11-29T08:30", 0, Ok(DAY + 8 * 3600 + 30 * 60));
    check("2026-11-29T08:30:15", 0, Ok(DAY + 8 * 3600 + 30 * 60 + 15));
    check("2026-11-29T08:30", 3600, Ok(DAY + 7 * 3600 + 30 * 60));
    check("2024-02-29", 0, Ok(1_709_164_800));
    check("08:00", 0, Ok(DAY + 8 * 3600));
    check("now", 0, Ok(now));
    check("now-1day", 0, Ok(now - 86_400));
    check("now-2hours", 0, Ok(now - 7200));
    check("now+30", 0, Ok(now + 30));
    check("now-1week", 0, Ok(now - 7 * 86_400));
    check("today", 0, Ok(DAY));
    check("midnight", 3600, Ok(DAY - 3600));
    check("2026-13-01", 0, Err(()));
    check("25:00", 0, Err(()));
    check("yesterday", 0, Err(()));
    check("now-1fortnight", 0, Err(()));
    check("now*2", 0, Err(()));
}

#[test]
fn timestamps_and_durations_as_slurm_writes_them() {
    assert_eq!(timestamp(DAY + 8 * 3600 + 5, 0), "2026-11-29T08:00:05");
    assert_eq!(timestamp(DAY, -3600), "2026-11-28T23:00:00");
    assert_eq!(timestamp(1_709_164_800, 0), "2024-02-29T00:00:00");
    for (secs, want) in [(0, "00:00:00"), (59, "00:00:59"), (3661, "01:01:01"), (90_061, "1-01:01:01")] {
        assert_eq!(elapsed(secs), want);
    }
    for (nanos, want) in [
        (0, "00:00.000"),
        (1_234_000_000, "00:01.234"),
        (61_500_000_000, "01:01.500"),
        (3_661_000_000_000, "01:01:01"),
        (90_061_000_000_000, "1-01:01:01"),
    ] {
        assert_eq!(cpu_time(nanos), want);
    }
    assert_eq!(rss(0), "0K");
    assert_eq!(rss(1), "1K");
    assert_eq!(rss(2048), "2K");
}

#[test]
fn exit_codes_in_slurms_code_and_signal() {
    for (code, want) in [(0, (0, 0)), (3, (3, 0)), (127, (127, 0)), (128, (128, 0)), (137, (0, 9)), (143, (0, 15))] {
        assert_eq!(split_exit(code), want, "{code}");
    }
}

#[test]
fn columns_parse_case_insensitively_and_an_unknown_one_names_the_valid_ones() {
    assert_eq!(Column::parse_list("jobid,State,maxrss"), Ok(vec![Column::JobId, Column::State, Column::MaxRss]));
    assert_eq!(Column::parse_list("JobName%30,AllocCPUS"), Ok(vec![Column::JobName, Column::NCpus]));
    let err = Column::parse_list("JobID,Colour").err().unwrap_or_default();
    assert!(err.contains("\"Colour\"") && err.contains("TotalCPU") && err.contains("NodeList"), "{err}");
    assert!(Column::parse_list("").is_err());
    assert!(Column::parse_list(DEFAULT_FORMAT).is_ok());
}

fn pod(name: &str, phase: PodPhase, ctrs: &[(Option<i32>, Option<&str>, Option<ContainerUsage>)]) -> Pod {
    let mut p = crate::testing::pod(name).guaranteed("2", "64Mi").build();
    p.metadata.uid = Some(format!("u-{name}"));
    p.metadata.owner = Some("ada".into());
    p.spec.node_name = Some("n1".into());
    p.status = Some(PodStatus {
        phase,
        container_statuses: ctrs
            .iter()
            .map(|(code, reason, usage)| ContainerStatus {
                last_exit_code: *code,
                reason: reason.map(str::to_string),
                usage: usage.clone(),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    });
    p
}

fn usage(cpu: u64, rss: u64) -> Option<ContainerUsage> {
    Some(ContainerUsage { cpu_nanos: Some(cpu), max_rss_bytes: Some(rss), missing: None })
}

#[test]
fn a_pods_record_says_how_it_ended_with_its_figures() {
    let t = Times { submit: Some(DAY), start: Some(DAY + 1), end: DAY + 11 };
    let check = |p: Pod, cancelled: bool, want: (State, i32, i32)| {
        let r = pod_record(&p, t, cancelled);
        assert_eq!((r.state, r.exit_code, r.signal), want, "{}", p.metadata.name);
        r
    };
    let r = check(
        pod("ok", PodPhase::Succeeded, &[(Some(0), None, usage(5_000_000_000, 1 << 20))]),
        false,
        (State::Completed, 0, 0),
    );
    assert_eq!(
        (r.job_id.as_str(), r.user.as_str(), r.ncpus, r.nodes.clone()),
        ("ok", "ada", 2, vec!["n1".to_string()])
    );
    assert_eq!(
        (r.cpu_nanos, r.max_rss_bytes, r.mem_request_bytes),
        (Some(5_000_000_000), Some(1 << 20), Some(64 << 20))
    );
    assert_eq!(r.metadata.name, "pod.u-ok");
    check(
        pod("bad", PodPhase::Failed, &[(Some(0), None, None), (Some(3), Some("Error"), None)]),
        false,
        (State::Failed, 3, 0),
    );
    check(pod("oom", PodPhase::Failed, &[(Some(137), Some("OOMKilled"), None)]), false, (State::OutOfMemory, 0, 9));
    check(pod("gone", PodPhase::Running, &[]), true, (State::Cancelled, 0, 15));
    // Two containers: CPU time summed, memory the larger, a missing figure said once.
    let mut two = pod("two", PodPhase::Succeeded, &[(Some(0), None, usage(1, 10)), (Some(0), None, usage(2, 30))]);
    let (cpu, rss, missing) = pod_usage(&two);
    assert_eq!((cpu, rss, missing.len()), (Some(3), Some(30), 0));
    let lacking = ContainerUsage { cpu_nanos: Some(4), max_rss_bytes: None, missing: Some("no memory.peak".into()) };
    if let Some(s) = two.status.as_mut() {
        s.container_statuses[0].usage = Some(lacking);
    }
    assert_eq!(pod_usage(&two), (Some(6), Some(30), vec!["no memory.peak".to_string()]));
}

#[test]
fn a_members_record_is_a_step_of_its_job() {
    let mut p = pod("sim-1", PodPhase::Succeeded, &[(Some(0), None, None)]);
    p.metadata.labels.insert(crate::job::JOB_LABEL.into(), "sim".into());
    p.metadata.annotations.insert(crate::job::RANK_ANNOTATION.into(), "1".into());
    p.metadata.annotations.insert(crate::job::SIZE_ANNOTATION.into(), "2".into());
    let r = pod_record(&p, Times { end: DAY, ..Default::default() }, false);
    assert_eq!((r.job_id.as_str(), r.job_name.as_str(), r.member), ("sim.1", "sim", Some(1)));
}

fn record(job: &str, member: Option<u32>, start: i64, end: i64, user: &str) -> Record {
    Record {
        job_id: member.map_or(job.to_string(), |m| format!("{job}.{m}")),
        member,
        start: Some(start),
        end,
        user: user.into(),
        ..Default::default()
    }
}

#[test]
fn selection_by_window_user_and_job_keeps_members_under_their_job() {
    let all = vec![
        record("b", None, DAY + 100, DAY + 200, "ada"),
        record("a", Some(0), DAY + 10, DAY + 50, "ada"),
        record("a", None, DAY + 10, DAY + 60, "ada"),
        record("old", None, DAY - 900, DAY - 800, "ada"),
        record("c", None, DAY + 10, DAY + 20, "bob"),
    ];
    let ids = |v: Vec<&Record>| v.iter().map(|r| r.job_id.clone()).collect::<Vec<_>>();
    let window = (DAY, DAY + 1000);
    assert_eq!(ids(select(&all, &[], &[], window, false)), ["c", "a", "a.0", "b"]);
    assert_eq!(ids(select(&all, &["ada".into()], &[], window, false)), ["a", "a.0", "b"]);
    assert_eq!(ids(select(&all, &[], &[], window, true)), ["c", "a", "b"]);
    // A job named by id, whatever its time, with its members.
    assert_eq!(ids(select(&all, &[], &["a".into(), "old".into()], window, false)), ["old", "a", "a.0"]);
    // A job that ran across the window's start is in it.
    assert_eq!(ids(select(&all, &[], &[], (DAY + 55, DAY + 150), false)), ["a", "b"]);
}

#[test]
fn cells_and_retention() {
    let mut r = record("a", None, DAY, DAY + 3661, "ada");
    r.cpu_nanos = Some(1_500_000_000);
    r.nodes = vec!["n1".into(), "n2".into()];
    r.state = State::Timeout;
    r.signal = 15;
    let cells: Vec<String> = Column::parse_list("Start,End,Elapsed,State,ExitCode,TotalCPU,MaxRSS,NodeList,NNodes")
        .unwrap_or_default()
        .into_iter()
        .map(|c| cell(&r, c, 0))
        .collect();
    assert_eq!(
        cells,
        ["2026-11-29T00:00:00", "2026-11-29T01:01:01", "01:01:01", "TIMEOUT", "0:15", "00:01.500", "", "n[1-2]", "2"]
    );
    assert!(!expired(&r, DAY + 3661 + 86_400, 86_400));
    assert!(expired(&r, DAY + 3662 + 86_400, 86_400));
}

#[test]
fn efficiency_as_seff_reckons_it() {
    let mut r = record("a", None, DAY, DAY + 100, "ada");
    r.ncpus = 4;
    r.cpu_nanos = Some(200_000_000_000);
    r.max_rss_bytes = Some(16 << 20);
    r.mem_request_bytes = Some(64 << 20);
    r.nodes = vec!["n1".into()];
    let lines = efficiency(&r);
    assert!(lines.contains(&"Cores: 4".to_string()), "{lines:?}");
    assert!(lines.contains(&"CPU Utilized: 00:03:20".to_string()), "{lines:?}");
    assert!(lines.contains(&"CPU Efficiency: 50.00% of 00:06:40 core-walltime".to_string()), "{lines:?}");
    assert!(lines.contains(&"Memory Utilized: 16Mi".to_string()), "{lines:?}");
    assert!(lines.contains(&"Memory Efficiency: 25.00% of 64Mi".to_string()), "{lines:?}");
    for (part, whole, want) in [(1.0, 3.0, "33.33%"), (0.0, 0.0, "0.00%"), (5.0, 4.0, "125.00%")] {
        assert_eq!(percent(part, whole), want);
    }
    r.cpu_nanos = None;
    r.max_rss_bytes = None;
    let lines = efficiency(&r);
    assert!(lines.iter().any(|l| l.starts_with("CPU Utilized: unknown")), "{lines:?}");
}

#[test]
fn a_jobs_record_is_its_members_together_in_slurms_words() {
    use crate::job::{Job, JobPhase, JobStatus};
    let job = |phase: JobPhase, reason: Option<&str>| -> Job {
        let mut j: Job = serde_json::from_value(serde_json::json!({
            "apiVersion": "pinion.io/v1", "kind": "Job", "metadata": {"name": "sim", "owner": "ada", "uid": "u1"},
            "spec": {"parallelism": 2, "partition": "batch", "template": {"spec": {"containers": [{"name": "main",
                "image": "x", "resources": {"requests": {"cpu": "1500m", "memory": "1Gi"}}}]}}}
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        j.status = Some(JobStatus { phase, reason: reason.map(str::to_string), ..Default::default() });
        j
    };
    let ok = pod("sim-0", PodPhase::Succeeded, &[(Some(0), None, usage(3, 10))]);
    let bad = pod("sim-1", PodPhase::Failed, &[(Some(2), Some("Error"), usage(4, 20))]);
    let killed = pod("sim-1", PodPhase::Failed, &[(Some(137), Some("OOMKilled"), None)]);
    let t = Times { submit: None, start: Some(DAY), end: DAY + 60 };
    let check = |j: Job, members: &[&Pod], cancelled: bool, want: (State, i32, i32)| {
        let r = job_record(&j, members, t, cancelled);
        assert_eq!((r.state, r.exit_code, r.signal), want, "{:?} {cancelled}", j.status);
        r
    };
    let r = check(job(JobPhase::Succeeded, None), &[&ok, &ok], false, (State::Completed, 0, 0));
    // 2 members of 1.5 CPUs: 3; 1Gi each.
    assert_eq!((r.ncpus, r.mem_request_bytes, r.partition.as_deref()), (3, Some(2 << 30), Some("batch")));
    assert_eq!((r.job_id.as_str(), r.member, r.metadata.name.as_str()), ("sim", None, "job.u1"));
    let r = check(job(JobPhase::Failed, None), &[&ok, &bad], false, (State::Failed, 2, 0));
    assert_eq!((r.cpu_nanos, r.max_rss_bytes, r.nodes.clone()), (Some(7), Some(20), vec!["n1".to_string()]));
    check(job(JobPhase::Failed, None), &[&ok, &killed], false, (State::OutOfMemory, 0, 9));
    check(job(JobPhase::Failed, Some(crate::job::DEADLINE_EXCEEDED)), &[&ok], false, (State::Timeout, 0, 15));
    check(job(JobPhase::Running, None), &[], true, (State::Cancelled, 0, 15));
}

#[test]
fn states_by_slurms_names_and_codes() {
    assert_eq!(parse_states("CD,f,timeout"), Ok(vec![State::Completed, State::Failed, State::Timeout]));
    assert_eq!(
        parse_states("ca,OUT_OF_MEMORY,oom"),
        Ok(vec![State::Cancelled, State::OutOfMemory, State::OutOfMemory])
    );
    let err = parse_states("R").err().unwrap_or_default();
    assert!(err.contains("\"R\"") && err.contains("TO (TIMEOUT)"), "{err}");
}
