//! `pinion acct` (Slurm's `sacct`): one line per finished job, its members
//! as step lines under it (`JOB.RANK`), and pods of their own (`pinion
//! run`'s one-liners, array tasks) as jobs, from the records the server
//! keeps (`specs::acct`); `--efficiency JOB` is Slurm's `seff`. The server
//! already narrows a user's records to their own; `-u`, `--me`, `-j` and
//! the `-S`/`-E` window (Slurm's default: since midnight) narrow further here.

use std::process::ExitCode;

use specs::acct::{self, Column};

use crate::common::GlobalArgs;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Only these jobs (comma-separated ids; a job's id also shows its
    /// members); any time, unless -S or -E say otherwise.
    #[arg(short = 'j', long = "jobs", value_delimiter = ',', value_name = "JOB")]
    pub jobs: Vec<String>,
    /// Only these users' records (comma-separated).
    #[arg(short = 'u', long = "user", value_delimiter = ',', value_name = "USER")]
    pub users: Vec<String>,
    /// Only the caller's own records.
    #[arg(long)]
    pub me: bool,
    /// Every user's records: accepted as sacct accepts it; what the server
    /// shows already depends on who asks (a user sees their own).
    #[arg(short = 'a', long = "allusers")]
    pub allusers: bool,
    /// Only records in these states (comma-separated): CD, F, TO, CA, OOM
    /// or Slurm's names (COMPLETED, FAILED, TIMEOUT, CANCELLED, OUT_OF_MEMORY).
    #[arg(short = 's', long = "state", value_name = "STATES", value_delimiter = ',', value_parser = acct::parse_state)]
    pub states: Vec<acct::State>,
    /// Records of what ran at or after this time: YYYY-MM-DD[THH:MM[:SS]],
    /// HH:MM[:SS], now[-COUNT[seconds|minutes|hours|days|weeks]], today
    /// [default: midnight, or any time with -j].
    #[arg(short = 'S', long = "starttime", value_name = "TIME")]
    pub start: Option<String>,
    /// Records of what ran at or before this time (forms as -S) [default: now].
    #[arg(short = 'E', long = "endtime", value_name = "TIME")]
    pub end: Option<String>,
    /// The columns, comma-separated (case-insensitive): JobID, JobName,
    /// User, Account, Partition, Submit, Start, End, Elapsed, State,
    /// ExitCode, TotalCPU, MaxRSS, NCPUS, ReqMem, NNodes, NodeList.
    #[arg(short = 'o', long = "format", value_name = "COLUMNS", default_value = acct::DEFAULT_FORMAT)]
    pub format: String,
    /// Job lines only, no member (step) lines.
    #[arg(short = 'X', long = "allocations")]
    pub allocations: bool,
    /// No header line.
    #[arg(short = 'n', long = "noheader")]
    pub noheader: bool,
    /// Cells separated by `|`, one after the last too.
    #[arg(short = 'p', long = "parsable")]
    pub parsable: bool,
    /// Cells separated by `|`, none after the last.
    #[arg(short = 'P', long = "parsable2")]
    pub parsable2: bool,
    /// Slurm's `seff` for one job: its cores, CPU and memory used and
    /// their efficiency.
    #[arg(long, value_name = "JOB", conflicts_with_all = ["jobs", "format", "allocations"])]
    pub efficiency: Option<String>,
}

/// The table or `|`-separated lines for `records` under `columns`.
pub fn render(records: &[&acct::Record], columns: &[Column], args: &Args, offset: i32) -> String {
    let headers: Vec<&str> = columns.iter().map(|c| c.header()).collect();
    let rows: Vec<Vec<String>> =
        records.iter().map(|r| columns.iter().map(|c| acct::cell(r, *c, offset)).collect()).collect();
    if args.parsable || args.parsable2 {
        let end = if args.parsable { "|" } else { "" };
        let mut out = String::new();
        let header = (!args.noheader).then(|| headers.iter().map(|h| h.to_string()).collect::<Vec<_>>());
        for row in header.iter().chain(&rows) {
            out.push_str(&row.join("|"));
            out.push_str(end);
            out.push('\n');
        }
        return out;
    }
    let table = super::get::table(&headers, &rows);
    if args.noheader {
        return table.lines().skip(1).map(|l| format!("{l}\n")).collect();
    }
    table
}

/// The window `-S`/`-E` say, in Unix seconds, at `now` in the zone `offset`.
pub fn window(args: &Args, now: i64, offset: i32) -> anyhow::Result<(i64, i64)> {
    let parse = |flag: &str, s: &str| acct::parse_time(s, now, offset).map_err(|e| anyhow::anyhow!("{flag}: {e}"));
    let start = match &args.start {
        Some(s) => parse("-S/--starttime", s)?,
        None if args.jobs.is_empty() => acct::midnight(now, offset),
        None => i64::MIN,
    };
    let end = match &args.end {
        Some(s) => parse("-E/--endtime", s)?,
        None => i64::MAX,
    };
    Ok((start, end))
}

pub async fn run(g: GlobalArgs, args: Args) -> anyhow::Result<ExitCode> {
    let columns = Column::parse_list(&args.format).map_err(|e| anyhow::anyhow!("--format: {e}"))?;
    let now = chrono::Utc::now().timestamp();
    let offset = chrono::Local::now().offset().local_minus_utc();
    let client = crate::config::client(&g)?;
    let records = client.list_acct().await?.items;
    if let Some(job) = &args.efficiency {
        let found = records.iter().filter(|r| r.job_id == *job).max_by_key(|r| (r.member.is_none(), r.end));
        let Some(record) = found else {
            anyhow::bail!("no accounting record of job {job:?} that you may read (records are kept for the server's --acct-retention)");
        };
        for line in acct::efficiency(record) {
            outln!("{line}");
        }
        return Ok(ExitCode::SUCCESS);
    }
    let mut users = args.users.clone();
    if args.me {
        users.push(super::queue::caller(&g)?);
    }
    let window = window(&args, now, offset)?;
    let mut shown = acct::select(&records, &users, &args.jobs, window, args.allocations);
    if !args.states.is_empty() {
        shown.retain(|r| args.states.contains(&r.state));
    }
    out!("{}", render(&shown, &columns, &args, offset));
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    fn args(flags: &[&str]) -> Args {
        let mut argv = vec!["acct"];
        argv.extend_from_slice(flags);
        Cli::try_parse_from(argv).map(|c| c.args).unwrap_or_else(|e| panic!("{flags:?}: {e}"))
    }

    fn record(job: &str, member: Option<u32>) -> acct::Record {
        acct::Record {
            job_id: member.map_or(job.to_string(), |m| format!("{job}.{m}")),
            job_name: job.into(),
            member,
            user: "ada".into(),
            start: Some(0),
            end: 65,
            exit_code: 3,
            state: acct::State::Failed,
            ..Default::default()
        }
    }

    #[test]
    fn lines_as_sacct_writes_them() {
        let (a, a0) = (record("a", None), record("a", Some(0)));
        let shown = [&a, &a0];
        let cols = Column::parse_list("JobID,State,ExitCode,Elapsed").unwrap_or_default();
        let check = |flags: &[&str], want: &str| assert_eq!(render(&shown, &cols, &args(flags), 0), want, "{flags:?}");
        check(&["-p"], "JobID|State|ExitCode|Elapsed|\na|FAILED|3:0|00:01:05|\na.0|FAILED|3:0|00:01:05|\n");
        check(&["-P", "-n"], "a|FAILED|3:0|00:01:05\na.0|FAILED|3:0|00:01:05\n");
        let table = render(&shown, &cols, &args(&[]), 0);
        assert!(table.starts_with("JOBID") || table.starts_with("JobID"), "{table}");
        assert_eq!(table.lines().count(), 3, "{table}");
        assert_eq!(render(&shown, &cols, &args(&["-n"]), 0).lines().count(), 2);
    }

    #[test]
    fn the_window_defaults_to_midnight_and_to_any_time_for_named_jobs() {
        let now = 1_795_910_400 + 3600;
        assert_eq!(window(&args(&[]), now, 0).ok(), Some((1_795_910_400, i64::MAX)));
        assert_eq!(window(&args(&["-j", "a"]), now, 0).ok(), Some((i64::MIN, i64::MAX)));
        assert_eq!(window(&args(&["-S", "now-1hour", "-E", "now"]), now, 0).ok(), Some((now - 3600, now)));
        assert_eq!(args(&["-s", "CD,to"]).states, [acct::State::Completed, acct::State::Timeout]);
        assert!(args(&["-a"]).allusers);
        let err = window(&args(&["-S", "last tuesday"]), now, 0).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("-S/--starttime") && err.contains("last tuesday"), "{err}");
    }
}
