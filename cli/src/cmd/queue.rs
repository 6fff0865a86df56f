//! `pinion queue` (Slurm's `squeue`): one line per job, in Slurm's columns
//! and codes (`specs::queue`): JOBID, PARTITION, NAME, USER, ST (PD, R,
//! CG, CD, F, TO), TIME, TIME_LIMIT, NODES, PRIORITY, NODELIST(REASON). The
//! server's authorization already narrows a user's list to their own jobs;
//! `-u`, `-p`, `--me`, `-t` and `-j` narrow it further here. `pinion share`
//! (Slurm's `sshare`): each user's and account's recent usage and
//! fair-share factor.

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
fn caller(g: &GlobalArgs) -> anyhow::Result<String> {
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
    out!("{}", table(&rows(&jobs, &pods, &args, me.as_deref(), now)));
    Ok(ExitCode::SUCCESS)
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
