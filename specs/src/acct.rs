//! Accounting: Slurm's `sacct` and `seff` over the records the server keeps
//! of every finished job, job member and pod of its own (`Record`, stored as
//! `kind: AcctRecord`, written in the write that ends what it records). A
//! job is one line; its members are step lines under it (`JOB.RANK`); a pod
//! that is no job's member (`pinion run`'s one-liners and array tasks) is a
//! job of its own. All pure: the caller passes times (Unix seconds) and the
//! local clock's offset.

use serde::{Deserialize, Serialize};

use crate::job::Job;
use crate::pod::ObjectMeta;
use crate::status::ContainerUsage;
use crate::Pod;

/// How long records are kept when the server is not told otherwise.
pub const DEFAULT_RETENTION_DAYS: u64 = 30;

/// How a job or pod ended, in Slurm's words.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum State {
    #[default]
    Completed,
    Failed,
    /// Past its time limit (`DeadlineExceeded`).
    Timeout,
    /// Deleted (`pinion cancel`, `pinion delete`) while it ran or waited.
    Cancelled,
    /// A container was killed by the kernel's OOM killer.
    OutOfMemory,
}

impl State {
    pub fn word(self) -> &'static str {
        match self {
            State::Completed => "COMPLETED",
            State::Failed => "FAILED",
            State::Timeout => "TIMEOUT",
            State::Cancelled => "CANCELLED",
            State::OutOfMemory => "OUT_OF_MEMORY",
        }
    }
}

/// `--state`'s list: Slurm's names or short codes (`CD`, `F`, `TO`, `CA`,
/// `OOM`), case-insensitive, comma-separated; an unknown one names the valid.
pub fn parse_states(list: &str) -> Result<Vec<State>, String> {
    list.split(',').map(str::trim).filter(|w| !w.is_empty()).map(parse_state).collect()
}

/// One state of `--state`: a Slurm name or short code.
pub fn parse_state(word: &str) -> Result<State, String> {
    const ALL: [(State, &str); 5] = [
        (State::Completed, "CD"),
        (State::Failed, "F"),
        (State::Timeout, "TO"),
        (State::Cancelled, "CA"),
        (State::OutOfMemory, "OOM"),
    ];
    let found = ALL.iter().find(|(s, code)| word.eq_ignore_ascii_case(s.word()) || word.eq_ignore_ascii_case(code));
    found.map(|(s, _)| *s).ok_or_else(|| {
        let valid: Vec<String> = ALL.iter().map(|(s, c)| format!("{c} ({})", s.word())).collect();
        format!("unknown state {word:?}: valid states are {}", valid.join(", "))
    })
}

/// One finished job, member or pod.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Record {
    pub api_version: String,
    pub kind: String,
    /// `name` is the store's key (`job.UID`, `pod.UID`); `owner` whose it is.
    pub metadata: ObjectMeta,
    /// `JOB`, `JOB.RANK` for a member, or the pod's name.
    pub job_id: String,
    pub job_name: String,
    /// A member's rank: a step line under its job's; `None`: a job line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member: Option<u32>,
    pub user: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<String>,
    /// Unix seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub submit: Option<i64>,
    /// Unix seconds; `None`: it never started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<i64>,
    /// Unix seconds.
    pub end: i64,
    pub state: State,
    /// Slurm's `code:signal`.
    pub exit_code: i32,
    #[serde(default)]
    pub signal: i32,
    /// CPU time of every process, from the containers' cgroups at their end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_nanos: Option<u64>,
    /// The largest memory use of a container (its cgroup's high-water mark).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_rss_bytes: Option<u64>,
    /// What the node could not read, in words (a file the kernel lacks).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub missing: Vec<String>,
    /// CPUs requested (rounded up).
    pub ncpus: u32,
    /// Memory requested, all containers together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_request_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<String>,
}

/// When a job or pod was submitted, started and ended (Unix seconds).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Times {
    pub submit: Option<i64>,
    pub start: Option<i64>,
    pub end: i64,
}

/// Slurm's `code:signal` from an exit code, where 128 + N is signal N (as
/// the runtime and shells report a killed process).
pub fn split_exit(code: i32) -> (i32, i32) {
    if (129..=128 + 64).contains(&code) {
        (0, code - 128)
    } else {
        (code, 0)
    }
}

/// A pod's CPU time (summed) and memory high-water mark (the largest) over
/// its containers, and what of them is missing.
pub fn pod_usage(pod: &Pod) -> (Option<u64>, Option<u64>, Vec<String>) {
    let usages: Vec<&ContainerUsage> =
        pod.status.iter().flat_map(|s| &s.container_statuses).filter_map(|c| c.usage.as_ref()).collect();
    fold_usage(usages.iter().map(|u| (u.cpu_nanos, u.max_rss_bytes, u.missing.clone())))
}

fn fold_usage(
    parts: impl Iterator<Item = (Option<u64>, Option<u64>, Option<String>)>,
) -> (Option<u64>, Option<u64>, Vec<String>) {
    let (mut cpu, mut rss, mut missing) = (None::<u64>, None::<u64>, Vec::new());
    for (c, r, m) in parts {
        if let Some(c) = c {
            cpu = Some(cpu.unwrap_or(0).saturating_add(c));
        }
        if let Some(r) = r {
            rss = Some(rss.unwrap_or(0).max(r));
        }
        if let Some(m) = m {
            if !missing.contains(&m) {
                missing.push(m);
            }
        }
    }
    (cpu, rss, missing)
}

fn mem_request(spec: &crate::pod::PodSpec) -> Option<u64> {
    let per: Vec<i128> = spec
        .containers
        .iter()
        .filter_map(|c| c.resources.request(crate::pod::RESOURCE_MEMORY))
        .map(crate::Quantity::units_ceil)
        .collect();
    (!per.is_empty()).then(|| per.iter().sum::<i128>().clamp(0, i128::from(u64::MAX)) as u64)
}

fn ncpus(millis: i128) -> u32 {
    ((millis + 999) / 1000).clamp(0, i128::from(u32::MAX)) as u32
}

/// What every record takes from the recorded object's metadata: its store
/// name (`PREFIX.UID`), owner, user and account, and its times.
fn common(prefix: &str, m: &ObjectMeta, t: Times) -> Record {
    Record {
        api_version: crate::pod::API_VERSION.into(),
        kind: "AcctRecord".into(),
        metadata: ObjectMeta {
            name: format!("{prefix}.{}", m.uid.as_deref().unwrap_or(&m.name)),
            owner: m.owner.clone(),
            ..Default::default()
        },
        user: m.owner.clone().unwrap_or_else(|| "admin".into()),
        account: m.labels.get(crate::batch::ACCOUNT_LABEL).cloned(),
        submit: t.submit,
        start: t.start,
        end: t.end,
        ..Default::default()
    }
}

/// The record of a pod that ended (or was deleted: `cancelled`).
pub fn pod_record(pod: &Pod, t: Times, cancelled: bool) -> Record {
    let status = pod.status.clone().unwrap_or_default();
    let oom = status.container_statuses.iter().any(|c| c.reason.as_deref() == Some("OOMKilled"));
    let code = status.container_statuses.iter().filter_map(|c| c.last_exit_code).find(|c| *c != 0).unwrap_or(0);
    let state = match status.phase {
        _ if cancelled => State::Cancelled,
        crate::PodPhase::Succeeded => State::Completed,
        _ if oom => State::OutOfMemory,
        _ => State::Failed,
    };
    let (exit_code, signal) = if cancelled && code == 0 { (0, 15) } else { split_exit(code) };
    let (cpu_nanos, max_rss_bytes, missing) = pod_usage(pod);
    let m = &pod.metadata;
    let membership = crate::job::membership(pod);
    let (job_id, job_name, member) = match membership {
        Some((job, rank, _)) => (format!("{job}.{rank}"), job.to_string(), Some(rank)),
        None => {
            let name = m.labels.get(crate::pod::ARRAY_LABEL).unwrap_or(&m.name);
            (m.name.clone(), name.clone(), None)
        }
    };
    Record {
        job_id,
        job_name,
        member,
        // A member's comes from its job (the caller's); a pod of its own has none.
        partition: None,
        state,
        exit_code,
        signal,
        cpu_nanos,
        max_rss_bytes,
        missing,
        ncpus: ncpus(crate::backfill::pod_millicpus(&pod.spec)),
        mem_request_bytes: mem_request(&pod.spec),
        nodes: pod.spec.node_name.iter().cloned().collect(),
        ..common("pod", m, t)
    }
}

/// The record of a job that ended (or was deleted: `cancelled`), over its
/// members as they were: its CPU time their sum, its memory their largest,
/// its exit code the highest of theirs (Slurm's job exit code).
pub fn job_record(job: &Job, members: &[&Pod], t: Times, cancelled: bool) -> Record {
    let status = job.status.clone().unwrap_or_default();
    let state = match status.phase {
        _ if cancelled => State::Cancelled,
        crate::job::JobPhase::Succeeded => State::Completed,
        _ if status.reason.as_deref() == Some(crate::job::DEADLINE_EXCEEDED) => State::Timeout,
        _ => {
            let oom = members.iter().any(|p| {
                p.status.iter().flat_map(|s| &s.container_statuses).any(|c| c.reason.as_deref() == Some("OOMKilled"))
            });
            if oom {
                State::OutOfMemory
            } else {
                State::Failed
            }
        }
    };
    let codes = status.members.iter().filter_map(|m| m.exit_code).chain(
        members
            .iter()
            .flat_map(|p| p.status.iter().flat_map(|s| &s.container_statuses))
            .filter_map(|c| c.last_exit_code),
    );
    let code = codes.max_by_key(|c| (*c != 0, *c)).unwrap_or(0);
    let (exit_code, signal) = match state {
        State::Timeout | State::Cancelled if code == 0 => (0, 15),
        _ => split_exit(code),
    };
    let per_pod: Vec<_> = members.iter().map(|p| pod_usage(p)).collect();
    let (cpu_nanos, max_rss_bytes, missing) = fold_usage(per_pod.into_iter().map(|(c, r, m)| {
        let m = (!m.is_empty()).then(|| m.join("; "));
        (c, r, m)
    }));
    let mut nodes: Vec<String> = members.iter().filter_map(|p| p.spec.node_name.clone()).collect();
    nodes.sort();
    nodes.dedup();
    let m = &job.metadata;
    let per_member = mem_request(&job.spec.template.spec);
    Record {
        job_id: m.name.clone(),
        job_name: m.labels.get(crate::batch::NAME_LABEL).unwrap_or(&m.name).clone(),
        member: None,
        partition: job.spec.partition.clone(),
        state,
        exit_code,
        signal,
        cpu_nanos,
        max_rss_bytes,
        missing,
        ncpus: ncpus(crate::partition::job_millicpus(job)),
        mem_request_bytes: per_member.map(|b| b.saturating_mul(u64::from(job.spec.parallelism))),
        nodes,
        ..common("job", m, t)
    }
}

/// Whether a record is past its retention at `now` (all Unix seconds).
pub fn expired(r: &Record, now: i64, retention_seconds: u64) -> bool {
    r.end.saturating_add(retention_seconds.min(i64::MAX as u64) as i64) < now
}

/// The columns `--format` names (Slurm's, case-insensitive).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Column {
    JobId,
    JobName,
    User,
    Account,
    Partition,
    Submit,
    Start,
    End,
    Elapsed,
    State,
    ExitCode,
    TotalCpu,
    MaxRss,
    NCpus,
    ReqMem,
    NNodes,
    NodeList,
}

const COLUMNS: [(Column, &str); 17] = [
    (Column::JobId, "JobID"),
    (Column::JobName, "JobName"),
    (Column::User, "User"),
    (Column::Account, "Account"),
    (Column::Partition, "Partition"),
    (Column::Submit, "Submit"),
    (Column::Start, "Start"),
    (Column::End, "End"),
    (Column::Elapsed, "Elapsed"),
    (Column::State, "State"),
    (Column::ExitCode, "ExitCode"),
    (Column::TotalCpu, "TotalCPU"),
    (Column::MaxRss, "MaxRSS"),
    (Column::NCpus, "NCPUS"),
    (Column::ReqMem, "ReqMem"),
    (Column::NNodes, "NNodes"),
    (Column::NodeList, "NodeList"),
];

/// What `sacct` shows without `--format` (Slurm's own, with the times).
pub const DEFAULT_FORMAT: &str = "JobID,JobName,User,Account,Partition,Start,End,Elapsed,State,ExitCode,NCPUS,NodeList";

impl Column {
    pub fn header(self) -> &'static str {
        COLUMNS.iter().find(|(c, _)| *c == self).map_or("", |(_, n)| n)
    }

    /// A comma-separated list of column names; an unknown one is an error
    /// naming it and the valid ones. `AllocCPUS` is Slurm's other name of NCPUS.
    pub fn parse_list(list: &str) -> Result<Vec<Column>, String> {
        let mut out = Vec::new();
        for word in list.split(',').map(str::trim).filter(|w| !w.is_empty()) {
            // Slurm's `Name%20` sets a width: the table fits its cells anyway.
            let name = word.split('%').next().unwrap_or(word);
            let found = COLUMNS.iter().find(|(_, n)| n.eq_ignore_ascii_case(name)).map(|(c, _)| *c);
            let found = found.or_else(|| name.eq_ignore_ascii_case("AllocCPUS").then_some(Column::NCpus));
            match found {
                Some(c) => out.push(c),
                None => {
                    let valid: Vec<&str> = COLUMNS.iter().map(|(_, n)| *n).collect();
                    return Err(format!("unknown column {name:?}: valid columns are {}", valid.join(", ")));
                }
            }
        }
        if out.is_empty() {
            return Err("no column named".into());
        }
        Ok(out)
    }
}

/// `[DD-]HH:MM:SS`, as Slurm writes Elapsed.
pub fn elapsed(seconds: u64) -> String {
    let (d, h, m, s) = (seconds / 86_400, seconds / 3600 % 24, seconds / 60 % 60, seconds % 60);
    if d > 0 {
        format!("{d}-{h:02}:{m:02}:{s:02}")
    } else {
        format!("{h:02}:{m:02}:{s:02}")
    }
}

/// `[DD-][HH:]MM:SS.mmm`, as Slurm writes TotalCPU.
pub fn cpu_time(nanos: u64) -> String {
    let ms = nanos / 1_000_000;
    let (secs, milli) = (ms / 1000, ms % 1000);
    let (d, h, m, s) = (secs / 86_400, secs / 3600 % 24, secs / 60 % 60, secs % 60);
    match (d, h) {
        (0, 0) => format!("{m:02}:{s:02}.{milli:03}"),
        (0, h) => format!("{h:02}:{m:02}:{s:02}"),
        (d, h) => format!("{d}-{h:02}:{m:02}:{s:02}"),
    }
}

/// Kibibytes with Slurm's `K` (MaxRSS).
pub fn rss(bytes: u64) -> String {
    format!("{}K", bytes.div_ceil(1024))
}

/// Days since 1970-01-01 of a civil date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = i64::from((m + 9) % 12);
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The civil date of a day count since 1970-01-01.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { yoe + era * 400 + 1 } else { yoe + era * 400 }, m, d)
}

/// A time as Slurm writes it, `YYYY-MM-DDTHH:MM:SS`, in the zone `offset`
/// seconds east of UTC.
pub fn timestamp(unix: i64, offset: i32) -> String {
    let local = unix + i64::from(offset);
    let (days, secs) = (local.div_euclid(86_400), local.rem_euclid(86_400));
    let (y, m, d) = civil_from_days(days);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}", secs / 3600, secs / 60 % 60, secs % 60)
}

/// The start of the day of `now` (local midnight): Slurm's default `-S`.
pub fn midnight(now: i64, offset: i32) -> i64 {
    let local = now + i64::from(offset);
    local - local.rem_euclid(86_400) - i64::from(offset)
}

/// A `-S`/`-E` time in Slurm's forms, in the zone `offset` seconds east of
/// UTC: `YYYY-MM-DD[THH:MM[:SS]]`, `HH:MM[:SS]` (today), `now`,
/// `now[+-]COUNT[seconds|minutes|hours|days|weeks]` (seconds when no unit),
/// `today`/`midnight`. Unix seconds, or why not.
pub fn parse_time(s: &str, now: i64, offset: i32) -> Result<i64, String> {
    let bad = || format!("{s:?}: want YYYY-MM-DD[THH:MM[:SS]], HH:MM[:SS], now[-COUNT[units]] or today");
    let t = s.trim().to_ascii_lowercase();
    if t == "today" || t == "midnight" {
        return Ok(midnight(now, offset));
    }
    if let Some(rest) = t.strip_prefix("now") {
        if rest.is_empty() {
            return Ok(now);
        }
        let (sign, rest) = match rest.split_at(1) {
            ("+", r) => (1, r),
            ("-", r) => (-1, r),
            _ => return Err(bad()),
        };
        let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        let (count, unit) = rest.split_at(digits);
        let count: i64 = count.parse().map_err(|_| bad())?;
        let scale = match unit {
            "" | "s" | "sec" | "secs" | "second" | "seconds" => 1,
            "min" | "mins" | "minute" | "minutes" => 60,
            "h" | "hour" | "hours" => 3600,
            "d" | "day" | "days" => 86_400,
            "w" | "week" | "weeks" => 7 * 86_400,
            _ => return Err(bad()),
        };
        return count.checked_mul(scale).and_then(|d| now.checked_add(sign * d)).ok_or_else(bad);
    }
    let (date, clock) = match t.split_once('t') {
        Some((d, c)) => (Some(d), Some(c)),
        None if t.contains('-') => (Some(t.as_str()), None),
        None => (None, Some(t.as_str())),
    };
    let day = match date {
        Some(d) => {
            let parts: Vec<&str> = d.split('-').collect();
            let [y, m, dd] = parts.as_slice() else { return Err(bad()) };
            let (y, m, dd): (i64, u32, u32) =
                (y.parse().map_err(|_| bad())?, m.parse().map_err(|_| bad())?, dd.parse().map_err(|_| bad())?);
            if !(1970..=9999).contains(&y) || !(1..=12).contains(&m) || !(1..=31).contains(&dd) {
                return Err(bad());
            }
            days_from_civil(y, m, dd)
        }
        None => midnight(now, offset).saturating_add(i64::from(offset)).div_euclid(86_400),
    };
    let secs = match clock {
        Some(c) => {
            let parts: Vec<&str> = c.split(':').collect();
            let nums: Result<Vec<i64>, _> = parts.iter().map(|p| p.parse::<i64>()).collect();
            match nums.map_err(|_| bad())?.as_slice() {
                [h, m] if (0..24).contains(h) && (0..60).contains(m) => h * 3600 + m * 60,
                [h, m, sec] if (0..24).contains(h) && (0..60).contains(m) && (0..61).contains(sec) => {
                    h * 3600 + m * 60 + sec
                }
                _ => return Err(bad()),
            }
        }
        None => 0,
    };
    Ok(day * 86_400 + secs - i64::from(offset))
}

/// One cell of a record under `--format`; `offset`: the local zone.
pub fn cell(r: &Record, c: Column, offset: i32) -> String {
    let unknown = || "Unknown".to_string();
    match c {
        Column::JobId => r.job_id.clone(),
        Column::JobName => r.job_name.clone(),
        Column::User => r.user.clone(),
        Column::Account => r.account.clone().unwrap_or_default(),
        Column::Partition => r.partition.clone().unwrap_or_default(),
        Column::Submit => r.submit.map_or_else(unknown, |t| timestamp(t, offset)),
        Column::Start => r.start.map_or_else(unknown, |t| timestamp(t, offset)),
        Column::End => timestamp(r.end, offset),
        Column::Elapsed => elapsed(wall_seconds(r)),
        Column::State => r.state.word().to_string(),
        Column::ExitCode => format!("{}:{}", r.exit_code, r.signal),
        Column::TotalCpu => r.cpu_nanos.map(cpu_time).unwrap_or_default(),
        Column::MaxRss => r.max_rss_bytes.map(rss).unwrap_or_default(),
        Column::NCpus => r.ncpus.to_string(),
        Column::ReqMem => r.mem_request_bytes.map(|b| format!("{}M", b.div_ceil(1 << 20))).unwrap_or_default(),
        Column::NNodes => r.nodes.len().to_string(),
        Column::NodeList => {
            if r.nodes.is_empty() {
                "None assigned".into()
            } else {
                crate::queue::hostlist(&r.nodes)
            }
        }
    }
}

/// Seconds from start to end (0 for a job that never started).
pub fn wall_seconds(r: &Record) -> u64 {
    r.start.map_or(0, |s| r.end.saturating_sub(s).max(0) as u64)
}

/// What `acct` shows: records of `users` (all when empty), of `jobs` (a
/// job's id also selects its members), that ran in the window `[start,
/// end]` (a job selected by id whatever its time, as Slurm does), members
/// unless `jobs_only`; each job's members right after it, by end time.
pub fn select<'a>(
    records: &'a [Record],
    users: &[String],
    jobs: &[String],
    window: (i64, i64),
    jobs_only: bool,
) -> Vec<&'a Record> {
    let job_of = |r: &Record| -> String {
        match r.member {
            Some(_) => r.job_name_key(),
            None => r.job_id.clone(),
        }
    };
    let mut out: Vec<&Record> = records
        .iter()
        .filter(|r| users.is_empty() || users.contains(&r.user))
        .filter(|r| !(jobs_only && r.member.is_some()))
        .filter(|r| {
            if !jobs.is_empty() {
                return jobs.contains(&job_of(r)) || jobs.contains(&r.job_id);
            }
            let began = r.start.unwrap_or(r.end);
            r.end >= window.0 && began <= window.1
        })
        .collect();
    // By the job's end, each job's members right under its line.
    let ends: std::collections::BTreeMap<String, i64> =
        out.iter().filter(|r| r.member.is_none()).map(|r| (r.job_id.clone(), r.end)).collect();
    out.sort_by_key(|r| {
        let key = job_of(r);
        (ends.get(&key).copied().unwrap_or(r.end), key, r.member.is_some(), r.member)
    });
    out
}

impl Record {
    /// A member's job: its id up to the rank.
    fn job_name_key(&self) -> String {
        match self.job_id.rsplit_once('.') {
            Some((job, _)) if self.member.is_some() => job.to_string(),
            _ => self.job_id.clone(),
        }
    }
}

/// `seff`'s lines for one record (a job line): cores, CPU utilized and
/// its efficiency as a share of cores times wall-clock time, memory
/// utilized and its efficiency as a share of the request.
pub fn efficiency(r: &Record) -> Vec<String> {
    let wall = wall_seconds(r);
    let core_wall = wall.saturating_mul(u64::from(r.ncpus.max(1)));
    let mut out = vec![
        format!("Job ID: {}", r.job_id),
        format!("User: {}", r.user),
        format!("State: {} (exit code {})", r.state.word(), r.exit_code),
        format!("Nodes: {}", r.nodes.len()),
        format!("Cores: {}", r.ncpus),
    ];
    match r.cpu_nanos {
        Some(cpu) => {
            out.push(format!("CPU Utilized: {}", elapsed(cpu / 1_000_000_000)));
            out.push(format!(
                "CPU Efficiency: {} of {} core-walltime",
                percent(cpu as f64 / 1e9, core_wall as f64),
                elapsed(core_wall)
            ));
        }
        None => out.push("CPU Utilized: unknown (the node reported no CPU time)".into()),
    }
    out.push(format!("Job Wall-clock time: {}", elapsed(wall)));
    match r.max_rss_bytes {
        Some(rss) => {
            out.push(format!("Memory Utilized: {}", crate::quantity::human_bytes(rss)));
            match r.mem_request_bytes {
                Some(req) if req > 0 => out.push(format!(
                    "Memory Efficiency: {} of {}",
                    percent(rss as f64, req as f64),
                    crate::quantity::human_bytes(req)
                )),
                _ => out.push("Memory Efficiency: no memory requested".into()),
            }
        }
        None => out.push("Memory Utilized: unknown (the node reported no memory figure)".into()),
    }
    for m in &r.missing {
        out.push(format!("Missing: {m}"));
    }
    out
}

/// `part` of `whole` as seff writes it (`12.50%`); `0.00%` of nothing.
pub fn percent(part: f64, whole: f64) -> String {
    if whole <= 0.0 {
        return "0.00%".into();
    }
    format!("{:.2}%", part / whole * 100.0)
}

#[cfg(test)]
mod tests;
