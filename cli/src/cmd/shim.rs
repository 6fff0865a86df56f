//! `pinion shim`: the per-container helper process (internal). It must stay
//! single-threaded: `main` runs it before any async runtime exists, and all the
//! work is in `nodelet::runtime::libcontainer::shim`.

use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The runtime's data directory.
    #[arg(long)]
    pub data_dir: PathBuf,
    /// The container to create (its bundle is already prepared).
    #[arg(long)]
    pub id: String,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let code = nodelet::runtime::libcontainer::shim::run(&args.data_dir, &args.id);
    Ok(ExitCode::from(u8::try_from(code).unwrap_or(1)))
}
