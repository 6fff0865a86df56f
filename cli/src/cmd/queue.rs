//! `pinion queue` (Slurm's `squeue`): one line per job, in Slurm's columns
//! and codes (`specs::queue`): JOBID, PARTITION, NAME, USER, ST (PD, R,
//! CG, CD, F, TO), TIME, TIME_LIMIT, NODES, PRIORITY, NODELIST(REASON). The
//! server's authorization already narrows a user's list to their own jobs;
//! `-u`, `-p`, `--me`, `-t` and `-j` narrow it further here. `pinion share`
//! (Slurm's `sshare`): each user's and account's recent usage and
//! fair-share factor. `pinion nodes` (Slurm's `sinfo`): each partition's
//! nodes by state, their CPUs allocated/idle/other/total and NUMA nodes.

use std::process::ExitCode;

use specs::queue::{self, State, Times};

use crate::common::GlobalArgs;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Only these users' jobs (comma-separated).
    #[arg(short = 'u', long = "user", value_delimiter = ',', value_name = "USER")]
    pub users: Vec<String>,
    /// Only jobs in these partitions (comma-separated).
    #[arg(short = 'p', long = "partition", value_delimiter = ',', value_name = "PARTITION")]
    pub partitions: Vec<String>,
    /// Only the caller's own jobs (`-u` with the credentials' name).
    #[arg(long)]
    pub me: bool,
    /// Only jobs in these states: PD, R, CG, CD, F, TO (or pending,
    /// running, ...), comma-separated, or `all` [default: PD,R,CG].
    #[arg(short = 't', long = "states", value_name = "STATES", value_parser = queue::parse_states)]
    pub states: Option<std::collections::BTreeSet<State>>,
    /// Only these jobs (comma-separated ids).
    #[arg(short = 'j', long = "jobs", value_delimiter = ',', value_name = "JOB")]
    pub jobs: Vec<String>,
}

/// An RFC 3339 time as Unix seconds.
fn unix(ts: Option<&str>) -> Option<i64> {
    unix_ms(ts).map(|ms| ms.div_euclid(1000))
}

/// An RFC 3339 time as Unix milliseconds (jobs submitted within a second
/// keep their order).
fn unix_ms(ts: Option<&str>) -> Option<i64> {
    ts.and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok()).map(|t| t.timestamp_millis())
}

/// The queue's lines for `jobs` and their members' `pods`, narrowed as
/// `args` says; `me`: the caller's name for `--me`.
pub fn rows(jobs: &[specs::job::Job], pods: &[specs::Pod], args: &Args, me: Option<&str>, now: i64) -> Vec<queue::Row> {
    let mut users: Vec<&str> = args.users.iter().map(String::as_str).collect();
    users.extend(me);
    let mut out: Vec<queue::Row> = jobs
        .iter()
        .map(|j| {
            let status = j.status.clone().unwrap_or_default();
            let t = Times {
                now,
                submitted_ms: unix_ms(j.metadata.creation_timestamp.as_deref()),
                started: unix(status.start_time.as_deref()),
                ended: unix(status.completion_time.as_deref()),
            };
            queue::row(j, &queue::members_of(j, pods), t)
        })
        .filter(|r| match &args.states {
            Some(states) => states.contains(&r.state),
            None => r.state.shown_by_default(),
        })
        .filter(|r| users.is_empty() || users.contains(&r.user.as_str()))
        .filter(|r| args.partitions.is_empty() || args.partitions.contains(&r.partition))
        .filter(|r| args.jobs.is_empty() || args.jobs.contains(&r.id))
        .collect();
    queue::sort(&mut out);
    out
}

/// The table, Slurm's columns; times as Slurm writes them.
pub fn table(rows: &[queue::Row]) -> String {
    let headers =
        ["JOBID", "PARTITION", "NAME", "USER", "ST", "TIME", "TIME_LIMIT", "NODES", "PRIORITY", "NODELIST(REASON)"];
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.id.clone(),
                r.partition.clone(),
                r.name.clone(),
                r.user.clone(),
                r.state.code().to_string(),
                specs::partition::time(r.time),
                r.time_limit.map_or_else(|| "UNLIMITED".to_string(), specs::partition::time),
                r.nodes.to_string(),
                r.priority.map_or_else(|| "-".to_string(), |p| p.to_string()),
                r.nodelist_reason.clone(),
            ]
        })
        .collect();
    super::get::table(&headers, &cells)
}

/// The caller's name as the server records it as an owner: `admin` for the
/// bootstrap certificate, a person's name for theirs.
pub(crate) fn caller(g: &GlobalArgs) -> anyhow::Result<String> {
    let creds = crate::config::load(g)?;
    let facts = pinion_wire::tls::CertificateFacts::from_pem(&creds.client_cert, "clientCert")?;
    let cn = facts.common_name.unwrap_or_default();
    Ok(cn.strip_prefix(orchestrator::tls::USER_CN_PREFIX).map(str::to_string).unwrap_or(cn))
}

pub async fn run(g: GlobalArgs, args: Args) -> anyhow::Result<ExitCode> {
    let me = if args.me { Some(caller(&g)?) } else { None };
    let client = crate::config::client(&g)?;
    let jobs = client.list_jobs(None).await?.items;
    let pods = client.list_pods(Some(specs::job::JOB_LABEL)).await?.items;
    let now = chrono::Utc::now().timestamp();
    let shown = rows(&jobs, &pods, &args, me.as_deref(), now);
    out!("{}", table(&shown));
    if let Some(line) = expected_start(&client, &jobs, &pods, now).await {
        outln!("{line}");
    }
    Ok(ExitCode::SUCCESS)
}

/// When the first job waiting for resources is expected to start: when
/// enough running jobs have reached their time limits to free its CPUs
/// (`specs::backfill::reservation`, the rule backfill keeps to), counted
/// over the jobs the caller sees and the nodes' free CPUs. `None` when no
/// job waits for resources or the nodes cannot be read.
async fn expected_start(
    client: &pinion_wire::Client,
    jobs: &[specs::job::Job],
    pods: &[specs::Pod],
    now: i64,
) -> Option<String> {
    let all = Args { users: vec![], partitions: vec![], me: false, states: None, jobs: vec![] };
    let every = rows(jobs, pods, &all, None, now);
    let first = every.iter().find(|r| r.state == State::Pending && r.nodelist_reason == "(Resources)")?;
    let job = jobs.iter().find(|j| j.metadata.name == first.id)?;
    let nodes = client.list_nodes(None).await.ok()?.items;
    let free: i128 = nodes.iter().flat_map(|n| &n.status.numa).map(|z| z.free_cpus.len() as i128 * 1000).sum();
    let running: Vec<specs::backfill::Running> = every
        .iter()
        .filter(|r| r.state == State::Running)
        .filter_map(|r| {
            let j = jobs.iter().find(|j| j.metadata.name == r.id)?;
            let millicpus = specs::partition::job_millicpus(j);
            Some(specs::backfill::Running { millicpus, ends_in: r.time_limit.map(|l| l.saturating_sub(r.time)) })
        })
        .collect();
    let need = specs::partition::job_millicpus(job);
    Some(match specs::backfill::reservation(need, free, &running) {
        Some(s) => format!(
            "first waiting job {}: expected to start within {} (when running jobs reach their time limits; jobs behind it start first only if they end by then)",
            first.id,
            specs::partition::time(s)
        ),
        None => format!("first waiting job {}: its start cannot be foreseen (a running job has no time limit)", first.id),
    })
}

#[derive(clap::Args, Debug)]
pub struct ShareArgs {}

/// `pinion share`: USER (or ACCOUNT), RAW_USAGE (decayed CPU-seconds),
/// USAGE (its part of all), FAIRSHARE (the factor, 1: used nothing lately).
pub async fn share(g: GlobalArgs, _args: ShareArgs) -> anyhow::Result<ExitCode> {
    let client = crate::config::client(&g)?;
    let shares = client.list_shares().await?.items;
    let rows: Vec<Vec<String>> = shares
        .iter()
        .map(|s| {
            vec![
                s.kind.clone(),
                s.name.clone(),
                format!("{:.0}", s.usage),
                format!("{:.6}", s.usage_share),
                format!("{:.6}", s.fair_share),
            ]
        })
        .collect();
    out!("{}", super::get::table(&["KIND", "NAME", "RAW_USAGE", "USAGE", "FAIRSHARE"], &rows));
    Ok(ExitCode::SUCCESS)
}

#[derive(clap::Args, Debug)]
pub struct NodesArgs {}

/// `pinion nodes`: PARTITION AVAIL TIMELIMIT NODES STATE CPUS(A/I/O/T) NUMA
/// NODELIST, a line per partition and state (`specs::partition::nodes_rows`).
pub async fn nodes(g: GlobalArgs, _args: NodesArgs) -> anyhow::Result<ExitCode> {
    let client = crate::config::client(&g)?;
    let partitions = client.list_partitions().await?.items;
    let nodes = client.list_nodes(None).await?.items;
    let rows: Vec<Vec<String>> = specs::partition::nodes_rows(&partitions, &nodes)
        .iter()
        .map(|r| {
            vec![
                r.partition.clone(),
                "up".into(),
                r.time_limit.map_or_else(|| "infinite".to_string(), specs::partition::time),
                r.nodes.len().to_string(),
                r.state.to_string(),
                r.cpus.slashed(),
                r.numa.clone(),
                queue::hostlist(&r.nodes),
            ]
        })
        .collect();
    let headers = ["PARTITION", "AVAIL", "TIMELIMIT", "NODES", "STATE", "CPUS(A/I/O/T)", "NUMA", "NODELIST"];
    out!("{}", super::get::table(&headers, &rows));
    Ok(ExitCode::SUCCESS)
}
