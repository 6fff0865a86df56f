//! `pinion completions SHELL`

use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// bash, zsh, fish, elvish or powershell
    pub shell: clap_complete::Shell,
}

pub fn run<C: clap::CommandFactory>(args: Args) -> anyhow::Result<ExitCode> {
    let mut cmd = C::command();
    clap_complete::generate(args.shell, &mut cmd, "pinion", &mut std::io::stdout());
    Ok(ExitCode::SUCCESS)
}
