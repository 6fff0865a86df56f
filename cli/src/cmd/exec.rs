//! `pinion exec POD [-c CONTAINER] -- CMD [ARGS...]`: a command run inside a
//! running container of a pod (its namespaces, cgroup and CPUs), its stdout
//! and stderr printed as they come, its exit code this process's. The stream
//! goes CLI -> server -> node (`Client::exec_pod`); leaving it (Ctrl-C,
//! SIGTERM, this process killed) ends the command on the node. Fit to be an
//! MPI launcher's remote agent: one process per remote command, no timeout,
//! heartbeats on every hop.

use std::io::Write;
use std::process::ExitCode;

use anyhow::{bail, Context};
use specs::api::{ExecFrame, ExecRequest};
use tokio::signal::unix::{signal, SignalKind};

use crate::common::GlobalArgs;

#[derive(clap::Args, Debug)]
#[command(after_help = "Without -i the command reads an empty stdin (/dev/null); with it, this process's stdin, \
then end of file when it ends.\n\
Exit status: the command's; 126/127 when it cannot be executed; 130/143 after SIGINT/SIGTERM (the command is \
ended on the node); 1 when the exec could not run or its stream broke.")]
pub struct Args {
    /// The pod.
    pub name: String,
    /// The container (needed when the pod has more than one).
    #[arg(short = 'c', long, value_name = "NAME")]
    pub container: Option<String>,
    /// Forward stdin to the command (its end is the command's end of file).
    #[arg(short = 'i', long)]
    pub stdin: bool,
    /// Run the command on a terminal of the container's (stdin forwarded,
    /// this terminal in raw mode meanwhile, its size passed on).
    #[arg(short = 't', long)]
    pub tty: bool,
    /// The command and its arguments, after `--` (or right after the pod).
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

/// `pinion rsh POD WORDS...`: ssh's calling convention, so a launcher that
/// speaks to ssh (OpenMPI's `plm_rsh_agent`) speaks to a pod. As ssh does,
/// the words are joined with spaces and given to the remote shell, which is
/// what a launcher's command line (`PATH=...; export PATH; orted ...`)
/// expects.
#[derive(clap::Args, Debug)]
pub struct RshArgs {
    /// The pod (a job's member is named `JOB-RANK`, its host name inside).
    pub name: String,
    /// The remote command's words.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true, value_name = "WORDS")]
    pub words: Vec<String>,
}

impl RshArgs {
    pub fn into_exec(self) -> Args {
        let line = self.words.join(" ");
        Args {
            name: self.name,
            container: None,
            stdin: false,
            tty: false,
            command: vec!["sh".into(), "-c".into(), line],
        }
    }
}

pub async fn run(g: GlobalArgs, args: Args) -> anyhow::Result<ExitCode> {
    let client = crate::config::client(&g)?;
    // Caught before the request: a Ctrl-C while it starts still ends it cleanly.
    let mut term = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("SIGINT handler")?;
    let request = ExecRequest {
        container: args.container.clone(),
        command: args.command.clone(),
        stdin: args.stdin || args.tty,
        tty: args.tty,
        size: if args.tty { window_size() } else { None },
    };
    // Raw while the command runs (keys go to it as typed, ^C included);
    // restored when this returns, however it returns.
    let _raw = if args.tty { RawMode::enter() } else { None };
    let streamed = stream(&client, &args.name, &request);
    let signalled = tokio::select! {
        r = streamed => return r.map(ExitCode::from),
        _ = int.recv() => 130,
        _ = term.recv() => 143,
    };
    // Leaving drops the stream: the server and then the node see it go, and
    // the node ends the command and what it started.
    eprintln!("pinion: exec in pod {} interrupted; the command is ended on the node", args.name);
    Ok(ExitCode::from(signalled))
}

/// Prints the command's output as it comes; its exit code.
pub async fn stream(client: &pinion_wire::Client, pod: &str, request: &ExecRequest) -> anyhow::Result<u8> {
    let (mut stdout, mut stderr) = (std::io::stdout(), std::io::stderr());
    let code = stream_to(client, pod, request, &mut |to, data| match to {
        To::Stdout => stdout.write_all(data.as_bytes()).and_then(|()| stdout.flush()).context("writing to stdout"),
        To::Stderr => stderr.write_all(data.as_bytes()).and_then(|()| stderr.flush()).context("writing to stderr"),
    })
    .await?;
    Ok(code.clamp(0, 255) as u8)
}

/// Where a piece of an exec's output goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum To {
    Stdout,
    Stderr,
}

/// Runs `request` in `pod`, giving its output to `out` as it comes (and the
/// line about a command that cannot run to stderr); its exit code. `exec`
/// and the steps of an allocation (`step`) share it.
pub async fn stream_to(
    client: &pinion_wire::Client,
    pod: &str,
    request: &ExecRequest,
    out: &mut (dyn FnMut(To, &str) -> anyhow::Result<()> + Send),
) -> anyhow::Result<i32> {
    let mut frames = client.exec_pod(pod, request).await.with_context(|| format!("exec in pod {pod}"))?;
    // Ended (aborted) with the stream: a forwarder outliving its exec has nowhere to send.
    let mut forwarder = Abort(None);
    loop {
        let frame = frames.next().await.with_context(|| format!("exec in pod {pod}: the stream broke"))?;
        match frame {
            Some(ExecFrame::Started { session }) if request.stdin && forwarder.0.is_none() => {
                let task = forward_stdin(client.clone(), pod.to_string(), session, request.tty);
                forwarder.0 = Some(tokio::spawn(task));
            }
            Some(ExecFrame::Started { .. }) => {}
            Some(ExecFrame::Stdout { data }) => out(To::Stdout, &data)?,
            Some(ExecFrame::Stderr { data }) => out(To::Stderr, &data)?,
            Some(ExecFrame::Heartbeat) => {}
            Some(ExecFrame::Exit { exit_code, message }) => {
                if let Some(line) = cannot_run_line(pod, &request.command, exit_code, message) {
                    out(To::Stderr, &format!("{line}\n"))?;
                }
                return Ok(exit_code);
            }
            Some(ExecFrame::Error { error }) => bail!("exec in pod {pod}: {error}"),
            None => bail!("exec in pod {pod}: the stream ended without an exit code"),
        }
    }
}

/// Aborts the stdin forwarder it holds when dropped.
struct Abort(Option<tokio::task::JoinHandle<()>>);

impl Drop for Abort {
    fn drop(&mut self) {
        if let Some(h) = self.0.take() {
            h.abort();
        }
    }
}

/// This process's stdin to the exec's session, chunk by chunk as read (a
/// terminal's line, a pipe's chunk), each posted once the one before was
/// queued on the node, then its end of file.
async fn forward_stdin(client: pinion_wire::Client, pod: String, session: String, tty: bool) {
    // A blocking read on a thread of its own: stdin may be a terminal, and
    // the runtime's threads must not wait on it.
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<u8>>(4);
    let reader = std::thread::Builder::new().name("stdin".into()).spawn(move || {
        use std::io::Read;
        let mut buf = vec![0u8; specs::limits::MAX_EXEC_INPUT_BYTES / 4];
        let mut stdin = std::io::stdin().lock();
        loop {
            match stdin.read(&mut buf) {
                Ok(0) => return,
                Ok(n) => {
                    if tx.blocking_send(buf[..n].to_vec()).is_err() {
                        return;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return,
            }
        }
    });
    if let Err(e) = reader {
        eprintln!("pinion: exec in pod {pod}: cannot read stdin: {e}");
        return;
    }
    let mut winch = match tty {
        true => signal(SignalKind::window_change()).ok(),
        false => None,
    };
    let mut text = specs::api::TextChunks::default();
    // The size at the start went with the request; again at each SIGWINCH.
    let mut resize = None;
    loop {
        let (data, eof) = if resize.is_some() {
            (String::new(), false)
        } else {
            let changed = async {
                match &mut winch {
                    Some(w) => w.recv().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                got = rx.recv() => match got {
                    Some(bytes) => match text.push(&bytes) {
                        Some(t) => (t, false),
                        None => continue,
                    },
                    None => (text.flush().unwrap_or_default(), true),
                },
                _ = changed => {
                    resize = window_size();
                    continue;
                }
            }
        };
        let input = specs::api::ExecInput { session: session.clone(), data, eof, resize: resize.take() };
        match client.exec_input(&pod, &input).await {
            Ok(()) => {}
            // The exec ended: its stream says how.
            Err(pinion_wire::ClientError::Api(e)) if e.code == 404 => return,
            Err(e) => {
                eprintln!("pinion: exec in pod {pod}: stdin not forwarded further: {e}");
                return;
            }
        }
        if eof {
            return;
        }
    }
}

/// The terminal on stdin in raw mode; its settings restored when dropped.
pub struct RawMode {
    saved: nix::sys::termios::Termios,
}

impl RawMode {
    /// `None` when stdin is no terminal (nothing to do).
    pub fn enter() -> Option<RawMode> {
        use nix::sys::termios::{cfmakeraw, tcgetattr, tcsetattr, SetArg};
        let stdin = std::io::stdin();
        let saved = tcgetattr(&stdin).ok()?;
        let mut raw = saved.clone();
        cfmakeraw(&mut raw);
        tcsetattr(&stdin, SetArg::TCSANOW, &raw).ok()?;
        Some(RawMode { saved })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        let _ = nix::sys::termios::tcsetattr(std::io::stdin(), nix::sys::termios::SetArg::TCSADRAIN, &self.saved);
    }
}

nix::ioctl_read_bad!(get_window_size, nix::libc::TIOCGWINSZ, nix::pty::Winsize);

/// The size of the terminal on stdin, else on stdout; `None` without one.
pub fn window_size() -> Option<specs::api::TerminalSize> {
    use std::os::fd::AsRawFd;
    [std::io::stdin().as_raw_fd(), std::io::stdout().as_raw_fd()].into_iter().find_map(|fd| {
        let mut ws = nix::pty::Winsize { ws_row: 0, ws_col: 0, ws_xpixel: 0, ws_ypixel: 0 };
        // SAFETY: TIOCGWINSZ writes one `winsize` through the pointer, valid
        // for the call; a fd that is no terminal fails with ENOTTY.
        let got = unsafe { get_window_size(fd, &mut ws) };
        got.ok().filter(|_| ws.ws_col > 0).map(|_| specs::api::TerminalSize { cols: ws.ws_col, rows: ws.ws_row })
    })
}

/// The one line said about a command that could not be executed, as `run` says it.
fn cannot_run_line(pod: &str, command: &[String], code: i32, message: Option<String>) -> Option<String> {
    let message = message?;
    let program = command.first().map(String::as_str).unwrap_or("the command");
    let what = match code {
        127 => "command not found".to_string(),
        126 => format!("cannot be executed ({message})"),
        _ => message,
    };
    Some(format!("pinion: exec in pod {pod}: {program}: {what} (exit {code})"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(clap::Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    fn parse(argv: &[&str]) -> (String, Option<String>, Vec<String>) {
        let cli = Cli::try_parse_from(std::iter::once("exec").chain(argv.iter().copied())).expect("parses");
        (cli.args.name, cli.args.container, cli.args.command)
    }

    #[test]
    fn the_command_is_everything_after_the_pod_or_after_dashes() {
        let argv = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(parse(&["web", "--", "sh", "-c", "exit 3"]), ("web".into(), None, argv(&["sh", "-c", "exit 3"])));
        assert_eq!(
            parse(&["web", "-c", "main", "--", "ls", "-l"]),
            ("web".into(), Some("main".into()), argv(&["ls", "-l"]))
        );
        // As an MPI launcher calls its agent: `AGENT HOST CMD ARGS...`.
        assert_eq!(
            parse(&["web", "orted", "-mca", "x", "--"]),
            ("web".into(), None, argv(&["orted", "-mca", "x", "--"]))
        );
        assert!(Cli::try_parse_from(["exec", "web"]).is_err(), "a command is required");
    }

    #[test]
    fn commands_that_cannot_run_get_one_line() {
        let cmd = vec!["/no/such".to_string()];
        assert_eq!(
            cannot_run_line("p", &cmd, 127, Some("command \"/no/such\" not found".into())).as_deref(),
            Some("pinion: exec in pod p: /no/such: command not found (exit 127)")
        );
        assert_eq!(
            cannot_run_line("p", &cmd, 126, Some("command \"/no/such\" is not executable".into())).as_deref(),
            Some("pinion: exec in pod p: /no/such: cannot be executed (command \"/no/such\" is not executable) (exit 126)")
        );
        assert_eq!(cannot_run_line("p", &cmd, 3, None), None);
    }
}
