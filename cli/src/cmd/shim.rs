//! `pinion shim`: the per-container helper process (internal), and `pinion
//! shim ... exec -- CMD`, the helper that runs one command inside a running
//! container. Both must stay single-threaded: `main` runs them before any
//! async runtime exists, and all the work is in
//! `nodelet::runtime::libcontainer::{shim, exec}`.

use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The runtime's data directory.
    #[arg(long)]
    pub data_dir: PathBuf,
    /// The container to create (its bundle is already prepared), or to exec in.
    #[arg(long)]
    pub id: String,
    #[command(subcommand)]
    pub mode: Option<Mode>,
}

#[derive(clap::Subcommand, Debug)]
pub enum Mode {
    /// Run a command inside the running container (fds 3 and 4: its stdout and stderr).
    Exec {
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        command: Vec<String>,
    },
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let code = match &args.mode {
        None => nodelet::runtime::libcontainer::shim::run(&args.data_dir, &args.id),
        Some(Mode::Exec { command }) => nodelet::runtime::libcontainer::exec::run(&args.data_dir, &args.id, command),
    };
    Ok(ExitCode::from(u8::try_from(code).unwrap_or(1)))
}
