//! `pinion plan`: runs the admission engine once, as a dry run, and prints the
//! decision for one pod on one machine (from `/sys`, a sysfs tree, hwloc XML, a saved
//! topology or a synthetic description).
//!
//! JSON is `{admit, reason, numaAffinity, containers: [{name, cpus, mems, devices}]}`
//! with CPU and node lists as sorted integer arrays; `reason` is null when
//! admitted, else `"<RejectReason>: <message>"`. When a relaxed resource
//! (`spec.topology.relaxed`) was placed outside the NUMA affinity, `remote`
//! lists it: `[{container, resource, numaNodes, reason}]` (absent otherwise). Exit code 0 when the pod is
//! admitted, 1 when it is rejected (the decision is still printed), 2 never
//! (clap's usage errors), and 1 with an `error:` line for bad input.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context};
use serde::Serialize;
use specs::engine::{admit, Allocations, ContainerPlacement, NodeSettings, Placement, Rejection, RemotePlacement};
use specs::pod::{CpuPolicy, TopologyPolicy, TopologyScope};
use specs::{CpuSet, NumaSet};

use crate::common::{GlobalArgs, Output, TopologyArgs};

#[derive(clap::ValueEnum, Debug, Clone, Copy)]
pub enum PolicyArg {
    None,
    BestEffort,
    Restricted,
    SingleNumaNode,
}

#[derive(clap::ValueEnum, Debug, Clone, Copy)]
pub enum ScopeArg {
    Container,
    Pod,
}

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The pod manifest (YAML or JSON; `-` reads stdin). It must hold one pod.
    #[arg(short = 'f', long = "file", value_name = "POD.yaml")]
    pub file: PathBuf,
    #[command(flatten)]
    pub source: TopologyArgs,
    /// CPUs kept for the system (Linux list syntax, e.g. `0,56`).
    #[arg(long, value_name = "LIST")]
    pub reserved_cpus: Option<CpuSet>,
    /// CPUs already held exclusively by other pods (Linux list syntax).
    #[arg(long, value_name = "LIST")]
    pub allocated_cpus: Option<CpuSet>,
    /// The node's topology-manager policy (a pod's `spec.topology` overrides it).
    #[arg(long, value_enum, default_value = "none")]
    pub topology_policy: PolicyArg,
    /// The node's topology-manager scope (a pod's `spec.topology` overrides it).
    #[arg(long, value_enum, default_value = "container")]
    pub topology_scope: ScopeArg,
    /// CPU-manager option as KEY=true|false (the kubelet's names: full-pcpus-only,
    /// distribute-cpus-across-numa, align-by-socket, distribute-cpus-across-cores,
    /// prefer-align-cpus-by-uncorecache, strict-cpu-reservation); repeatable.
    #[arg(long = "cpu-manager-option", value_name = "KEY=VALUE")]
    pub cpu_manager_options: Vec<String>,
    /// Among equally narrow NUMA sets, prefer the closest by the distance matrix.
    #[arg(long)]
    pub prefer_closest_numa_nodes: bool,
    /// A device resource and its PCI addresses, e.g.
    /// `pinion.io/nic=0000:3b:00.0,0000:3b:00.1`; repeatable. Replaces a
    /// resource of that name the topology offers (discovered GPUs, VFs).
    #[arg(long = "device", value_name = "NAME=ADDR,...")]
    pub devices: Vec<String>,
    /// Output format [default: text on a terminal, json otherwise].
    #[arg(short = 'o', long, value_enum)]
    pub output: Option<Output>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Decision {
    admit: bool,
    reason: Option<String>,
    numa_affinity: NumaSet,
    containers: Vec<ContainerOut>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    remote: Vec<RemotePlacement>,
}

#[derive(Serialize)]
struct ContainerOut {
    name: String,
    cpus: CpuSet,
    mems: NumaSet,
    devices: Vec<String>,
}

fn settings(args: &Args) -> anyhow::Result<NodeSettings> {
    let mut s = NodeSettings {
        reserved_cpus: args.reserved_cpus.clone().unwrap_or_default(),
        topology_policy: match args.topology_policy {
            PolicyArg::None => TopologyPolicy::None,
            PolicyArg::BestEffort => TopologyPolicy::BestEffort,
            PolicyArg::Restricted => TopologyPolicy::Restricted,
            PolicyArg::SingleNumaNode => TopologyPolicy::SingleNumaNode,
        },
        topology_scope: match args.topology_scope {
            ScopeArg::Container => TopologyScope::Container,
            ScopeArg::Pod => TopologyScope::Pod,
        },
        prefer_closest_numa_nodes: args.prefer_closest_numa_nodes,
        ..Default::default()
    };
    s = crate::cmd::agent::with_cpu_manager_options(s, &args.cpu_manager_options)?;
    for d in &args.devices {
        let Some((name, addrs)) = d.split_once('=') else {
            bail!("--device {d}: expected NAME=ADDR[,ADDR...]");
        };
        if name.is_empty() || !name.contains('/') {
            bail!("--device {d}: resource name {name:?} must look like vendor.io/name");
        }
        let list: Vec<String> = addrs.split(',').map(str::trim).filter(|a| !a.is_empty()).map(String::from).collect();
        if list.is_empty() {
            bail!("--device {d}: no addresses");
        }
        s.devices.entry(name.to_string()).or_default().extend(list);
    }
    Ok(s)
}

fn read_manifest(path: &PathBuf) -> anyhow::Result<String> {
    if path.as_os_str() == "-" {
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text).context("reading the pod from stdin")?;
        return Ok(text);
    }
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

fn decision(r: &Result<Placement, Rejection>) -> Decision {
    match r {
        Ok(p) => Decision {
            admit: true,
            reason: None,
            numa_affinity: p.numa_affinity.clone(),
            containers: p.containers.iter().map(container_out).collect(),
            remote: p.remote.clone(),
        },
        Err(rej) => Decision {
            admit: false,
            reason: Some(format!("{:?}: {}", rej.reason, rej.message)),
            numa_affinity: NumaSet::new(),
            containers: Vec::new(),
            remote: Vec::new(),
        },
    }
}

fn container_out(c: &ContainerPlacement) -> ContainerOut {
    let mut devices: Vec<String> = c.devices.values().flatten().cloned().collect();
    devices.sort();
    ContainerOut { name: c.name.clone(), cpus: c.cpus.clone(), mems: c.mems.clone(), devices }
}

fn text(d: &Decision) -> String {
    let or_dash = |s: String| if s.is_empty() { "-".to_string() } else { s };
    let mut out = String::new();
    if d.admit {
        out.push_str(&format!("admit: yes\nnuma affinity: {}\n", or_dash(d.numa_affinity.to_string())));
        for c in &d.containers {
            out.push_str(&format!(
                "container {}: cpus {} ({}), mems {}, devices {}\n",
                c.name,
                or_dash(c.cpus.to_string()),
                c.cpus.len(),
                or_dash(c.mems.to_string()),
                or_dash(c.devices.join(","))
            ));
        }
        for r in &d.remote {
            out.push_str(&format!("remote: {r}\n"));
        }
    } else {
        out.push_str(&format!("admit: no\nreason: {}\n", d.reason.as_deref().unwrap_or("")));
    }
    out
}

pub async fn run(_g: GlobalArgs, args: Args) -> anyhow::Result<ExitCode> {
    let mut settings = settings(&args)?;
    let manifest = read_manifest(&args.file)?;
    let mut pods =
        specs::manifest::parse_pods(&manifest).map_err(|e| anyhow::anyhow!("{}: {e}", args.file.display()))?;
    if pods.len() != 1 {
        bail!("{}: holds {} pods; plan decides one", args.file.display(), pods.len());
    }
    let pod = pods.remove(0);
    let topology = args.source.load().context("loading the topology")?;
    // What discovery offers (or a saved topology records), unless `--device` names the resource.
    for (resource, addrs) in topology.device_resources() {
        settings.devices.entry(resource).or_insert(addrs);
    }
    let mut allocations = Allocations::default();
    if let Some(cpus) = &args.allocated_cpus {
        let outside = cpus.difference(&topology.all_cpus());
        if !outside.is_empty() {
            bail!("--allocated-cpus: CPUs {outside} are not on this machine");
        }
        let held = ContainerPlacement {
            name: "allocated".into(),
            cpu_policy: CpuPolicy::Exclusive,
            cpus: cpus.clone(),
            mems: NumaSet::new(),
            memory: BTreeMap::new(),
            hugepages: BTreeMap::new(),
            devices: BTreeMap::new(),
        };
        // A key no manifest can use (pod names are DNS labels), so it never collides.
        allocations.apply(
            "--allocated-cpus",
            Placement { numa_affinity: NumaSet::new(), containers: vec![held], ..Default::default() },
        );
    }
    let result = admit(&topology, &settings, &allocations, pod.name(), &pod);
    let d = decision(&result);
    let output = args.output.unwrap_or(if std::io::stdout().is_terminal() { Output::Text } else { Output::Json });
    let rendered = match output {
        Output::Json => {
            let mut s = serde_json::to_string_pretty(&d).context("encoding JSON")?;
            s.push('\n');
            s
        }
        Output::Yaml => serde_yaml_ng::to_string(&d).context("encoding YAML")?,
        Output::Text => text(&d),
    };
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(rendered.as_bytes()).context("writing to stdout")?;
    stdout.flush().context("writing to stdout")?;
    Ok(if d.admit { ExitCode::SUCCESS } else { ExitCode::from(1) })
}
