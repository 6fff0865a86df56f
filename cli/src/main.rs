//! `pinion`: the one binary. Client verbs and the daemons as subcommands; this
//! file only parses flags and dispatches.

// First: the output macros (`out!`, `outln!`) are seen by the modules after it.
#[macro_use]
mod out;

mod cmd;
mod common;
mod config;
mod internal;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "pinion",
    version,
    about = "Topology-aware bare-metal orchestrator: NUMA-aligned, CPU-pinned containers without Kubernetes"
)]
struct Cli {
    #[command(flatten)]
    global: common::GlobalArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// All-in-one: server plus a nodelet on this host, in one process.
    Up(cmd::up::Args),
    /// Take off this host what `up` put there: its containers, the pod
    /// network's bridge, masquerade rules and file; the data dir with --purge.
    Down(cmd::down::Args),
    /// Run the control plane (store, API, scheduler).
    Server(cmd::server::Args),
    /// Run the node agent (static pods from a folder, or joined to a server).
    Agent(cmd::agent::Args),
    /// Create or update objects from files, a folder or stdin.
    Apply(cmd::apply::Args),
    /// List pods, nodes, jobs or deployments.
    Get(cmd::get::Args),
    /// Show one pod or node in detail: placement, CPUs, NUMA, events.
    Describe(cmd::describe::Args),
    /// Delete pods, nodes, jobs or deployments.
    Delete(cmd::delete::Args),
    /// Set a deployment's replicas.
    Scale(cmd::rollout::ScaleArgs),
    /// A deployment's rollout: status, history, undo, restart.
    Rollout(cmd::rollout::RolloutArgs),
    /// Print a container's logs.
    Logs(cmd::logs::Args),
    /// Run a command as a pod, stream its output and exit with its exit code.
    Run(cmd::run::Args),
    /// Submit a job script (Slurm's sbatch): #SBATCH directives, options
    /// on the command line win; prints `Submitted batch job NAME`.
    Batch(cmd::batch::Args),
    /// An interactive allocation (Slurm's salloc): a job whose members hold
    /// their CPUs, a shell with PINION_JOB set in which `pinion run` runs
    /// steps in them; leaving the shell releases it.
    Alloc(cmd::alloc::Args),
    /// Cancel jobs (Slurm's scancel): each job and its members deleted.
    Cancel(cmd::batch::JobsArgs),
    /// The job queue (Slurm's squeue): state codes, times, limits, nodes or
    /// why a job waits, in Slurm's words.
    Queue(cmd::queue::Args),
    /// Each user's and account's recent usage and fair-share factor
    /// (Slurm's sshare).
    Share(cmd::queue::ShareArgs),
    /// Partitions and their nodes by state, CPUs allocated/idle/other/total
    /// and NUMA nodes (Slurm's sinfo).
    Nodes(cmd::queue::NodesArgs),
    /// Finished jobs, their members and pods of their own (Slurm's sacct):
    /// times, state, exit code, CPU time, max RSS; --efficiency is seff.
    Acct(cmd::acct::Args),
    /// Keep pending jobs from starting (Slurm's scontrol hold).
    Hold(cmd::batch::JobsArgs),
    /// Let held jobs start (Slurm's scontrol release).
    Release(cmd::batch::JobsArgs),
    /// Run a command inside a running container of a pod; its output as it comes, its exit code.
    Exec(cmd::exec::Args),
    /// A remote shell into a pod, as `ssh HOST CMD` is: the words after the
    /// pod joined and run by `sh -c` in its container. OpenMPI's launcher:
    /// `mpirun --mca plm_rsh_agent "pinion rsh" --host POD,POD ...`.
    Rsh(cmd::exec::RshArgs),
    /// Draw each node: sockets, NUMA nodes, cores, and which pod holds which CPU.
    Topology(cmd::topology::Args),
    /// Print this machine's (or a fixture's) topology.
    Discover(cmd::discover::Args),
    /// Dry-run the admission engine for one pod on one machine.
    Plan(cmd::plan::Args),
    /// Manage local images (OCI image layouts).
    Image(cmd::image::Args),
    /// The cluster's people: add (with their role, Unix ids and pod
    /// security profile), list, revoke.
    User(cmd::user::Args),
    /// Join tokens with a lifetime and a number of uses: create, list, revoke.
    Token(cmd::token::Args),
    /// Print shell completions.
    Completions(cmd::completions::Args),
    /// Write the systemd unit for `pinion server` or `pinion agent` with these flags.
    Install(cmd::install::Args),
    /// Internal: the per-container helper process (single-threaded).
    #[command(hide = true)]
    Shim(cmd::shim::Args),
    /// Internal: PID 1 of a container with `spec.init` (`pinion init -- CMD...`).
    #[command(hide = true)]
    Init(InitArgs),
}

#[derive(clap::Args, Debug)]
struct InitArgs {
    /// The container's command and its arguments.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    command: Vec<String>,
}

fn main() -> ExitCode {
    // Before clap: the two commands every pod's start runs (internal.rs).
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    match internal::parse(&argv, |k| std::env::var_os(k)) {
        Some(internal::Internal::Shim { data_dir, id, log, log_format }) => {
            common::init_tracing(&log, log_format);
            return report(cmd::shim::run(cmd::shim::Args { data_dir, id, mode: None }));
        }
        Some(internal::Internal::Init(command)) => return init(&command),
        None => {}
    }
    let cli = Cli::parse_from(argv);
    common::init_tracing(&cli.global.log, cli.global.log_format);
    // The shim must stay single-threaded (libcontainer chdirs the process and
    // forks), so it runs before any runtime with worker threads exists.
    if let Command::Shim(args) = cli.command {
        return report(cmd::shim::run(args));
    }
    if let Command::Init(args) = cli.command {
        return init(&args.command);
    }
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => return report(Err(anyhow::anyhow!("cannot start the async runtime: {e}"))),
    };
    let g = cli.global;
    report(rt.block_on(async move {
        match cli.command {
            Command::Up(a) => cmd::up::run(g, a).await,
            Command::Down(a) => cmd::down::run(g, a).await,
            Command::Server(a) => cmd::server::run(g, a).await,
            Command::Agent(a) => cmd::agent::run(g, a).await,
            Command::Apply(a) => cmd::apply::run(g, a).await,
            Command::Get(a) => cmd::get::run(g, a).await,
            Command::Describe(a) => cmd::describe::run(g, a).await,
            Command::Delete(a) => cmd::delete::run(g, a).await,
            Command::Scale(a) => cmd::rollout::scale(g, a).await,
            Command::Rollout(a) => cmd::rollout::rollout(g, a).await,
            Command::Logs(a) => cmd::logs::run(g, a).await,
            Command::Run(a) => cmd::run::run(g, a).await,
            Command::Batch(a) => cmd::batch::run(g, a).await,
            Command::Alloc(a) => cmd::alloc::run(g, a).await,
            Command::Cancel(a) => cmd::batch::cancel(g, a).await,
            Command::Queue(a) => cmd::queue::run(g, a).await,
            Command::Share(a) => cmd::queue::share(g, a).await,
            Command::Nodes(a) => cmd::queue::nodes(g, a).await,
            Command::Acct(a) => cmd::acct::run(g, a).await,
            Command::Hold(a) => cmd::batch::hold(g, a, true).await,
            Command::Release(a) => cmd::batch::hold(g, a, false).await,
            Command::Exec(a) => cmd::exec::run(g, a).await,
            Command::Rsh(a) => cmd::exec::run(g, a.into_exec()).await,
            Command::Topology(a) => cmd::topology::run(g, a).await,
            Command::Discover(a) => cmd::discover::run(g, a).await,
            Command::Plan(a) => cmd::plan::run(g, a).await,
            Command::Image(a) => cmd::image::run(g, a).await,
            Command::User(a) => cmd::user::run(g, a).await,
            Command::Token(a) => cmd::token::run(g, a).await,
            Command::Completions(a) => cmd::completions::run::<Cli>(a),
            Command::Install(a) => {
                cmd::install::run(a, |argv| Cli::try_parse_from(argv).map(|_| ()).map_err(|e| e.to_string()))
            }
            Command::Shim(_) | Command::Init(_) => unreachable!("handled above"),
        }
    }))
}

/// A container's PID 1 forks its command: no threads may exist yet.
fn init(command: &[String]) -> ExitCode {
    let code = nodelet::runtime::init::run(command);
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}

/// One clear line on stderr and a non-zero exit; commands that mirror another
/// process's exit code (`run`) return it as `Ok(code)`.
fn report(r: anyhow::Result<ExitCode>) -> ExitCode {
    match r {
        Ok(code) => code,
        // A reader that went away (`| head`): the end, quietly.
        Err(e) if out::is_closed_pipe(&e) => ExitCode::from(out::CLOSED_PIPE as u8),
        Err(e) => {
            eprintln!("error: {}", error_line(&e));
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes on one line, each cause only when its text is not
/// already in what comes before it (a wrapper that repeats its source, as
/// `cannot connect to X: Connection refused`, would otherwise print it
/// twice), then what to do about a refused connection.
fn error_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if text.is_empty() || line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    let refused = e.chain().find_map(|c| match c.downcast_ref::<pinion_wire::ClientError>() {
        Some(pinion_wire::ClientError::Connect { addr, source })
            if source.kind() == std::io::ErrorKind::ConnectionRefused =>
        {
            Some(addr.clone())
        }
        _ => None,
    });
    if let Some(addr) = refused {
        line.push_str(&format!("; is a server running at https://{addr}? (start one with: pinion up)"));
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_cause_once_and_a_hint_for_a_refused_connection() {
        let refused =
            || std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "Connection refused (os error 111)");
        let e =
            anyhow::Error::new(pinion_wire::ClientError::Connect { addr: "127.0.0.1:7443".into(), source: refused() });
        assert_eq!(
            error_line(&e),
            "cannot connect to 127.0.0.1:7443: Connection refused (os error 111); is a server running at https://127.0.0.1:7443? (start one with: pinion up)"
        );
        // A context that repeats its cause, as a bare io::Error in anyhow does.
        let e = anyhow::Error::new(refused()).context("Connection refused (os error 111)");
        assert_eq!(error_line(&e), "Connection refused (os error 111)");
        let e = anyhow::anyhow!("inner").context("outer");
        assert_eq!(error_line(&e), "outer: inner");
    }
}
