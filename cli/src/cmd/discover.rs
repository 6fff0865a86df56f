//! `pinion discover`: prints a machine's `NodeTopology`, from this host's `/sys`, a
//! sysfs tree (`--sysfs-root`), hwloc XML (`--hwloc-xml`), a synthetic description or a
//! saved topology file.
//!
//! Without `-o`, a terminal gets the text drawing and a pipe gets JSON, so
//! `pinion discover > node.json` writes what `--topology FILE` reads back.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::process::ExitCode;

use anyhow::Context;

use crate::common::{GlobalArgs, Output, TopologyArgs};

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub source: TopologyArgs,
    /// Output format [default: text on a terminal, json otherwise].
    #[arg(short = 'o', long, value_enum)]
    pub output: Option<Output>,
}

pub async fn run(_g: GlobalArgs, args: Args) -> anyhow::Result<ExitCode> {
    let topology = args.source.load().context("discovering the topology")?;
    let output = args.output.unwrap_or(if std::io::stdout().is_terminal() { Output::Text } else { Output::Json });
    let text = match output {
        Output::Json => {
            let mut s = serde_json::to_string_pretty(&topology).context("encoding JSON")?;
            s.push('\n');
            s
        }
        Output::Yaml => serde_yaml_ng::to_string(&topology).context("encoding YAML")?,
        Output::Text => specs::topology::draw::draw(&topology, &BTreeMap::new()),
    };
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(text.as_bytes()).context("writing to stdout")?;
    stdout.flush().context("writing to stdout")?;
    Ok(ExitCode::SUCCESS)
}
