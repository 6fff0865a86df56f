//! `pinion down`: takes off the host what `pinion up` put there (see
//! `nodelet::down`): containers still running, the pod networks, the
//! default network's masquerade rules, bridge, leases and file, and with
//! `--purge` the data dir. Refused while an up runs on that data dir.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;

use crate::common::GlobalArgs;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// `pinion up`'s data dir.
    #[arg(long, value_name = "DIR", env = "PINION_DATA_DIR", default_value = "/var/lib/pinion")]
    pub data_dir: PathBuf,
    /// Where `pinion up` wrote its default network.
    #[arg(long, value_name = "DIR", default_value = nodelet::cni::DEFAULT_CONF_DIR)]
    pub cni_conf_dir: PathBuf,
    /// Folders holding the CNI plugins (to delete the pods' networks), separated by `:`.
    #[arg(long, value_name = "DIRS", default_value = nodelet::cni::DEFAULT_BIN_DIRS)]
    pub cni_bin_dir: String,
    /// Remove the data dir too: the cluster's CA, credentials, store and the
    /// node's checkpoint. The next `pinion up` starts a new cluster.
    #[arg(long)]
    pub purge: bool,
}

pub async fn run(_g: GlobalArgs, args: Args) -> anyhow::Result<ExitCode> {
    // Held until the end: no agent starts on this data dir meanwhile.
    let _lock = nodelet::down::lock(&args.data_dir)?;
    let down = nodelet::down::Down {
        data_dir: args.data_dir.clone(),
        cni: nodelet::cni::CniConfig::new(args.cni_conf_dir.clone(), nodelet::cni::parse_bin_dirs(&args.cni_bin_dir)),
        shim: std::env::current_exe().context("finding the pinion binary")?,
        purge: args.purge,
    };
    let steps = nodelet::down::run(&down).await?;
    for step in steps {
        outln!("{step}");
    }
    if !args.purge {
        outln!("kept the data dir {} (--purge removes it)", args.data_dir.display());
    }
    Ok(ExitCode::SUCCESS)
}
