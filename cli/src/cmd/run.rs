//! `pinion run`

use std::process::ExitCode;

use crate::common::GlobalArgs;

#[derive(clap::Args, Debug)]
pub struct Args {}

pub async fn run(_g: GlobalArgs, _args: Args) -> anyhow::Result<ExitCode> {
    anyhow::bail!("`pinion run` is not built yet")
}
