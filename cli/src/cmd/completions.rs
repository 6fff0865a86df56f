//! `pinion completions SHELL`

use std::io::Write;
use std::process::ExitCode;

use anyhow::Context;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// bash, zsh, fish, elvish or powershell
    pub shell: clap_complete::Shell,
}

pub fn run<C: clap::CommandFactory>(args: Args) -> anyhow::Result<ExitCode> {
    let mut cmd = C::command();
    // Made in memory first: clap_complete panics when its writer fails (a
    // closed pipe); written here, a closed pipe ends the command quietly.
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut cmd, "pinion", &mut script);
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(&script).and_then(|()| stdout.flush()).context("writing to stdout")?;
    Ok(ExitCode::SUCCESS)
}
