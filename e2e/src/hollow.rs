//! A cluster from the real binary on this host: `pinion server` and one
//! `pinion agent` per node with the hollow runtime, each agent killed with
//! SIGKILL and started again on its data dir at will; the CLI's JSON read
//! back as the API's types. For the tests and benchmarks of nodes that go
//! silent (`cli/tests/node_lost.rs`, `bench_node_lost`).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context};
use specs::Pod;

use crate::process::Proc;

/// What each agent runs as.
#[derive(Debug, Clone)]
pub struct NodeShape {
    /// hwloc words (`pack:1 numa:2 core:8 pu:1`).
    pub synthetic: String,
    pub reserved_cpus: String,
    /// `--topology-policy`.
    pub policy: String,
}

pub struct HollowCluster {
    pinion: PathBuf,
    dir: tempfile::TempDir,
    /// The admin's credentials.
    pub config: PathBuf,
    url: String,
    token: String,
    shape: NodeShape,
    agents: BTreeMap<String, Option<Proc>>,
    _server: Proc,
}

impl HollowCluster {
    /// `pinion server` with `server_flags` (besides its data dir and
    /// listener), then an agent for each of `nodes`.
    pub fn start(pinion: &Path, server_flags: &[&str], nodes: &[&str], shape: NodeShape) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let srv = dir.path().join("srv");
        let mut cmd = Command::new(pinion);
        cmd.args(["server", "--listen", "127.0.0.1:0", "--data-dir"]).arg(&srv).args(server_flags);
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {}", pinion.display()))?;
        let stdout = child.stdout.take().context("the server's stdout")?;
        let server = Proc(child);
        let mut lines = BufReader::new(stdout).lines();
        let line = loop {
            match lines.next() {
                Some(Ok(l)) if l.starts_with("listening on") => break l,
                Some(Ok(_)) => continue,
                other => bail!("the server did not start: {other:?}"),
            }
        };
        std::thread::spawn(move || for _ in lines {});
        let url = line
            .split('(')
            .nth(1)
            .and_then(|s| s.strip_suffix(')'))
            .with_context(|| format!("no URL in {line:?}"))?
            .to_string();
        let token = std::fs::read_to_string(srv.join("join-token")).context("the join token")?.trim().to_string();
        let mut c = HollowCluster {
            pinion: pinion.to_path_buf(),
            config: srv.join("admin.conf"),
            dir,
            url,
            token,
            shape,
            agents: BTreeMap::new(),
            _server: server,
        };
        for n in nodes {
            c.start_agent(n)?;
        }
        Ok(c)
    }

    /// Starts (or starts again, on its data dir) the agent of `node`.
    pub fn start_agent(&mut self, node: &str) -> anyhow::Result<()> {
        let data = self.dir.path().join(node);
        let s = &self.shape;
        let child = Command::new(&self.pinion)
            .args(["agent", "--server", &self.url, "--token", &self.token, "--data-dir"])
            .arg(&data)
            .args(["--runtime", "hollow", "--synthetic", &s.synthetic, "--reserved-cpus", &s.reserved_cpus])
            .args(["--topology-policy", &s.policy, "--node-name", node, "--endpoint-listen", "127.0.0.1:0"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting the agent of {node}"))?;
        self.agents.insert(node.to_string(), Some(Proc(child)));
        Ok(())
    }

    /// `kill -9` of the agent of `node` (its hollow pods stay in its data dir).
    pub fn kill_agent(&mut self, node: &str) {
        if let Some(slot) = self.agents.get_mut(node) {
            // Dropping the process kills it with SIGKILL and reaps it.
            slot.take();
        }
    }

    /// `pinion ARGS` as the admin: its stdout, or an error with both streams.
    pub fn cli(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = Command::new(&self.pinion).args(args).arg("--config").arg(&self.config).output()?;
        if !out.status.success() {
            bail!("pinion {args:?}: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `pinion apply` of `manifest` (written to a file named `name`).
    pub fn apply(&self, name: &str, manifest: &str) -> anyhow::Result<String> {
        let path = self.dir.path().join(format!("{name}.yaml"));
        std::fs::write(&path, manifest)?;
        self.cli(&["apply", "-f", path.to_str().context("a UTF-8 path")?])
    }

    /// The pods with this label selector.
    pub fn pods(&self, selector: &str) -> anyhow::Result<Vec<Pod>> {
        let out = self.cli(&["get", "pods", "-l", selector, "-o", "json"])?;
        #[derive(serde::Deserialize)]
        struct List {
            items: Vec<Pod>,
        }
        Ok(serde_json::from_str::<List>(&out).context("a list of pods")?.items)
    }

    /// The node's condition as stored (`Ready`, `NotReady`).
    pub fn node_condition(&self, node: &str) -> anyhow::Result<String> {
        let out = self.cli(&["get", "nodes", node, "-o", "json"])?;
        let v: serde_json::Value = serde_json::from_str(&out).context("a node")?;
        Ok(v["status"]["condition"].as_str().unwrap_or_default().to_string())
    }
}
