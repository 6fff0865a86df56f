//! `pinion alloc [OPTIONS] [-- COMMAND...]` (Slurm's `salloc`): an
//! interactive allocation. It submits a Job built from sbatch's options (the
//! flag parsing of `specs::batch`, the Job of `batch::job_running`) whose
//! members only hold their CPUs: each sleeps until the job's time limit or
//! its release. Once every member runs it prints `salloc: Granted job
//! allocation NAME` and starts the user's shell (`$SHELL`, else `/bin/sh`) or
//! COMMAND here, with `PINION_JOB` set, so that `pinion run` in it is a step
//! in the members (`step`). When the shell ends, or `alloc` gets SIGINT,
//! SIGTERM or SIGHUP, the job is deleted (`salloc: Relinquishing job
//! allocation NAME`); the exit status is the shell's.

use std::os::unix::process::ExitStatusExt;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context};
use bytes::Bytes;
use pinion_wire::{Client, ClientError};
use specs::batch::{self, BatchOptions};
use specs::PodPhase;

use super::run::Signals;
use crate::common::GlobalArgs;

/// How often the members are looked at while the allocation waits.
const POLL: Duration = Duration::from_millis(300);
/// How often the job is looked at while the shell runs (a time limit or a
/// `pinion cancel` revokes it).
const WATCH: Duration = Duration::from_secs(5);
/// How long the shell has to leave after SIGHUP before SIGKILL.
const SHELL_GRACE: Duration = Duration::from_secs(5);

#[derive(clap::Args, Debug)]
#[command(after_help = "OPTIONS (as salloc's):
  -J, --job-name NAME        the allocation's name [default: alloc-<suffix>]
  -N, --nodes N              at most N nodes
  -n, --ntasks N             N tasks (members; default 1)
      --ntasks-per-node K    K tasks on each node
  -c, --cpus-per-task N      N exclusive, pinned CPUs per task
      --mem SIZE             memory per node; --mem-per-cpu SIZE
  -t, --time TIME            time limit: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S
  -p, --partition NAME       the partition
  -A, --account NAME         recorded as the label pinion.io/account
  -d, --dependency DEP       as sbatch's
  -I, --immediate[=SECONDS]  give up (and release) when not granted within SECONDS [default: wait]
In the shell: PINION_JOB, PINION_NNODES, PINION_NTASKS, PINION_JOB_NODELIST; `pinion run -- CMD` runs CMD in the members.
Exit status: the shell's (or COMMAND's); 128+N after signal N; 1 when the allocation could not be made.")]
pub struct Args {
    /// salloc's options (see below), then `--` and the command to run
    /// instead of a shell.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, value_name = "[OPTIONS] [-- COMMAND]")]
    pub words: Vec<String>,
}

/// An `alloc` command line taken apart: the options for `specs::batch`, the
/// `--immediate` bound, the command.
#[derive(Debug, PartialEq, Eq)]
struct Invocation {
    options: Vec<String>,
    immediate: Option<Duration>,
    command: Vec<String>,
}

fn split(words: &[String]) -> anyhow::Result<Invocation> {
    let (before, command) = match words.iter().position(|w| w == "--") {
        Some(i) => (&words[..i], words[i + 1..].to_vec()),
        None => (words, Vec::new()),
    };
    let mut options = Vec::new();
    let mut immediate = None;
    for w in before {
        let secs = match w.as_str() {
            "-I" | "--immediate" => Some("1"),
            _ => w.strip_prefix("--immediate=").or_else(|| w.strip_prefix("-I")),
        };
        match secs {
            Some(s) => {
                let n: u64 = s.parse().map_err(|_| anyhow::anyhow!("--immediate={s}: expected whole seconds"))?;
                immediate = Some(Duration::from_secs(n.max(1)));
            }
            None => options.push(w.clone()),
        }
    }
    Ok(Invocation { options, immediate, command })
}

/// sbatch's options an allocation has no use for.
fn refused(o: &BatchOptions) -> Option<&'static str> {
    [
        ("--output", o.output.is_some()),
        ("--error", o.error.is_some()),
        ("--array", o.array.is_some()),
        ("--chdir", o.chdir.is_some()),
    ]
    .into_iter()
    .find(|(_, given)| *given)
    .map(|(flag, _)| flag)
}

/// The allocation's Job: sbatch's options, each member sleeping (holding
/// its CPUs) until released or stopped at its time limit.
fn allocation(id: &str, o: &BatchOptions) -> anyhow::Result<specs::job::Job> {
    let hold = vec!["sleep".to_string(), "infinity".to_string()];
    let mut job = super::batch::job_running(id, o, hold)?;
    if let Some(a) = &o.account {
        job.metadata.labels.insert(batch::ACCOUNT_LABEL.into(), a.clone());
    }
    Ok(job)
}

/// What the members say once all of them run: their nodes, in rank order.
#[derive(Debug, PartialEq, Eq)]
enum Members {
    Waiting,
    Granted { nodes: Vec<String>, tasks: usize },
    Ended(String),
}

fn judge(size: u32, pods: &[specs::Pod]) -> Members {
    let mut ranked: Vec<(u32, &specs::Pod)> =
        pods.iter().filter_map(|p| specs::job::membership(p).map(|(_, r, _)| (r, p))).collect();
    ranked.sort_by_key(|(r, _)| *r);
    let mut nodes = Vec::new();
    let mut running = 0;
    for (_, p) in &ranked {
        let st = p.status.clone().unwrap_or_default();
        match st.phase {
            PodPhase::Running => {
                running += 1;
                if let Some(n) = st.node_name {
                    if !nodes.contains(&n) {
                        nodes.push(n);
                    }
                }
            }
            PodPhase::Succeeded | PodPhase::Failed => {
                let why = st.message.or(st.reason).unwrap_or_else(|| format!("{:?}", st.phase));
                return Members::Ended(format!("member {} ended: {why}", p.metadata.name));
            }
            _ => {}
        }
    }
    if running == size as usize && size > 0 {
        Members::Granted { nodes, tasks: running }
    } else {
        Members::Waiting
    }
}

pub async fn run(g: GlobalArgs, args: Args) -> anyhow::Result<ExitCode> {
    let inv = split(&args.words)?;
    let options = batch::parse_args(&inv.options).map_err(|e| anyhow::anyhow!("{e}"))?;
    if let Some(flag) = refused(&options) {
        bail!("{flag}: not for an allocation (its members run no script; `pinion run` in the shell prints its output)");
    }
    let name = options.job_name.clone().unwrap_or_else(|| format!("alloc-{}", super::batch::suffix()));
    let job = allocation(&name, &options)?;
    let size = job.spec.parallelism;
    let client = crate::config::client(&g)?;
    // Caught before the create: a signal while it is made still releases it.
    let mut signals = Signals::catch_with_hangup()?;
    let body = serde_json::to_vec(&job).context("encoding the job")?;
    match client.create_job(Bytes::from(body)).await {
        Ok((201, _)) => {}
        Ok(_) => bail!("job {name} already exists: cancel it (`pinion cancel {name}`) or pick another name (-J)"),
        Err(e) => return Err(anyhow::Error::new(e).context(format!("submitting allocation {name}"))),
    }
    eprintln!("salloc: Pending job allocation {name}");
    let outcome = granted_then_shell(&g, &client, &name, size, &inv, &mut signals).await;
    release(&client, &name).await;
    outcome
}

async fn granted_then_shell(
    g: &GlobalArgs,
    client: &Client,
    name: &str,
    size: u32,
    inv: &Invocation,
    signals: &mut Signals,
) -> anyhow::Result<ExitCode> {
    let limit = async {
        match inv.immediate {
            Some(d) => tokio::time::sleep(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(limit);
    let selector = format!("{}={name}", specs::job::JOB_LABEL);
    let mut said_queued = false;
    let (nodes, tasks) = loop {
        let pods = client.list_pods(Some(&selector)).await.with_context(|| format!("reading allocation {name}"))?;
        match judge(size, &pods.items) {
            Members::Granted { nodes, tasks } => break (nodes, tasks),
            Members::Ended(why) => bail!("allocation {name} was not granted: {why}"),
            Members::Waiting => {}
        }
        if pods.items.is_empty() {
            if let Ok(j) = client.get_job(name).await {
                let st = j.status.unwrap_or_default();
                if st.phase.is_terminal() {
                    let why = st.message.or(st.reason).unwrap_or_else(|| format!("{:?}", st.phase));
                    bail!("allocation {name} was not granted: {why}");
                }
            }
        }
        if !said_queued {
            eprintln!("salloc: job {name} queued and waiting for resources");
            said_queued = true;
        }
        tokio::select! {
            _ = tokio::time::sleep(POLL) => {}
            _ = &mut limit => bail!("allocation {name}: not granted within the --immediate bound"),
            n = signals.recv() => {
                eprintln!("salloc: Job allocation {name} has been revoked (signal {n} while waiting)");
                return Ok(ExitCode::from((128 + n) as u8));
            }
        }
    };
    eprintln!("salloc: Granted job allocation {name}");
    let (program, rest) = match inv.command.split_first() {
        Some((p, rest)) => (p.clone(), rest.to_vec()),
        None => (std::env::var("SHELL").ok().filter(|s| !s.is_empty()).unwrap_or_else(|| "/bin/sh".into()), Vec::new()),
    };
    let mut cmd = tokio::process::Command::new(&program);
    cmd.args(&rest)
        .env(specs::step::JOB_ENV, name)
        .env("PINION_NNODES", nodes.len().to_string())
        .env("PINION_NTASKS", tasks.to_string())
        .env("PINION_JOB_NODELIST", nodes.join(","));
    // The steps in the shell reach the same cluster with the same credentials.
    if let Some(c) = &g.config {
        cmd.env("PINION_CONFIG", c);
    }
    let mut child = cmd.spawn().with_context(|| format!("starting {program}"))?;
    let mut watch = tokio::time::interval(WATCH);
    watch.tick().await;
    let mut revoked = false;
    let status = loop {
        tokio::select! {
            s = child.wait() => break s.with_context(|| format!("waiting for {program}"))?,
            n = signals.recv() => {
                hang_up(&mut child).await;
                eprintln!("salloc: signal {n}: releasing job allocation {name}");
                return Ok(ExitCode::from((128 + n) as u8));
            }
            _ = watch.tick(), if !revoked => {
                if gone(client, name).await {
                    eprintln!("salloc: Job allocation {name} has been revoked");
                    revoked = true;
                    hang_up(&mut child).await;
                }
            }
        }
    };
    Ok(exit_code(status))
}

/// The exit status `alloc` gives for its shell's.
fn exit_code(status: std::process::ExitStatus) -> ExitCode {
    match (status.code(), status.signal()) {
        (Some(c), _) => ExitCode::from(c.clamp(0, 255) as u8),
        (None, Some(s)) => ExitCode::from((128 + s).clamp(0, 255) as u8),
        (None, None) => ExitCode::FAILURE,
    }
}

/// Whether the allocation is no more (deleted, or ended at its time limit).
async fn gone(client: &Client, name: &str) -> bool {
    match client.get_job(name).await {
        Ok(j) => j.status.is_some_and(|s| s.phase.is_terminal()),
        Err(ClientError::Api(e)) => e.code == 404,
        // The server unreachable for a moment is no reason to end a shell.
        Err(_) => false,
    }
}

/// SIGHUP to the shell (what a closed terminal sends; a shell leaves on
/// it), SIGKILL after `SHELL_GRACE`.
async fn hang_up(child: &mut tokio::process::Child) {
    if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGHUP);
    }
    if tokio::time::timeout(SHELL_GRACE, child.wait()).await.is_err() {
        let _ = child.kill().await;
    }
}

/// Deletes the allocation's job (its members stop), once, saying so.
async fn release(client: &Client, name: &str) {
    eprintln!("salloc: Relinquishing job allocation {name}");
    match client.delete_job(name).await {
        Ok(_) => {}
        Err(ClientError::Api(e)) if e.code == 404 => {}
        Err(e) => eprintln!("pinion: could not delete job {name}: {e} (`pinion cancel {name}`)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_string).collect()
    }

    #[test]
    fn options_immediate_and_the_command_come_apart() {
        let inv = split(&words("-N 1 -c 1 -I5 -J a -- sh -c x")).expect("split");
        assert_eq!(inv.options, words("-N 1 -c 1 -J a"));
        assert_eq!(inv.immediate, Some(Duration::from_secs(5)));
        assert_eq!(inv.command, words("sh -c x"));
        let inv = split(&words("--time=1:00 --exclusive")).expect("split");
        assert_eq!((inv.options.len(), inv.immediate, inv.command.len()), (2, None, 0));
        let e = split(&words("--immediate=x")).expect_err("bad seconds");
        assert!(e.to_string().contains("--immediate=x"), "{e}");
    }

    #[test]
    fn an_allocation_is_a_job_of_sleeping_members() {
        let o = batch::parse_args(&words("-N 1 -n 2 -c 1 -t 10 -A lab")).expect("options");
        assert_eq!(refused(&o), None);
        let job = allocation("a", &o).expect("job");
        assert_eq!(job.spec.parallelism, 2);
        assert_eq!(job.spec.active_deadline_seconds, Some(600));
        assert_eq!(job.spec.template.spec.containers[0].command, words("sleep infinity"));
        assert!(specs::job::validate_job(&job).is_empty(), "{:?}", specs::job::validate_job(&job));
        let o = batch::parse_args(&words("-o out.txt")).expect("options");
        assert_eq!(refused(&o), Some("--output"));
    }

    #[test]
    fn granted_once_every_member_runs() {
        let job = allocation("a", &batch::parse_args(&words("-n 2")).expect("options")).expect("job");
        let mut pods = specs::job::members(&job);
        assert_eq!(judge(2, &pods), Members::Waiting);
        for (i, p) in pods.iter_mut().enumerate() {
            let st = p.status.get_or_insert_with(Default::default);
            st.phase = PodPhase::Running;
            st.node_name = Some(format!("n{}", i / 2));
        }
        assert_eq!(judge(2, &pods), Members::Granted { nodes: vec!["n0".into()], tasks: 2 });
        pods[1].status.get_or_insert_with(Default::default).phase = PodPhase::Failed;
        assert!(matches!(judge(2, &pods), Members::Ended(w) if w.contains("member a-1 ended")));
    }
}
