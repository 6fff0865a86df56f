//! `pinion run [-N n] [-n t] [-c c] -- CMD` inside an allocation (where
//! `PINION_JOB` is set: `pinion alloc`'s shell), Slurm's `srun` inside
//! `salloc`: a step. Its command runs in the allocation's member pods
//! through the exec path (CLI -> server -> node, as `pinion exec`), no new
//! pod made; which members and with what environment is `specs::step`'s
//! decision. Output as a job's members' (`rank: ` before each line when
//! there is more than one task), exit status the worst task's. Ctrl-C or
//! SIGTERM drops the streams, which ends the commands on the nodes.

use std::io::Write;
use std::process::ExitCode;

use anyhow::{bail, Context};
use specs::api::ExecRequest;
use specs::pod::RESOURCE_CPU;
use specs::step::{Member, StepAsk};
use specs::PodPhase;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use super::exec::To;
use super::run::{Args, Labeler};

/// `run`'s flags that make a pod, which a step (no pod of its own) cannot
/// honour: said rather than ignored.
fn pod_only_flags(args: &Args) -> Vec<&'static str> {
    let given = [
        ("--image", args.image.is_some()),
        ("--memory", args.memory.is_some()),
        ("--spread", args.spread),
        ("--priority", args.priority.is_some()),
        ("--device", !args.devices.is_empty()),
        ("--gpus", args.gpus.is_some()),
        ("--policy", args.policy.is_some()),
        ("--cpu-policy", args.cpu_policy.is_some()),
        ("--cap-add", !args.cap_add.is_empty()),
        ("--volume", !args.volumes.is_empty()),
        ("--host-network", args.host_network),
        ("--userns", args.userns),
        ("--node-selector", !args.node_selector.is_empty()),
        ("--detach", args.detach),
        ("--time", args.time.is_some()),
        ("--array", args.array.is_some()),
        ("--wait-for-nodes", args.wait_for_nodes),
    ];
    given.iter().filter(|(_, on)| *on).map(|(f, _)| *f).collect()
}

/// The allocation's running members, from its member pods.
async fn members(client: &pinion_wire::Client, job: &str) -> anyhow::Result<Vec<Member>> {
    let selector = format!("{}={job}", specs::job::JOB_LABEL);
    let listed = client.list_pods(Some(&selector)).await.with_context(|| format!("reading allocation {job}"))?;
    let mut out = Vec::new();
    for pod in listed.items {
        let Some((_, rank, _)) = specs::job::membership(&pod) else { continue };
        let status = pod.status.clone().unwrap_or_default();
        if status.phase != PodPhase::Running {
            bail!("allocation {job}: member {} is {:?}, not Running", pod.metadata.name, status.phase);
        }
        let cpus = pod.spec.containers.first().and_then(|c| c.resources.limits.get(RESOURCE_CPU).cloned());
        out.push(Member { rank, pod: pod.metadata.name, node: status.node_name.unwrap_or_default(), cpus });
    }
    Ok(out)
}

/// What a task's stream tells the printer.
enum Event {
    Output(u32, To, String),
    Done(u32, anyhow::Result<i32>),
}

pub async fn run(g: &crate::common::GlobalArgs, args: &Args, job: &str) -> anyhow::Result<ExitCode> {
    if let Some(flag) = pod_only_flags(args).first() {
        bail!("{flag}: a step runs in allocation {job}'s members, which are already made; leave it out (or leave the allocation)");
    }
    let client = &crate::config::client(g)?;
    let mut term = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("SIGINT handler")?;
    let step = if args.name.is_empty() { super::batch::suffix() } else { args.name.clone() };
    let ask = StepAsk {
        nodes: args.nodes,
        // A terminal is one task's (srun --pty's first).
        ntasks: args.ntasks.or(args.pty.then_some(1)),
        ntasks_per_node: args.ntasks_per_node,
        cpus: args.cpus.clone(),
    };
    let held = members(client, job).await?;
    let tasks = specs::step::plan(job, &step, &held, &ask).map_err(|e| anyhow::anyhow!("{e}"))?;
    if args.pty {
        let [task] = tasks.as_slice() else {
            bail!("--pty: a terminal is one task's; ask for -n 1 (got {} tasks)", tasks.len());
        };
        let request = ExecRequest {
            container: None,
            command: task_command(task, args)?,
            stdin: true,
            tty: true,
            size: super::exec::window_size(),
        };
        let _raw = super::exec::RawMode::enter();
        return tokio::select! {
            r = super::exec::stream(client, &task.pod, &request) => r.map(ExitCode::from),
            _ = int.recv() => Ok(interrupted(job, &step, 130)),
            _ = term.recv() => Ok(interrupted(job, &step, 143)),
        };
    }
    // Unbounded as `run`'s array printer: the printer only writes to the terminal.
    let (tx, mut rx) = mpsc::unbounded_channel::<Event>();
    let mut streams = JoinSet::new();
    for task in &tasks {
        let request =
            ExecRequest { container: None, command: task_command(task, args)?, stdin: false, tty: false, size: None };
        let (client, pod, rank, tx) = (client.clone(), task.pod.clone(), task.rank, tx.clone());
        streams.spawn(async move {
            let out_tx = tx.clone();
            let mut out = move |to: To, data: &str| {
                out_tx
                    .send(Event::Output(rank, to, data.to_string()))
                    .map_err(|_| anyhow::anyhow!("the printer is gone"))
            };
            let r = super::exec::stream_to(&client, &pod, &request, &mut out).await;
            let _ = tx.send(Event::Done(rank, r));
        });
    }
    drop(tx);
    let labelled = tasks.len() > 1;
    let (mut outs, mut errs) = (Labeler::new(labelled), Labeler::new(labelled));
    let mut worst = 0i32;
    loop {
        let event = tokio::select! {
            e = rx.recv() => e,
            _ = int.recv() => return Ok(interrupted(job, &step, 130)),
            _ = term.recv() => return Ok(interrupted(job, &step, 143)),
        };
        let Some(event) = event else { break };
        match event {
            Event::Output(rank, To::Stdout, data) => write(&mut std::io::stdout(), &outs.push(rank, &data)),
            Event::Output(rank, To::Stderr, data) => write(&mut std::io::stderr(), &errs.push(rank, &data)),
            Event::Done(rank, r) => {
                write(&mut std::io::stdout(), &outs.finish(rank));
                write(&mut std::io::stderr(), &errs.finish(rank));
                match r {
                    Ok(code) => worst = worst.max(code),
                    Err(e) => {
                        eprintln!("pinion: step {step} rank {rank}: {e:#}");
                        worst = worst.max(1);
                    }
                }
            }
        }
    }
    while streams.join_next().await.is_some() {}
    Ok(ExitCode::from(worst.clamp(0, 255) as u8))
}

/// A task's command: the step's identity through env(1) (the member's
/// environment, PATH and its own variables, stays; these win), then the
/// step's command.
fn task_command(task: &specs::step::StepTask, args: &Args) -> anyhow::Result<Vec<String>> {
    let mut command = vec!["env".to_string()];
    command.extend(task.env.iter().map(|(k, v)| format!("{k}={v}")));
    command.extend(user_env(args)?);
    command.extend(args.command.iter().cloned());
    Ok(command)
}

/// `-e K=V` of a step: added to each task's environment.
fn user_env(args: &Args) -> anyhow::Result<Vec<String>> {
    args.env
        .iter()
        .map(|e| match e.split_once('=') {
            Some((k, _)) if !k.is_empty() => Ok(e.clone()),
            _ => bail!("--env {e:?}: expected K=V"),
        })
        .collect()
}

fn write(to: &mut dyn Write, text: &str) {
    if !text.is_empty() {
        let _ = to.write_all(text.as_bytes());
        let _ = to.flush();
    }
}

/// Leaving drops the streams: each node ends its task's command.
fn interrupted(job: &str, step: &str, code: u8) -> ExitCode {
    eprintln!("pinion: step {step} of allocation {job} interrupted; its commands are ended on the nodes");
    ExitCode::from(code)
}
