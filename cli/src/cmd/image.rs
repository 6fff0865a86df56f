//! `pinion image`: import OCI image layouts into the local store and list them.
//! No registry pulls: sites are air-gapped.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use nodelet::runtime::libcontainer::image;
use nodelet::runtime::libcontainer::records::Layout;

use crate::common::{GlobalArgs, Output};

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(clap::Subcommand, Debug)]
pub enum Command {
    /// Import an OCI image layout (a directory, or a tar/tar.gz archive of one).
    Import {
        file: PathBuf,
        /// NAME:TAG to store it under (default: the layout's ref.name annotation).
        #[arg(long)]
        name: Option<String>,
        /// The nodelet's data directory.
        #[arg(long, env = "PINION_DATA_DIR", default_value = "/var/lib/pinion")]
        data_dir: PathBuf,
    },
    /// List imported images.
    List {
        #[arg(long, env = "PINION_DATA_DIR", default_value = "/var/lib/pinion")]
        data_dir: PathBuf,
        #[arg(short, long, value_enum, default_value = "text")]
        output: Output,
    },
}

pub async fn run(_g: GlobalArgs, args: Args) -> anyhow::Result<ExitCode> {
    match args.command {
        Command::Import { file, name, data_dir } => {
            let images = Layout::new(&data_dir).images();
            let rec = tokio::task::spawn_blocking(move || image::import(&images, &file, name.as_deref()))
                .await
                .context("the import task failed")??;
            println!("imported {} ({}, {} layers)", rec.reference, rec.digest, rec.layers);
        }
        Command::List { data_dir, output } => {
            let images = image::list(&Layout::new(&data_dir).images())?;
            match output {
                Output::Json => println!("{}", serde_json::to_string_pretty(&images)?),
                Output::Yaml => print!("{}", serde_yaml_ng::to_string(&images)?),
                Output::Text => {
                    println!("{:<40} {:<20} COMMAND", "IMAGE", "DIGEST");
                    for i in images {
                        let digest: String = i.digest.trim_start_matches("sha256:").chars().take(12).collect();
                        let cmd: Vec<String> = i.entrypoint.iter().chain(&i.cmd).cloned().collect();
                        println!("{:<40} {:<20} {}", i.reference, digest, cmd.join(" "));
                    }
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
