//! The web view in headless Chromium against a running cluster: `pinion
//! server --local-listen` and a hollow `pinion agent` on the two-socket Intel
//! sysfs fixture (2 NUMA nodes, 32 CPUs, huge pages, two NIC functions offered
//! through `--devices`, single-numa-node). The page must show each pod on exactly the CPUs its
//! placement holds, then a pod placed after it loaded (through the watch,
//! without a reload); the test saves a screenshot and prints where.

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::{lines_until, with_stdout_lines, PINION};
use e2e::chromium::Chromium;
use e2e::process::Proc;
use serde_json::Value;

#[path = "../../nodelet/tests/sysfs_fixtures/mod.rs"]
mod sysfs_fixtures;

const WITHIN: Duration = Duration::from_secs(60);

/// Starts `pinion ARGS` with its stdout's lines sent to the receiver.
fn spawn(args: &[&str]) -> (Proc, mpsc::Receiver<String>) {
    let mut cmd = Command::new(PINION);
    cmd.args(args).stdin(Stdio::null()).stderr(Stdio::null());
    with_stdout_lines(cmd)
}

fn pinion(config: &Path, args: &[&str]) -> String {
    let out = Command::new(PINION).arg("--config").arg(config).args(args).output().expect("run pinion");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "pinion {args:?}: {text}{}", String::from_utf8_lossy(&out.stderr));
    text
}

/// Applies a one-container Guaranteed pod with these limits (YAML flow-map entries).
fn apply(config: &Path, dir: &Path, name: &str, limits: &str) {
    let path = dir.join(format!("{name}.yaml"));
    std::fs::write(
        &path,
        format!(
            "apiVersion: pinion.io/v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  containers:\n  - name: main\n    rootfs: host\n    command: [sleep, inf]\n    resources:\n      limits: {{{limits}}}\n"
        ),
    )
    .expect("write manifest");
    pinion(config, &["apply", "-f", path.to_str().expect("utf-8 path")]);
}

/// The exclusive CPUs of a running pod, from its placement.
fn running_cpus(config: &Path, name: &str) -> BTreeSet<u64> {
    for _ in 0..600 {
        let pod: Value = serde_json::from_str(&pinion(config, &["get", "pod", name, "-o", "json"])).expect("pod JSON");
        if pod["status"]["phase"] == "Running" {
            let cpus = &pod["status"]["placement"]["containers"][0]["cpus"];
            return serde_json::from_value(cpus.clone()).expect("a CPU list");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("{name} did not run within a minute");
}

/// The CPUs the page shows `pod` on (their cells' `data-cpu`), as a JavaScript expression.
fn cells_of(pod: &str) -> String {
    format!("[...document.querySelectorAll('.cpu[data-pod=\"{pod}\"]')].map(c => Number(c.dataset.cpu)).sort((a, b) => a - b)")
}

fn shown_on(page: &mut Chromium, pod: &str, cpus: &BTreeSet<u64>) -> Value {
    let expected: Vec<u64> = cpus.iter().copied().collect();
    let expr = format!(
        "(() => {{ const got = {}; return JSON.stringify(got) === '{}' ? got : null; }})()",
        cells_of(pod),
        serde_json::to_string(&expected).expect("json")
    );
    let (held, _) = page.wait_for(&expr, WITHIN).expect("evaluate in the page");
    let got = page.eval(&cells_of(pod)).expect("evaluate in the page");
    assert!(held, "the page shows {pod} on CPUs {got}, its placement holds {expected:?}");
    got
}

#[test]
fn the_web_view_shows_each_pod_on_its_cpus_and_follows_the_watch() {
    let Some(browser) = e2e::chromium::binary_or_skip() else { return };
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let root = sysfs_fixtures::extract("32intel64-2p8co2t+8ve");
    let devices = dir.join("devices.yaml");
    std::fs::write(&devices, "example.com/nic:\n- address: '0000:60:00.0'\n- address: '0000:60:00.1'\n")
        .expect("write devices");

    let server_dir = dir.join("server");
    let (_server, out) = spawn(&[
        "server",
        "--data-dir",
        server_dir.to_str().expect("utf-8"),
        "--listen",
        "127.0.0.1:0",
        "--local-listen",
        "127.0.0.1:0",
    ]);
    let lines = lines_until(&out, "server up", WITHIN, |l| l.starts_with("web view: "));
    let token = lines
        .iter()
        .find_map(|l| l.strip_prefix("join token (also in ").and_then(|l| l.split_once("): ")).map(|(_, t)| t))
        .expect("the join token line");
    let url = lines
        .iter()
        .find_map(|l| {
            l.strip_prefix("listening on ").and_then(|l| l.split_once(" (")).map(|(_, u)| u.trim_end_matches(')'))
        })
        .expect("the listening line");
    let web = lines.last().and_then(|l| l.split_whitespace().nth(2)).expect("the web view's URL").to_string();
    assert!(web.starts_with("http://127.0.0.1:") && web.ends_with("/ui/"), "{web}");
    let config = server_dir.join("admin.conf");

    let (_agent, _) = spawn(&[
        "agent",
        "--server",
        url,
        "--token",
        token,
        "--data-dir",
        dir.join("node").to_str().expect("utf-8"),
        "--runtime",
        "hollow",
        "--sysfs-root",
        root.path().to_str().expect("utf-8"),
        "--devices",
        devices.to_str().expect("utf-8"),
        "--reserved-cpus",
        "0,16",
        "--topology-policy",
        "single-numa-node",
        "--node-name",
        "xeon",
        "--endpoint-listen",
        "127.0.0.1:0",
    ]);
    apply(&config, dir, "alpha", "cpu: \"6\", memory: 8Gi, hugepages-2Mi: 1Gi");
    apply(&config, dir, "gamma", "cpu: \"2\", memory: 2Gi, example.com/nic: \"1\"");
    apply(&config, dir, "web", "cpu: 500m, memory: 256Mi");
    let alpha = running_cpus(&config, "alpha");
    let gamma = running_cpus(&config, "gamma");
    running_cpus(&config, "web");
    assert_eq!((alpha.len(), gamma.len()), (6, 2), "alpha {alpha:?}, gamma {gamma:?}");

    let mut page = Chromium::start(browser, 1500, 1000).expect("start chromium");
    page.open(&web).expect("open the web view");
    shown_on(&mut page, "alpha", &alpha);
    shown_on(&mut page, "gamma", &gamma);
    let nic = page
        .wait_for("document.querySelector('.device[data-pod=\"gamma\"]')?.dataset.address", WITHIN)
        .expect("evaluate in the page");
    assert!(nic.0, "the page shows gamma's NIC: {}", nic.1);
    let shared = page.eval("document.querySelector('.cpu[data-cpu=\"7\"]').dataset.state").expect("eval");
    assert_eq!(shared, "shared", "CPU 7 is in the shared pool");
    // A mark on this document: still there after beta appears, so beta came
    // through the watch, not through a reload.
    page.eval("window.pinionTestMark = 'same page'").expect("mark the page");

    // 8 of NUMA node 0's 14 CPUs are taken: under single-numa-node beta lands on node 1.
    apply(&config, dir, "beta", "cpu: \"8\", memory: 4Gi");
    let beta = running_cpus(&config, "beta");
    assert_eq!(beta.len(), 8, "{beta:?}");
    assert!(alpha.is_disjoint(&beta) && gamma.is_disjoint(&beta), "alpha {alpha:?}, gamma {gamma:?}, beta {beta:?}");
    shown_on(&mut page, "beta", &beta);
    shown_on(&mut page, "alpha", &alpha);
    assert_eq!(page.eval("window.pinionTestMark").expect("read the mark"), "same page");
    let live = page.wait_for("document.getElementById('connection').dataset.state === 'live'", WITHIN).expect("eval");
    assert!(live.0, "the page says its watches are live");

    let shot = Path::new(env!("CARGO_TARGET_TMPDIR")).join("topology.png");
    page.screenshot(&shot).expect("screenshot");
    println!("screenshot of the web view: {}", shot.display());
}
