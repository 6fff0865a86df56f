//! `pinion batch [OPTIONS] SCRIPT [OPTIONS] [-- ARGS]` (Slurm's `sbatch`), `pinion
//! cancel JOB...` (`scancel`) and `pinion hold/release JOB...`. `batch` reads the script's `#SBATCH`/`#PINION`
//! directives (`specs::batch`), lets the command line's options win, builds
//! the Job as `pinion run -N/-n` does (`run::job`), and submits it; it prints
//! `Submitted batch job NAME` and returns at once.
//!
//! The script travels in the Job: it is one argument of the member's command,
//! `/bin/sh -c WRAPPER`, which writes it into the container's private `/tmp`
//! (mode 0700, as the job's user) and `exec`s it with the script's
//! arguments, so its `#!` line chooses the interpreter as under `sbatch`.
//! Its output is appended on the node to the `-o`/`-e` files, opened there
//! as the job's user (`nodelet::runtime::output`), besides Pinion's own log.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context};
use bytes::Bytes;
use specs::batch::{self, BatchOptions, Names};
use specs::Quantity;

use super::run;
use crate::common::GlobalArgs;

/// Writes the script (`$1`) where only its user reads it and runs it with the
/// rest of the arguments. `/tmp` is the container's own tmpfs.
const WRAPPER: &str = r#"f=$(mktemp /tmp/pinion-batch.XXXXXX) || exit 1
printf '%s' "$1" > "$f" && chmod 700 "$f" || exit 1
shift
exec "$f" "$@""#;

#[derive(clap::Args, Debug)]
#[command(after_help = "OPTIONS (as sbatch's; in the script as #SBATCH or #PINION lines, the command line wins):
  -J, --job-name NAME        the job's name (%x) and id (%j) [default: the script's name and a suffix]
  -N, --nodes N              at most N nodes
  -n, --ntasks N             N tasks (the script runs as each; default 1)
      --ntasks-per-node K    K tasks on each node
  -c, --cpus-per-task N      N exclusive, pinned CPUs per task
      --mem SIZE             memory per node (K, M, G, T; megabytes without a unit)
      --mem-per-cpu SIZE     memory per CPU
  -t, --time TIME            time limit: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S
  -o, --output PATTERN       stdout file on the node [default: pinion-%j.out in this directory]
  -e, --error PATTERN        stderr file [default: with stdout]; %j %x %a %A %%
  -a, --array SPEC           one job per task: 1-100, 1,3,5-7, 0-20:5
  -d, --dependency DEP       afterok:J1:J2,afterany:J3 (, all; ? any); after, afternotok
      --gres gpu:N, --gpus N GPUs per task
      --exclusive            recorded only (each task's CPUs are exclusive anyway)
  -A, --account NAME         recorded as the label pinion.io/account
  -p, --partition NAME       the partition (`pinion get partitions`) [default: the cluster's default]
      --priority P           placed before jobs of a lower priority
  -D, --chdir DIR            the directory output files are relative to")]
pub struct Args {
    /// sbatch's options (see below), the job script (it must start with
    /// `#!`), more options, then `--` and the script's arguments.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true, value_name = "[OPTIONS] SCRIPT")]
    pub words: Vec<String>,
}

#[derive(clap::Args, Debug)]
pub struct JobsArgs {
    /// The jobs (their ids, as `pinion batch` printed them; names for jobs
    /// made otherwise).
    #[arg(required = true)]
    pub jobs: Vec<String>,
}

/// What one submission makes: a job per array task, or one job.
#[derive(Debug)]
pub struct Submission {
    pub id: String,
    pub jobs: Vec<specs::job::Job>,
}

/// The jobs `batch` submits for `script` (its text), named after `file`,
/// given `options` (directives and command line merged), the script's
/// arguments, the working directory and a suffix that makes a default id
/// unique.
pub fn jobs(
    file: &Path,
    script: &str,
    o: &BatchOptions,
    script_args: &[String],
    cwd: &Path,
    suffix: &str,
) -> anyhow::Result<Submission> {
    let name = match &o.job_name {
        Some(n) => n.clone(),
        None => default_name(file),
    };
    // A given name is the id, as `pinion run NAME`; a default one gets a
    // suffix, so that a script submitted twice is two jobs, as with sbatch.
    let id = if o.job_name.is_some() { name.clone() } else { format!("{name}-{suffix}") };
    let tasks: Option<Vec<u32>> = match &o.array {
        Some(spec) => {
            let a = run::parse_array(spec).map_err(anyhow::Error::msg)?;
            if a.parallelism.is_some() {
                bail!("--array {spec:?}: a %N limit is not supported by pinion batch yet (pinion run --array has it)");
            }
            Some(a.tasks)
        }
        None => None,
    };
    let dir = match &o.chdir {
        Some(d) if Path::new(d).is_absolute() => PathBuf::from(d),
        Some(d) => cwd.join(d),
        None => cwd.to_path_buf(),
    };
    let mut jobs = Vec::new();
    for task in tasks.clone().map(|t| t.into_iter().map(Some).collect()).unwrap_or_else(|| vec![None]) {
        let job_id = match task {
            Some(t) => format!("{id}-{t}"),
            None => id.clone(),
        };
        let names = Names { job_id: &job_id, job_name: &name, task, array: task.map(|_| id.as_str()) };
        let path = |pattern: &str| -> anyhow::Result<String> {
            let expanded = batch::expand(pattern, &names).map_err(anyhow::Error::msg)?;
            Ok(dir.join(expanded).to_string_lossy().into_owned())
        };
        let output = path(o.output.as_deref().unwrap_or(batch::DEFAULT_OUTPUT))?;
        let error = o.error.as_deref().map(path).transpose()?;
        let mut job = one_job(&job_id, script, o, script_args)?;
        let template = job.spec.template.metadata.get_or_insert_with(Default::default);
        template.annotations.insert(batch::OUTPUT_ANNOTATION.into(), output);
        if let Some(e) = error {
            template.annotations.insert(batch::ERROR_ANNOTATION.into(), e);
        }
        if let Some(t) = task {
            template.labels.insert(specs::pod::ARRAY_LABEL.into(), id.clone());
            for c in &mut job.spec.template.spec.containers {
                specs::job::set_env(&mut c.env, run::ARRAY_TASK_ENV, &t.to_string());
            }
        }
        let labels = &mut job.metadata.labels;
        labels.insert(batch::NAME_LABEL.into(), name.clone());
        if let Some(a) = &o.account {
            labels.insert(batch::ACCOUNT_LABEL.into(), a.clone());
        }
        let annotations = &mut job.metadata.annotations;
        annotations.insert(batch::SCRIPT_ANNOTATION.into(), file.display().to_string());
        if o.exclusive {
            annotations.insert(batch::EXCLUSIVE_ANNOTATION.into(), "true".into());
        }
        jobs.push(job);
    }
    Ok(Submission { id, jobs })
}

/// The script's file name as a job name: lower case, `-` for anything a
/// DNS label does not hold, at most 40 characters (room for the suffix and
/// the member ranks).
fn default_name(file: &Path) -> String {
    let stem = file.file_stem().map(|s| s.to_string_lossy().to_lowercase()).unwrap_or_default();
    let mut name: String = stem.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).collect();
    name.truncate(40);
    let name = name.trim_matches('-').to_string();
    if name.is_empty() {
        "batch".into()
    } else {
        name
    }
}

/// One job through `run::job`, the code `pinion run -N/-n` submits with.
fn one_job(id: &str, script: &str, o: &BatchOptions, script_args: &[String]) -> anyhow::Result<specs::job::Job> {
    let mut command = vec!["/bin/sh".to_string(), "-c".into(), WRAPPER.into(), "pinion-batch".into(), script.into()];
    command.extend(script_args.iter().cloned());
    job_running(id, o, command)
}

/// The Job sbatch's (and salloc's) options `o` ask for, each member running
/// `command`: `pinion alloc` builds its allocation with it too.
pub fn job_running(id: &str, o: &BatchOptions, command: Vec<String>) -> anyhow::Result<specs::job::Job> {
    let ntasks = o.ntasks.or(if o.nodes.is_some() { None } else { Some(1) });
    let cpus = o.cpus_per_task;
    let per_node_tasks = match (o.ntasks_per_node, o.nodes, ntasks) {
        (Some(k), _, _) => k,
        (None, Some(n), Some(t)) => t.div_ceil(n),
        _ => 1,
    };
    let memory = match (&o.mem_per_cpu, &o.mem) {
        (Some(m), _) => Some(times(m, u64::from(cpus.unwrap_or(1)))?),
        (None, Some(m)) => Some(divided(m, u64::from(per_node_tasks))?),
        (None, None) => None,
    };
    let args = run::Args {
        name: id.to_string(),
        host: true,
        image: None,
        pull: None,
        cpus: cpus.map(|c| Quantity::from_units(i64::from(c))),
        memory,
        nodes: o.nodes,
        ntasks_per_node: o.ntasks_per_node.filter(|_| o.nodes.is_some()),
        ntasks: if o.nodes.is_some() && o.ntasks_per_node.is_some() { None } else { ntasks },
        spread: false,
        priority: o.priority,
        keep_running: false,
        devices: Vec::new(),
        gpus: o.gpus,
        policy: None,
        cpu_policy: None,
        cap_add: Vec::new(),
        env: Vec::new(),
        volumes: Vec::new(),
        host_network: false,
        userns: false,
        node_selector: Vec::new(),
        detach: true,
        rm: false,
        grace: None,
        timeout: None,
        time: None,
        no_init: false,
        wait_for_nodes: false,
        array: None,
        pty: false,
        command,
    };
    if o.ntasks_per_node.is_some() && o.nodes.is_none() {
        bail!("--ntasks-per-node needs --nodes");
    }
    let mut job = run::job(&args)?.context("a batch job is always a Job")?;
    job.spec.active_deadline_seconds = o.time.flatten();
    job.spec.dependency = o.dependency.as_ref().map(ToString::to_string);
    job.spec.partition = o.partition.clone();
    Ok(job)
}

fn times(q: &Quantity, n: u64) -> anyhow::Result<Quantity> {
    let bytes = u64::try_from(q.units_ceil()).context("memory")?;
    let total = bytes.checked_mul(n).context("memory: too much")?;
    Ok(Quantity::from_units(i64::try_from(total).context("memory: too much")?))
}

fn divided(q: &Quantity, n: u64) -> anyhow::Result<Quantity> {
    let bytes = u64::try_from(q.units_ceil()).context("memory")?;
    Ok(Quantity::from_units(i64::try_from(bytes / n.max(1)).context("memory: too much")?))
}

pub async fn run(g: GlobalArgs, args: Args) -> anyhow::Result<ExitCode> {
    let batch::Invocation { options: flags, script, args: script_args } =
        batch::split_invocation(&args.words).map_err(|e| anyhow::anyhow!("{e}"))?;
    let script = PathBuf::from(script);
    let text = read_script(&script)?;
    let directives = batch::parse_script(&text).map_err(|e| anyhow::anyhow!("{}: {e}", script.display()))?;
    let given = batch::parse_args(&flags).map_err(|e| anyhow::anyhow!("{e}"))?;
    let options = given.over(directives);
    let cwd = std::env::current_dir().context("the working directory")?;
    let submission = jobs(&script, &text, &options, &script_args, &cwd, &suffix())?;
    let client = crate::config::client(&g)?;
    let mut made: Vec<String> = Vec::new();
    for job in &submission.jobs {
        let name = job.metadata.name.clone();
        let body = serde_json::to_vec(job).context("encoding the job")?;
        let created = client.create_job(Bytes::from(body)).await;
        let failure = match created {
            Ok((201, _)) => None,
            Ok(_) => Some(anyhow::anyhow!(
                "job {name} already exists: cancel it (`pinion cancel {name}`) or pick another name (-J)"
            )),
            Err(e) => Some(anyhow::Error::new(e).context(format!("submitting job {name}"))),
        };
        if let Some(e) = failure {
            // An array is submitted whole or not at all.
            for m in &made {
                let _ = client.delete_job(m).await;
            }
            return Err(e);
        }
        made.push(name);
    }
    if submission.jobs.len() > 1 || options.array.is_some() {
        outln!(
            "Submitted batch job {} ({} array tasks: {}-<i>, `pinion get jobs`)",
            submission.id,
            submission.jobs.len(),
            submission.id
        );
    } else {
        outln!("Submitted batch job {}", submission.id);
    }
    Ok(ExitCode::SUCCESS)
}

fn read_script(path: &Path) -> anyhow::Result<String> {
    let meta = std::fs::metadata(path).with_context(|| format!("{}", path.display()))?;
    if meta.len() > batch::MAX_SCRIPT_BYTES as u64 {
        bail!("{}: {} bytes; a batch script is at most {}", path.display(), meta.len(), batch::MAX_SCRIPT_BYTES);
    }
    let bytes = std::fs::read(path).with_context(|| format!("{}", path.display()))?;
    String::from_utf8(bytes).map_err(|_| anyhow::anyhow!("{}: not UTF-8 text", path.display()))
}

/// Six base-36 characters from the clock and the process id: a default
/// job id's suffix, different for each submission.
pub fn suffix() -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let mut n = (nanos as u64 / 1000) ^ (u64::from(std::process::id()) << 40);
    let mut out = String::new();
    for _ in 0..6 {
        let d = (n % 36) as u8;
        out.push(if d < 10 { (b'0' + d) as char } else { (b'a' + d - 10) as char });
        n /= 36;
    }
    out
}

/// `pinion cancel JOB...` (scancel): each job and its members deleted (their
/// containers get SIGTERM, then SIGKILL after their grace).
pub async fn cancel(g: GlobalArgs, args: JobsArgs) -> anyhow::Result<ExitCode> {
    let client = crate::config::client(&g)?;
    let mut failed = 0;
    for name in &args.jobs {
        match client.delete_job(name).await {
            Ok(_) => {}
            Err(e) => {
                eprintln!("pinion: cancel {name}: {e}");
                failed += 1;
            }
        }
    }
    Ok(if failed == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// `pinion hold JOB...` and `pinion release JOB...` (Slurm's `scontrol
/// hold/release`): a pending job is kept from starting, then let go.
pub async fn hold(g: GlobalArgs, args: JobsArgs, hold: bool) -> anyhow::Result<ExitCode> {
    let client = crate::config::client(&g)?;
    let mut failed = 0;
    let verb = if hold { "hold" } else { "release" };
    for name in &args.jobs {
        let r = if hold { client.hold_job(name).await } else { client.release_job(name).await };
        if let Err(e) = r {
            eprintln!("pinion: {verb} {name}: {e}");
            failed += 1;
        }
    }
    Ok(if failed == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(script: &str, flags: &[&str]) -> BatchOptions {
        let flags: Vec<String> = flags.iter().map(|s| s.to_string()).collect();
        batch::parse_args(&flags).expect("flags").over(batch::parse_script(script).expect("script"))
    }

    #[test]
    fn a_script_becomes_a_job_with_its_directives() {
        let script = "#!/bin/bash\n#SBATCH -J sim -N 2 --ntasks-per-node 2 -c 1 --mem-per-cpu=100M\n#SBATCH -t 1:00 -o out-%x-%j.txt -A physics -p short --exclusive -d afterok:prep\necho hi\n";
        let o = options(script, &["-t", "0:30"]);
        let s =
            jobs(Path::new("/home/a/sim.sh"), script, &o, &["x".into()], Path::new("/home/a"), "abc").expect("jobs");
        assert_eq!(s.id, "sim");
        let [job] = s.jobs.as_slice() else { panic!("one job: {s:?}") };
        assert_eq!(job.metadata.name, "sim");
        assert_eq!(job.spec.parallelism, 4);
        assert_eq!((job.spec.gang.nodes, job.spec.gang.per_node), (Some(2), Some(2)));
        assert_eq!(job.spec.active_deadline_seconds, Some(30));
        assert_eq!(job.spec.dependency.as_deref(), Some("afterok:prep"));
        assert_eq!(job.metadata.labels.get(batch::ACCOUNT_LABEL).map(String::as_str), Some("physics"));
        assert_eq!(job.spec.partition.as_deref(), Some("short"));
        let t = job.spec.template.metadata.as_ref().expect("template metadata");
        assert_eq!(t.annotations.get(batch::OUTPUT_ANNOTATION).map(String::as_str), Some("/home/a/out-sim-sim.txt"));
        let c = &job.spec.template.spec.containers[0];
        assert_eq!(c.command[..2], ["/bin/sh".to_string(), "-c".to_string()]);
        assert_eq!(c.command[4..], [script.to_string(), "x".to_string()]);
        assert_eq!(c.resources.limits.get(specs::pod::RESOURCE_MEMORY).map(|q| q.units_ceil()), Some(100 << 20));
        assert_eq!(c.resources.limits.get(specs::pod::RESOURCE_CPU).map(|q| q.units_ceil()), Some(1));
        assert!(specs::job::validate_job(job).is_empty(), "{:?}", specs::job::validate_job(job));
    }

    #[test]
    fn defaults_and_arrays() {
        let script = "#!/bin/sh\n#SBATCH --array=1-2 --mem=1G\ntrue\n";
        let o = options(script, &[]);
        let s = jobs(Path::new("My Script.sh"), script, &o, &[], Path::new("/w"), "k3j9x2").expect("jobs");
        assert_eq!(s.id, "my-script-k3j9x2");
        let names: Vec<&str> = s.jobs.iter().map(|j| j.metadata.name.as_str()).collect();
        assert_eq!(names, ["my-script-k3j9x2-1", "my-script-k3j9x2-2"]);
        let out = |j: &specs::job::Job| {
            j.spec.template.metadata.as_ref().and_then(|m| m.annotations.get(batch::OUTPUT_ANNOTATION).cloned())
        };
        assert_eq!(out(&s.jobs[1]).as_deref(), Some("/w/pinion-my-script-k3j9x2-2.out"));
        assert_eq!(s.jobs[0].spec.parallelism, 1);
        assert_eq!(s.jobs[0].spec.active_deadline_seconds, None);
        let env = &s.jobs[1].spec.template.spec.containers[0].env;
        assert!(env.iter().any(|e| e.name == run::ARRAY_TASK_ENV && e.value == "2"), "{env:?}");
        let o = options(script, &["--array=1-4%2"]);
        let e = jobs(Path::new("a.sh"), script, &o, &[], Path::new("/w"), "x").expect_err("%N");
        assert!(e.to_string().contains("%N limit is not supported"), "{e}");
    }
}
