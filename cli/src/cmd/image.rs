//! `pinion image`: the node's image store: import OCI image layouts (an
//! air-gapped site), pull from a registry (`nodelet::registry`, as the
//! agent does for a pod), list and remove.

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
        /// Refuse an image with more layers than this.
        #[arg(long, default_value_t = image::ImportLimits::default().max_layers)]
        max_layers: usize,
        /// Refuse an import that would write more than this (a quantity: 32Gi).
        #[arg(long, default_value = "32Gi", value_parser = parse_bytes)]
        max_bytes: u64,
        /// Refuse an import that would write more files, folders and links than this.
        #[arg(long, default_value_t = image::ImportLimits::default().max_files)]
        max_files: u64,
    },
    /// Pull an image from its registry into this node's store, as the agent
    /// does for a pod (credentials in DATA_DIR/auth.json, CAs in DATA_DIR/certs.d/).
    Pull {
        /// `[REGISTRY/]NAME[:TAG][@sha256:DIGEST]`.
        reference: String,
        #[arg(long, env = "PINION_DATA_DIR", default_value = "/var/lib/pinion")]
        data_dir: PathBuf,
        /// Speak plain HTTP to this registry (HOST:PORT); repeatable.
        #[arg(long, value_name = "HOST[:PORT]")]
        insecure_registry: Vec<String>,
        /// Pull REGISTRY's images from MIRROR (docker.io=mirror.site:5000); repeatable.
        #[arg(long, value_name = "REGISTRY=MIRROR", value_parser = crate::cmd::agent::parse_mirror)]
        registry_mirror: Vec<(String, String)>,
    },
    /// Remove an image's name; its files go with its last name, unless a
    /// container on this node uses them.
    Remove {
        reference: String,
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
        Command::Import { file, name, data_dir, max_layers, max_bytes, max_files } => {
            let images = Layout::new(&data_dir).images();
            let limits = image::ImportLimits { max_layers, max_bytes, max_files };
            let rec = tokio::task::spawn_blocking(move || image::import_with(&images, &file, name.as_deref(), limits))
                .await
                .context("the import task failed")??;
            outln!("imported {} ({}, {} layers)", rec.reference, rec.digest, rec.layers);
        }
        Command::Pull { reference, data_dir, insecure_registry, registry_mirror } => {
            if let Some(why) = specs::validate::image_problem(&reference) {
                anyhow::bail!("{reference}: {why}");
            }
            let mut cfg = nodelet::registry::RegistryConfig::new(&data_dir);
            cfg.insecure = insecure_registry;
            cfg.mirrors = registry_mirror.into_iter().collect();
            let puller = nodelet::registry::Puller::new(cfg);
            let rec = puller.pull(&Layout::new(&data_dir).images(), &reference).await?;
            outln!("pulled {} ({}, {} layers)", rec.reference, rec.digest, rec.layers);
        }
        Command::Remove { reference, data_dir } => {
            let layout = Layout::new(&data_dir);
            let in_use = image::in_use(&layout)?;
            match image::remove(&layout.images(), &reference, &in_use)? {
                image::Removed::Files => outln!("removed {reference} and its files"),
                image::Removed::NameOnly => outln!("removed the name {reference} (its files have other names)"),
                image::Removed::InUse => {
                    outln!("removed the name {reference}; its files stay while a container uses them")
                }
            }
        }
        Command::List { data_dir, output } => {
            let images = image::list(&Layout::new(&data_dir).images())?;
            match output {
                Output::Json => outln!("{}", serde_json::to_string_pretty(&images)?),
                Output::Yaml => out!("{}", serde_yaml_ng::to_string(&images)?),
                Output::Text => {
                    outln!("{:<40} {:<20} COMMAND", "IMAGE", "DIGEST");
                    for i in images {
                        let digest: String = i.digest.trim_start_matches("sha256:").chars().take(12).collect();
                        let cmd: Vec<String> = i.entrypoint.iter().chain(&i.cmd).cloned().collect();
                        outln!("{:<40} {:<20} {}", i.reference, digest, cmd.join(" "));
                    }
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `--max-bytes`: a Kubernetes quantity of bytes (`32Gi`, `500M`, `1048576`).
fn parse_bytes(s: &str) -> Result<u64, String> {
    let q = specs::Quantity::parse(s).map_err(|e| e.to_string())?;
    u64::try_from(q.units_ceil())
        .ok()
        .filter(|b| *b > 0)
        .ok_or_else(|| format!("{s}: must be a positive number of bytes"))
}
