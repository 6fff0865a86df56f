//! `pinion delete pod NAME...`

use std::process::ExitCode;

use crate::common::GlobalArgs;

#[derive(clap::ValueEnum, Debug, Clone, Copy)]
pub enum Kind {
    #[value(alias = "pods")]
    Pod,
}

#[derive(clap::Args, Debug)]
pub struct Args {
    pub kind: Kind,
    #[arg(required = true)]
    pub names: Vec<String>,
}

pub async fn run(g: GlobalArgs, args: Args) -> anyhow::Result<ExitCode> {
    let client = crate::config::client(&g)?;
    let mut failed = 0;
    for name in &args.names {
        match client.delete_pod(name).await {
            Ok(_) => println!("pod/{name} deleted"),
            Err(e) => {
                eprintln!("error: pod/{name}: {e}");
                failed += 1;
            }
        }
    }
    Ok(if failed == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}
