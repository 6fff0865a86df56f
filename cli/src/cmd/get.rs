//! `pinion get pods|nodes|jobs|deployments|daemonsets|partitions [NAME] [-o wide|json|yaml] [-l SELECTOR]`: aligned
//! tables for people, stable JSON/YAML (the API objects as the server returns
//! them, fields in a fixed order) for scripts.

use std::collections::BTreeMap;
use std::process::ExitCode;

use anyhow::Context;
use specs::api::{List, Node, NodeCondition};
use specs::status::ContainerState;
use specs::Pod;

use crate::common::{GlobalArgs, Resumes};

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    #[value(alias = "pod", alias = "po")]
    Pods,
    #[value(alias = "node", alias = "no")]
    Nodes,
    #[value(alias = "job")]
    Jobs,
    #[value(alias = "deployment", alias = "deploy")]
    Deployments,
    #[value(name = "daemonsets", alias = "daemonset", alias = "ds")]
    DaemonSets,
    #[value(alias = "partition")]
    Partitions,
}

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Wide,
    Json,
    Yaml,
}

#[derive(clap::Args, Debug)]
pub struct Args {
    pub kind: Kind,
    pub name: Option<String>,
    /// Output: a table (default), `wide` (more columns), `json` or `yaml`.
    #[arg(short = 'o', long = "output")]
    pub output: Option<Format>,
    /// Label selector, e.g. `app=web,tier!=db`.
    #[arg(short = 'l', long = "selector")]
    pub selector: Option<String>,
    /// Pods: after the table, print a row for every change until interrupted.
    #[arg(short = 'w', long = "watch")]
    pub watch: bool,
}

/// One object (`get KIND NAME`) or a list, as the server returned it.
enum Fetched<T> {
    One(T),
    Many(List<T>),
}

/// Prints what was fetched as JSON or YAML when asked (`None`: done), else
/// hands back the objects for a table.
fn shown<T: serde::Serialize>(fetched: Fetched<T>, structured: Option<Format>) -> anyhow::Result<Option<Vec<T>>> {
    match (fetched, structured) {
        (Fetched::One(x), Some(f)) => print_structured(&x, f).map(|()| None),
        (Fetched::Many(l), Some(f)) => print_structured(&l, f).map(|()| None),
        (Fetched::One(x), None) => Ok(Some(vec![x])),
        (Fetched::Many(l), None) => Ok(Some(l.items)),
    }
}

/// Columns padded to the widest cell, three spaces apart.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let widths = widths(headers.iter().map(|h| h.len()).collect(), rows);
    let mut out = line(&widths, headers);
    for r in rows {
        out.push_str(&line(&widths, r));
    }
    out
}

/// `start` widened to the widest cell of each column.
fn widths(mut start: Vec<usize>, rows: &[Vec<String>]) -> Vec<usize> {
    for r in rows {
        for (w, c) in start.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    start
}

/// One row, each cell but the last padded to its column's width plus three.
fn line(widths: &[usize], cells: &[impl AsRef<str>]) -> String {
    let mut out = String::new();
    for (i, c) in cells.iter().map(AsRef::as_ref).enumerate() {
        out.push_str(c);
        if i + 1 < cells.len() {
            out.push_str(&" ".repeat(widths.get(i).copied().unwrap_or(0).saturating_sub(c.chars().count()) + 3));
        }
    }
    out.push('\n');
    out
}

/// `5s`, `3m`, `2h`, `4d` since an RFC 3339 time.
pub fn age(ts: Option<&str>) -> String {
    let Some(t) = ts.and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok()) else { return "-".into() };
    let secs = (chrono::Utc::now() - t.with_timezone(&chrono::Utc)).num_seconds().max(0);
    short_duration(secs)
}

/// `5s`, `3m`, `2h`, `4d`: a duration in seconds, as AGE shows it.
pub fn short_duration(secs: i64) -> String {
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}

fn print_structured<T: serde::Serialize>(v: &T, format: Format) -> anyhow::Result<()> {
    match format {
        Format::Yaml => out!("{}", serde_yaml_ng::to_string(v)?),
        _ => outln!("{}", serde_json::to_string_pretty(v)?),
    }
    Ok(())
}

/// What kubectl shows in STATUS: a container's waiting reason
/// (`ContainerCreating`, `CrashLoopBackOff`) or terminated reason
/// (`Completed`, `Error`, `OOMKilled`, else `ExitCode:N`) before the phase;
/// `Terminating`-like states are the phase's.
pub fn pod_status(p: &Pod) -> String {
    let s = p.status.clone().unwrap_or_default();
    let mut shown = None;
    for c in &s.container_statuses {
        let r = match c.state {
            ContainerState::Waiting => c.reason.clone(),
            ContainerState::Terminated => {
                c.reason.clone().or_else(|| c.last_exit_code.map(|code| format!("ExitCode:{code}")))
            }
            ContainerState::Running => None,
        };
        // The first container with something to say, as kubectl's last wins
        // among init containers only.
        if let Some(r) = r.filter(|r| !r.is_empty()) {
            shown = Some(r);
            break;
        }
    }
    // A pod its node is stopping holds its resources until it has: said,
    // with the grace left before the node kills what remains.
    if s.reason.as_deref() == Some(specs::status::TERMINATING) {
        return match s.grace_ends.as_deref().and_then(seconds_until) {
            Some(left) => format!("Terminating ({left}s)"),
            None => specs::status::TERMINATING.into(),
        };
    }
    // A running pod the node's changed settings no longer allow says so
    // (as kubectl's STATUS says Terminating); `describe` says why.
    let misfit = s.reason.filter(|r| r == specs::engine::SETTINGS_MISFIT && s.phase == specs::PodPhase::Running);
    shown.or(misfit).unwrap_or_else(|| format!("{:?}", s.phase))
}

/// Names as a person orders them: runs of digits by their value, the rest
/// as text (`sweep-2` < `sweep-10` < `sweep-100`).
fn natural_order(a: &str, b: &str) -> std::cmp::Ordering {
    /// The next run of digits, or of anything else, and what follows it.
    fn run(s: &str) -> (&str, &str) {
        let digits = s.starts_with(|c: char| c.is_ascii_digit());
        let end = s.find(|c: char| c.is_ascii_digit() != digits).unwrap_or(s.len());
        s.split_at(end)
    }
    let (mut a, mut b) = (a, b);
    while !a.is_empty() && !b.is_empty() {
        let ((x, rest_a), (y, rest_b)) = (run(a), run(b));
        let both_digits = x.starts_with(|c: char| c.is_ascii_digit()) && y.starts_with(|c: char| c.is_ascii_digit());
        let order = if both_digits {
            // By value without parsing (any length): fewer significant digits first.
            let (x, y) = (x.trim_start_matches('0'), y.trim_start_matches('0'));
            x.len().cmp(&y.len()).then_with(|| x.cmp(y))
        } else {
            x.cmp(y)
        };
        if order != std::cmp::Ordering::Equal {
            return order;
        }
        (a, b) = (rest_a, rest_b);
    }
    a.len().cmp(&b.len())
}

/// Whole seconds from now until an RFC 3339 time still to come.
fn seconds_until(at: &str) -> Option<i64> {
    let at = chrono::DateTime::parse_from_rfc3339(at).ok()?;
    let left = at.signed_duration_since(chrono::Utc::now()).num_seconds();
    (left > 0).then_some(left)
}

/// Restarts of all the pod's containers.
pub fn pod_restarts(p: &Pod) -> u32 {
    p.status.as_ref().map_or(0, |s| s.container_statuses.iter().map(|c| c.restart_count).sum())
}

fn pod_row(p: &Pod, wide: bool) -> Vec<String> {
    let s = p.status.clone().unwrap_or_default();
    let mut row = vec![
        p.metadata.name.clone(),
        pod_status(p),
        pod_restarts(p).to_string(),
        p.spec.node_name.clone().unwrap_or_else(|| "-".into()),
        age(p.metadata.creation_timestamp.as_deref()),
    ];
    if wide {
        let (numa, cpus) = match &s.placement {
            Some(pl) => (
                pl.numa_affinity.to_string(),
                pl.containers.iter().map(|c| format!("{}:{}", c.name, c.cpus)).collect::<Vec<_>>().join(" "),
            ),
            None => ("-".into(), "-".into()),
        };
        row.push(if numa.is_empty() { "-".into() } else { numa });
        row.push(if cpus.is_empty() { "-".into() } else { cpus });
        row.push(s.pod_ip.clone().unwrap_or_else(|| "-".into()));
        row.push(s.attempts.to_string());
        // A failed pull's cause is the registry's answer, and a pull in
        // progress says so: shown with them.
        let reason = match (s.reason, &s.message) {
            (Some(r), Some(m)) if r.starts_with("ErrImage") => m.clone(),
            (Some(r), Some(m)) if m.starts_with("pulling image ") => format!("{r}: {m}"),
            (r, _) => r.unwrap_or_else(|| "-".into()),
        };
        row.push(reason);
        row.push(p.metadata.owner.clone().unwrap_or_else(|| "-".into()));
    }
    row
}

/// `Ready`, then what else is wrong, as kubectl's "Ready,SchedulingDisabled":
/// `Ready,CpusOffline,PodNetwork=False`.
fn node_status(n: &Node) -> String {
    let mut words = vec![match n.status.condition {
        NodeCondition::Ready => "Ready".to_string(),
        NodeCondition::NotReady => "NotReady".to_string(),
    }];
    if !n.status.offline_cpus.is_empty() {
        words.push("CpusOffline".into());
    }
    words.extend(n.status.conditions.iter().map(specs::api::Condition::short));
    words.join(",")
}

fn node_row(n: &Node, wide: bool) -> Vec<String> {
    let t = &n.spec.topology;
    let free: usize = n.status.numa.iter().map(|z| z.free_cpus.len()).sum();
    let mut row = vec![
        n.metadata.name.clone(),
        node_status(n),
        t.cpus.len().to_string(),
        free.to_string(),
        t.numa_nodes.len().to_string(),
        age(n.metadata.creation_timestamp.as_deref()),
    ];
    if wide {
        let per: Vec<String> =
            n.status.numa.iter().map(|z| format!("{}:{}/{}", z.id, z.free_cpus.len(), z.cpus.len())).collect();
        row.push(if per.is_empty() { "-".into() } else { per.join(" ") });
        row.push(n.status.allocations.pods.len().to_string());
        let labels: Vec<String> = n.metadata.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        row.push(if labels.is_empty() { "-".into() } else { labels.join(",") });
    }
    row
}

/// A partition as `sinfo`'s admin would read it: times as Slurm writes
/// them, `UNLIMITED` where there is no limit, `all` for every node or user.
fn partition_row(p: &specs::partition::Partition) -> Vec<String> {
    let s = &p.spec;
    let time = |t: Option<u64>| t.map_or_else(|| "UNLIMITED".to_string(), specs::partition::time);
    let labels: Vec<String> = s.node_selector.iter().map(|(k, v)| format!("{k}={v}")).collect();
    vec![
        p.metadata.name.clone(),
        if s.default { "yes" } else { "-" }.into(),
        if labels.is_empty() { "all".into() } else { labels.join(",") },
        time(s.default_time_seconds.or(s.max_time_seconds)),
        time(s.max_time_seconds),
        s.max_cpus_per_job.map_or_else(|| "UNLIMITED".to_string(), |c| c.to_string()),
        if s.allowed_users.is_empty() { "all".into() } else { s.allowed_users.join(",") },
        age(p.metadata.creation_timestamp.as_deref()),
    ]
}

pub async fn run(g: GlobalArgs, args: Args) -> anyhow::Result<ExitCode> {
    let client = crate::config::client(&g)?;
    let wide = args.output == Some(Format::Wide);
    let structured = args.output.filter(|f| *f != Format::Wide);
    if args.watch && (args.kind != Kind::Pods || structured.is_some()) {
        anyhow::bail!("--watch: only for a table of pods (`pinion get pods -w [-o wide] [-l SELECTOR]`)");
    }
    match args.kind {
        Kind::Pods if args.watch => return watch_pods(&client, &args, wide).await,
        Kind::Pods => {
            let fetched = match &args.name {
                Some(n) => Fetched::One(client.get_pod(n).await?),
                None => Fetched::Many(client.list_pods(args.selector.as_deref()).await?),
            };
            let Some(pods) = shown(fetched, structured)? else { return Ok(ExitCode::SUCCESS) };
            if pods.is_empty() {
                eprintln!("no pods");
                return Ok(ExitCode::SUCCESS);
            }
            let headers = pod_headers(wide);
            let mut rows: Vec<Vec<String>> = pods.iter().map(|p| pod_row(p, wide)).collect();
            // An array's tasks in their order: sweep-2 before sweep-10.
            rows.sort_by(|a, b| natural_order(&a[0], &b[0]));
            out!("{}", table(&headers, &rows));
        }
        Kind::Jobs => {
            let fetched = match &args.name {
                Some(n) => Fetched::One(client.get_job(n).await?),
                None => Fetched::Many(client.list_jobs(args.selector.as_deref()).await?),
            };
            let Some(jobs) = shown(fetched, structured)? else { return Ok(ExitCode::SUCCESS) };
            if jobs.is_empty() {
                eprintln!("no jobs");
                return Ok(ExitCode::SUCCESS);
            }
            // One list of every job's members (pods labelled with their job).
            let pods = client.list_pods(Some(specs::job::JOB_LABEL)).await?.items;
            let mut by_job: BTreeMap<&str, Vec<&Pod>> = BTreeMap::new();
            for p in &pods {
                if let Some((job, _, _)) = specs::job::membership(p) {
                    by_job.entry(job).or_default().push(p);
                }
            }
            let headers =
                ["NAME", "STATUS", "MEMBERS", "RUNNING", "SUCCEEDED", "FAILED", "PLACEMENT", "PRIORITY", "AGE"];
            let rows: Vec<Vec<String>> = jobs
                .iter()
                .map(|j| job_row(j, by_job.get(j.metadata.name.as_str()).map(Vec::as_slice).unwrap_or_default()))
                .collect();
            out!("{}", table(&headers, &rows));
        }
        Kind::Deployments => {
            let fetched = match &args.name {
                Some(n) => Fetched::One(client.get_deployment(n).await?),
                None => Fetched::Many(client.list_deployments(args.selector.as_deref()).await?),
            };
            let Some(items) = shown(fetched, structured)? else { return Ok(ExitCode::SUCCESS) };
            if items.is_empty() {
                eprintln!("no deployments");
                return Ok(ExitCode::SUCCESS);
            }
            let rows: Vec<Vec<String>> = items.iter().map(deployment_row).collect();
            out!("{}", table(&DEPLOYMENT_HEADERS, &rows));
        }
        Kind::DaemonSets => {
            let fetched = match &args.name {
                Some(n) => Fetched::One(client.get_daemonset(n).await?),
                None => Fetched::Many(client.list_daemonsets(args.selector.as_deref()).await?),
            };
            let Some(items) = shown(fetched, structured)? else { return Ok(ExitCode::SUCCESS) };
            if items.is_empty() {
                eprintln!("no daemonsets");
                return Ok(ExitCode::SUCCESS);
            }
            let rows: Vec<Vec<String>> = items.iter().map(daemonset_row).collect();
            out!("{}", table(&DAEMONSET_HEADERS, &rows));
        }
        Kind::Partitions => {
            let fetched = match &args.name {
                Some(n) => Fetched::One(client.get_partition(n).await?),
                None => Fetched::Many(client.list_partitions().await?),
            };
            let Some(items) = shown(fetched, structured)? else { return Ok(ExitCode::SUCCESS) };
            if items.is_empty() {
                eprintln!("no partitions");
                return Ok(ExitCode::SUCCESS);
            }
            let headers = ["NAME", "DEFAULT", "NODES", "DEFAULT_TIME", "MAX_TIME", "MAX_CPUS", "USERS", "AGE"];
            let rows: Vec<Vec<String>> = items.iter().map(partition_row).collect();
            out!("{}", table(&headers, &rows));
        }
        Kind::Nodes => {
            let fetched = match &args.name {
                Some(n) => Fetched::One(client.get_node(n).await?),
                None => Fetched::Many(client.list_nodes(args.selector.as_deref()).await?),
            };
            let Some(nodes) = shown(fetched, structured)? else { return Ok(ExitCode::SUCCESS) };
            if nodes.is_empty() {
                eprintln!("no nodes");
                return Ok(ExitCode::SUCCESS);
            }
            let mut headers = vec!["NAME", "STATUS", "CPUS", "FREE", "NUMA", "AGE"];
            if wide {
                headers.extend(["FREE-PER-NUMA", "PODS", "LABELS"]);
            }
            let rows: Vec<Vec<String>> = nodes.iter().map(|n| node_row(n, wide)).collect();
            out!("{}", table(&headers, &rows));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// A job's row: its phase, and its members counted by phase (the live pods
/// while it runs, the job's own record once it ended and they are gone).
pub fn job_row(j: &specs::job::Job, members: &[&Pod]) -> Vec<String> {
    use specs::PodPhase;
    let status = j.status.clone().unwrap_or_default();
    let phases: Vec<PodPhase> = if members.is_empty() {
        status.members.iter().map(|m| m.phase).collect()
    } else {
        members.iter().map(|p| p.status.as_ref().map(|s| s.phase).unwrap_or_default()).collect()
    };
    let count = |ph: PodPhase| phases.iter().filter(|p| **p == ph).count().to_string();
    let g = &j.spec.gang;
    let mut placement = g.placement.as_str().to_string();
    if let Some(n) = g.nodes {
        placement.push_str(&format!(",nodes={n}"));
    }
    if let Some(k) = g.per_node {
        placement.push_str(&format!(",per-node={k}"));
    }
    if let Some(m) = g.min_members {
        placement.push_str(&format!(",min={m}"));
    }
    // Why it waits or ended (Dependency, DeadlineExceeded...), Slurm's REASON.
    let phase = match &status.reason {
        Some(r) => format!("{:?}({r})", status.phase),
        None => format!("{:?}", status.phase),
    };
    vec![
        j.metadata.name.clone(),
        phase,
        j.spec.parallelism.to_string(),
        count(PodPhase::Running),
        count(PodPhase::Succeeded),
        count(PodPhase::Failed),
        placement,
        j.spec.priority.to_string(),
        age(j.metadata.creation_timestamp.as_deref()),
    ]
}

pub const DEPLOYMENT_HEADERS: [&str; 5] = ["NAME", "READY", "UP-TO-DATE", "AVAILABLE", "AGE"];

/// A Deployment's row, as kubectl's: READY is ready of the replicas wanted.
pub fn deployment_row(d: &specs::deployment::Deployment) -> Vec<String> {
    let s = d.status.clone().unwrap_or_default();
    vec![
        d.metadata.name.clone(),
        format!("{}/{}", s.ready_replicas, d.spec.replicas),
        s.updated_replicas.to_string(),
        s.available_replicas.to_string(),
        age(d.metadata.creation_timestamp.as_deref()),
    ]
}

pub const DAEMONSET_HEADERS: [&str; 7] = ["NAME", "DESIRED", "CURRENT", "READY", "UP-TO-DATE", "AVAILABLE", "AGE"];

/// A DaemonSet's row, as kubectl's: the status's counts of nodes.
pub fn daemonset_row(d: &specs::daemonset::DaemonSet) -> Vec<String> {
    let s = d.status.clone().unwrap_or_default();
    vec![
        d.metadata.name.clone(),
        s.desired_number_scheduled.to_string(),
        s.current_number_scheduled.to_string(),
        s.number_ready.to_string(),
        s.updated_number_scheduled.to_string(),
        s.number_available.to_string(),
        age(d.metadata.creation_timestamp.as_deref()),
    ]
}

fn pod_headers(wide: bool) -> Vec<&'static str> {
    let mut headers = vec!["NAME", "STATUS", "RESTARTS", "NODE", "AGE"];
    if wide {
        headers.extend(["NUMA", "CPUS", "IP", "ATTEMPTS", "REASON", "OWNER"]);
    }
    headers
}

/// A pod row without its AGE column.
fn without_age(mut row: Vec<String>) -> Vec<String> {
    row.remove(AGE_COLUMN);
    row
}

const AGE_COLUMN: usize = 4;

/// Reopens the pod watch from `from` after a pause, retrying (with growing
/// pauses) while the server cannot be reached or is failing.
async fn resume_watch(
    client: &pinion_wire::Client,
    selector: Option<&str>,
    from: u64,
    resumes: &mut Resumes,
) -> anyhow::Result<pinion_wire::PodWatch> {
    loop {
        let Some(pause) = resumes.pause() else {
            anyhow::bail!("resuming the watch: gave up after {} tries over about 20 s", resumes.tries());
        };
        tokio::time::sleep(pause).await;
        match client.watch_pods(None, selector, Some(from)).await {
            Ok(w) => {
                resumes.opened();
                return Ok(w);
            }
            Err(e) if e.is_retryable() => tracing::debug!(error = %e, "cannot resume the watch yet"),
            Err(e) => return Err(e.into()),
        }
    }
}

/// `get pods -w`: the table, then one row per change (a deleted pod's STATUS
/// reads `Deleted`), in the first table's columns, until interrupted, or an
/// error once the server stays away past the resumes' bound.
async fn watch_pods(client: &pinion_wire::Client, args: &Args, wide: bool) -> anyhow::Result<ExitCode> {
    let list = client.list_pods(args.selector.as_deref()).await?;
    let keep = |p: &Pod| args.name.as_ref().is_none_or(|n| *n == p.metadata.name);
    let headers = pod_headers(wide);
    let rows: Vec<Vec<String>> = list.items.iter().filter(|p| keep(p)).map(|p| pod_row(p, wide)).collect();
    // Later rows keep these columns, widened a little for names yet to come.
    const MIN: [usize; 9] = [16, 17, 8, 12, 4, 4, 8, 8, 6];
    let widths = widths(headers.iter().zip(MIN).map(|(h, m)| h.len().max(m)).collect(), &rows);
    out!("{}", line(&widths, &headers));
    for r in &rows {
        out!("{}", line(&widths, r));
    }
    // The last row printed per pod: a change that shows nothing new (a
    // status report with the same columns) prints no row. AGE is left out of
    // the comparison, or every change would differ by its age.
    let mut last: BTreeMap<String, Vec<String>> = list
        .items
        .iter()
        .filter(|p| keep(p))
        .map(|p| (p.metadata.name.clone(), without_age(pod_row(p, wide))))
        .collect();
    let mut watch = client.watch_pods(None, args.selector.as_deref(), Some(list.resource_version)).await?;
    let mut resumes = Resumes::new();
    loop {
        let (ty, pod) = match watch.next().await {
            Ok(Some(change)) => change,
            // The server ended the watch (it is stopping, or restarting):
            // said, then tried again within the resumes' bound (about 20 s),
            // after which the watch ends with an error. Another server of
            // the cluster carries on without a word.
            Ok(None) if client.authorities().count() < 2 => {
                let from = watch.resource_version().unwrap_or(list.resource_version);
                eprintln!("pinion: the server ended the watch (stopping or restarting); trying again");
                watch = resume_watch(client, args.selector.as_deref(), from, &mut resumes)
                    .await
                    .context("the server went away")?;
                eprintln!("pinion: watching again");
                continue;
            }
            Ok(None) => {
                let from = watch.resource_version().unwrap_or(list.resource_version);
                tracing::debug!(from, "the server ended the watch; resuming on the next");
                watch = resume_watch(client, args.selector.as_deref(), from, &mut resumes).await?;
                continue;
            }
            // A dead stream: resume from the version reached (the server's
            // bookmarks keep it current), so no row is missed or repeated;
            // on the next server when there are several (they share versions).
            Err(e) if e.is_dead_stream() => {
                let from = watch.resource_version().unwrap_or(list.resource_version);
                tracing::debug!(error = %e, from, "watch lost; resuming");
                watch = resume_watch(client, args.selector.as_deref(), from, &mut resumes).await?;
                continue;
            }
            Err(e) => return Err(anyhow::Error::new(e).context("the pod watch ended")),
        };
        if !keep(&pod) {
            continue;
        }
        let mut row = pod_row(&pod, wide);
        if ty == specs::api::WatchEventType::Deleted {
            row[1] = "Deleted".into();
        }
        let seen = without_age(row.clone());
        if last.get(&pod.metadata.name) == Some(&seen) {
            continue;
        }
        if ty == specs::api::WatchEventType::Deleted {
            last.remove(&pod.metadata.name);
        } else {
            last.insert(pod.metadata.name.clone(), seen);
        }
        out!("{}", line(&widths, &row));
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn names_sort_with_their_numbers_by_value() {
        let mut names = vec!["sweep-10", "sweep-2", "sweep-100", "sweep-1", "alpha", "sweep-02b", "sweep-", "web-9"];
        names.sort_by(|a, b| natural_order(a, b));
        assert_eq!(names, ["alpha", "sweep-", "sweep-1", "sweep-2", "sweep-02b", "sweep-10", "sweep-100", "web-9"]);
    }

    use super::*;

    #[test]
    fn tables_align() {
        let t = table(
            &["NAME", "STATUS"],
            &[vec!["a-long-name".into(), "Running".into()], vec!["b".into(), "Pending".into()]],
        );
        assert_eq!(t, "NAME          STATUS\na-long-name   Running\nb             Pending\n");
    }

    fn bare_pod(name: &str) -> Pod {
        specs::testing::pod(name).named("c").host_rootfs().build()
    }

    fn check_status(
        phase: specs::PodPhase,
        containers: &[(ContainerState, Option<&str>, Option<i32>, u32)],
        status: &str,
        restarts: u32,
    ) {
        let mut p = bare_pod("a");
        p.status = Some(specs::PodStatus {
            phase,
            container_statuses: containers
                .iter()
                .map(|(state, reason, code, restarts)| specs::status::ContainerStatus {
                    name: "c".into(),
                    state: *state,
                    restart_count: *restarts,
                    last_exit_code: *code,
                    reason: reason.map(str::to_string),
                    ready: *state == ContainerState::Running,
                    usage: None,
                })
                .collect(),
            ..Default::default()
        });
        assert_eq!((pod_status(&p).as_str(), pod_restarts(&p)), (status, restarts), "{containers:?}");
    }

    #[test]
    fn status_column_says_what_kubectl_says() {
        use specs::PodPhase as P;
        use ContainerState as C;
        check_status(P::Pending, &[], "Pending", 0);
        check_status(P::Running, &[(C::Running, None, None, 0)], "Running", 0);
        check_status(P::Running, &[(C::Waiting, Some("CrashLoopBackOff"), Some(1), 3)], "CrashLoopBackOff", 3);
        check_status(P::Scheduled, &[(C::Waiting, Some("ContainerCreating"), None, 0)], "ContainerCreating", 0);
        check_status(P::Succeeded, &[(C::Terminated, Some("Completed"), Some(0), 0)], "Completed", 0);
        check_status(P::Failed, &[(C::Terminated, None, Some(3), 1)], "ExitCode:3", 1);
        check_status(P::Running, &[(C::Running, None, None, 2), (C::Running, None, None, 1)], "Running", 3);
    }

    #[test]
    fn a_pod_whose_node_settings_changed_under_it_says_so() {
        let mut p = bare_pod("a");
        let status = |phase| specs::PodStatus {
            phase,
            reason: Some(specs::engine::SETTINGS_MISFIT.into()),
            container_statuses: vec![specs::status::ContainerStatus {
                name: "c".into(),
                state: ContainerState::Running,
                restart_count: 0,
                last_exit_code: None,
                reason: None,
                ready: true,
                usage: None,
            }],
            ..Default::default()
        };
        p.status = Some(status(specs::PodPhase::Running));
        assert_eq!(pod_status(&p), "SettingsMisfit");
        p.status = Some(status(specs::PodPhase::Pending));
        assert_eq!(pod_status(&p), "Pending");
    }

    #[test]
    fn a_node_with_offline_cpus_says_so_in_its_status() {
        let mut n = Node {
            api_version: "pinion.io/v1".into(),
            kind: "Node".into(),
            metadata: Default::default(),
            spec: Default::default(),
            status: Default::default(),
        };
        n.status.condition = NodeCondition::Ready;
        assert_eq!(node_row(&n, false)[1], "Ready");
        n.status.offline_cpus = specs::CpuSet::single(3).expect("cpu 3");
        assert_eq!(node_row(&n, false)[1], "Ready,CpusOffline");
        n.status.conditions.push(specs::api::Condition {
            kind: specs::api::POD_NETWORK.into(),
            status: specs::api::ConditionStatus::False,
            reason: "KernelUnsupported".into(),
            message: "the kernel cannot make a bridge".into(),
            fix: None,
        });
        assert_eq!(node_row(&n, false)[1], "Ready,CpusOffline,PodNetwork=False");
    }

    /// (replicas, status as ready/updated/available) -> the row without AGE
    fn check_deployment(replicas: u32, status: Option<(u32, u32, u32)>, expected: [&str; 4]) {
        let yaml = format!(
            "apiVersion: pinion.io/v1\nkind: Deployment\nmetadata: {{name: web}}\nspec:\n  replicas: {replicas}\n  selector: {{matchLabels: {{app: web}}}}\n  template:\n    metadata: {{labels: {{app: web}}}}\n    spec: {{containers: [{{name: c, rootfs: host}}]}}\n"
        );
        let mut d: specs::deployment::Deployment = serde_yaml_ng::from_str(&yaml).expect("deployment");
        d.status = status.map(|(ready, updated, available)| specs::deployment::DeploymentStatus {
            ready_replicas: ready,
            updated_replicas: updated,
            available_replicas: available,
            ..Default::default()
        });
        let row = deployment_row(&d);
        assert_eq!(row.len(), DEPLOYMENT_HEADERS.len());
        assert_eq!(DEPLOYMENT_HEADERS, ["NAME", "READY", "UP-TO-DATE", "AVAILABLE", "AGE"]);
        assert_eq!(row[..4], expected, "{replicas} {status:?}");
        assert_eq!(row[4], "-");
    }

    #[test]
    fn a_deployment_row_says_ready_of_wanted() {
        check_deployment(3, None, ["web", "0/3", "0", "0"]);
        check_deployment(6, Some((4, 6, 3)), ["web", "4/6", "6", "3"]);
        check_deployment(0, Some((0, 0, 0)), ["web", "0/0", "0", "0"]);
    }

    /// status as desired/current/ready/updated/available -> the row without AGE
    fn check_daemonset(status: Option<[u32; 5]>, expected: [&str; 6]) {
        let yaml = "apiVersion: pinion.io/v1\nkind: DaemonSet\nmetadata: {name: ptp}\nspec:\n  selector: {matchLabels: {app: ptp}}\n  template:\n    metadata: {labels: {app: ptp}}\n    spec: {containers: [{name: c, rootfs: host}]}\n";
        let mut d: specs::daemonset::DaemonSet = serde_yaml_ng::from_str(yaml).expect("daemonset");
        d.status = status.map(|[desired, current, ready, updated, available]| specs::daemonset::DaemonSetStatus {
            desired_number_scheduled: desired,
            current_number_scheduled: current,
            number_ready: ready,
            updated_number_scheduled: updated,
            number_available: available,
            ..Default::default()
        });
        let row = daemonset_row(&d);
        assert_eq!(row.len(), DAEMONSET_HEADERS.len());
        assert_eq!(row[..6], expected, "{status:?}");
        assert_eq!(row[6], "-");
    }

    #[test]
    fn a_daemonset_row_counts_nodes() {
        check_daemonset(None, ["ptp", "0", "0", "0", "0", "0"]);
        check_daemonset(Some([3, 3, 2, 1, 2]), ["ptp", "3", "3", "2", "1", "2"]);
    }

    #[test]
    fn a_row_without_its_age() {
        let p = bare_pod("a");
        let row = pod_row(&p, true);
        assert_eq!(row.len(), pod_headers(true).len());
        assert_eq!(pod_headers(true)[AGE_COLUMN], "AGE");
        assert_eq!(without_age(row), ["a", "Pending", "0", "-", "-", "-", "-", "0", "-", "-"]);
        let mut owned = bare_pod("b");
        owned.metadata.owner = Some("alice".into());
        assert_eq!(pod_row(&owned, true).last().map(String::as_str), Some("alice"), "the OWNER column");
    }
}
