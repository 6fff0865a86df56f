//! Paths that go silent without closing: a relay (`pinion_wire::testing::Relay`) in front of
//! the server stops forwarding on every established connection but keeps it
//! open, and forwards new ones, as a NAT that forgot an idle flow. The server
//! runs in-process with a short heartbeat (`ApiConfig::liveness`), the readers
//! use the same rule (`PINION_STREAM_HEARTBEAT_MS`, the link's
//! `JoinConfig::liveness`), so each must notice the dead stream within a few
//! heartbeats and resume over a new connection:
//! - the nodelet's binding watch: a pod bound after the silence still reaches
//!   the node, and the node stays Ready;
//! - `pinion get pods -w`: a pod created after the silence gets its row;
//! - `pinion logs -f`: lines written after the silence are printed, each once;
//! - `pinion run`: its attach stream resumes and it exits with the code.
//!
//! Without a bound on silence the streams hang until the OS gives up (or,
//! over HTTP/2, until the pings of the old 15 s + 20 s rule), far beyond
//! `SOON`, so each test fails there.

mod common;

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use common::{lines_until, Cluster, SOON};
use e2e::process::Proc;
use pinion_wire::testing::eventually;
use specs::api::NodeCondition;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nodelet_whose_watch_went_silent_resumes_and_stays_ready() {
    let mut c = Cluster::start().await;
    c.node(true, "");
    eventually("the node is Ready", SOON, || async {
        c.admin.get_node("edge").await.ok().filter(|n| n.status.condition == NodeCondition::Ready)
    })
    .await;
    c.create("before").await;
    c.running("before", SOON).await;

    let silenced = c.relay.silence_established();
    assert!(silenced > 0, "the link's connection went through the relay");
    c.create("after").await;
    let after = c.running("after", SOON).await;
    assert_eq!(after.spec.node_name.as_deref(), Some("edge"));
    assert!(c.relay.connections() > silenced, "the link resumed over a new connection");
    let node = c.admin.get_node("edge").await.expect("the node");
    assert_eq!(node.status.condition, NodeCondition::Ready, "{:?}", node.status);
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_watch_whose_stream_went_silent_resumes_without_missing_a_pod() {
    let c = Cluster::start().await;
    let (_get, rx) = c.cli(&["get", "pods", "-w"]);
    let _ = lines_until(&rx, "the table's header", SOON, |l| l.starts_with("NAME"));
    c.create("first").await;
    let _ = lines_until(&rx, "first's row", SOON, |l| l.starts_with("first "));

    let silenced = c.relay.silence_established();
    c.create("second").await;
    let seen = lines_until(&rx, "second's row after the silence", SOON, |l| l.starts_with("second "));
    assert!(seen.iter().all(|l| !l.starts_with("first ")), "first's row again after resuming: {seen:?}");
    assert!(c.relay.connections() > silenced, "the watch resumed over a new connection");
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_follow_whose_stream_went_silent_resumes_and_prints_each_line_once() {
    let mut c = Cluster::start().await;
    let direct = c.admin.authority().to_string();
    let data = c.node(false, &format!("https://{direct}"));
    c.create("talker").await;
    let pod = c.running("talker", SOON).await;
    // The hollow runtime writes no output: the test writes the container's log.
    let log = nodelet::agent::reconcile::pod_container_log_path(&data, "talker", &pod, "main");
    std::fs::create_dir_all(log.parent().expect("log folder")).expect("log folder");
    append(&log, "one\n");

    let (_logs, rx) = c.cli(&["logs", "-f", "talker"]);
    let mut printed = lines_until(&rx, "the first line", SOON, |l| l == "one");
    let silenced = c.relay.silence_established();
    append(&log, "two\n");
    printed.extend(lines_until(&rx, "a line written after the silence", SOON, |l| l == "two"));
    append(&log, "three\n");
    printed.extend(lines_until(&rx, "the next line", SOON, |l| l == "three"));
    assert_eq!(printed, ["one", "two", "three"], "each line once, in order");
    assert!(c.relay.connections() > silenced, "the follow resumed over a new connection");
    c.stop().await;
}

/// The other hop of `logs -f`: the server's stream from the node breaks (a
/// relay in front of the node's endpoint drops every connection for a
/// moment). The server must end its reply with an error, not cleanly, so
/// that the follower resumes instead of taking it for the end of the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_follow_whose_node_stream_broke_resumes_and_prints_each_line_once() {
    logs_follow_across_the_node_hop(false).await;
}

/// The same hop gone silent: the server's client to the node has the
/// server's silence bound, so it finds the connection dead and the follow
/// resumes over a new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_follow_whose_node_stream_went_silent_resumes_and_prints_each_line_once() {
    logs_follow_across_the_node_hop(true).await;
}

async fn logs_follow_across_the_node_hop(silent: bool) {
    let mut c = Cluster::start().await;
    let (data, node_relay) = c.node_behind_relay();
    c.create("chatter").await;
    let pod = c.running("chatter", SOON).await;
    let log = nodelet::agent::reconcile::pod_container_log_path(&data, "chatter", &pod, "main");
    std::fs::create_dir_all(log.parent().expect("log folder")).expect("log folder");
    append(&log, "one\n");

    let (mut logs, rx) = c.cli(&["logs", "-f", "chatter"]);
    let mut printed = lines_until(&rx, "the first line", SOON, |l| l == "one");
    let before = node_relay.connections();
    if silent {
        node_relay.silence_established();
        tokio::time::sleep(Duration::from_millis(400)).await;
    } else {
        node_relay.set_cut(true);
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert!(logs.0.try_wait().expect("poll pinion logs").is_none(), "logs -f ended when the node's stream broke");
        node_relay.set_cut(false);
    }
    append(&log, "two\n");
    // Silent, the server's client finds the connection dead within a few of
    // its silence bounds (0.9 s here), not its default one (15 s).
    let within = if silent { Duration::from_secs(6) } else { SOON };
    printed.extend(lines_until(&rx, "a line written after the break", within, |l| l == "two"));
    assert_eq!(printed, ["one", "two"], "each line once, in order");
    assert!(node_relay.connections() > before, "the server reached the node again over a new connection");
    c.stop().await;
}

/// A node whose endpoint accepts connections and never answers: while the
/// server waits to open the output, the attach stream keeps its heartbeats,
/// so `pinion run` does not take it for dead and reconnect again and again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_keeps_its_stream_while_the_node_does_not_answer() {
    let mut c = Cluster::start().await;
    let direct = format!("https://{}", c.admin.authority());
    let port = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port").local_addr().expect("addr").port();
    let hole = std::net::TcpListener::bind(("127.0.0.3", port)).expect("a listener that never answers");
    std::thread::spawn(move || {
        let held: Vec<_> = hole.incoming().collect();
        drop(held);
    });
    c.node_with_endpoint(vec![direct], format!("127.0.0.1:{port}"), Some("127.0.0.3".parse().expect("ip")));
    eventually("the node is Ready", SOON, || async {
        c.admin.get_node("edge").await.ok().filter(|n| n.status.condition == NodeCondition::Ready)
    })
    .await;
    let (mut run, _out) = c.cli(&["run", "job", "--host", "--no-init", "--", "sleep", "inf"]);
    c.running("job", SOON).await;
    let before = c.relay.connections();
    // Several silence bounds (0.9 s each) while the open hangs.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(run.0.try_wait().expect("poll pinion run").is_none(), "pinion run ended");
    assert_eq!(c.relay.connections(), before, "pinion run reconnected: its stream fell silent");
    c.stop().await;
}

/// `pinion run`'s output when the server's stream from the node breaks: the
/// server opens it again and skips what it sent, so the output goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_whose_output_stream_from_the_node_broke_goes_on() {
    let mut c = Cluster::start().await;
    let (data, node_relay) = c.node_behind_relay();
    eventually("the node is Ready", SOON, || async {
        c.admin.get_node("edge").await.ok().filter(|n| n.status.condition == NodeCondition::Ready)
    })
    .await;
    // Long enough for the steps below; the hollow runtime ends it with code 0.
    let (mut run, rx) = c.cli(&["run", "job", "--host", "--no-init", "--", "sleep", "8"]);
    let pod = c.running("job", SOON).await;
    let log = nodelet::agent::reconcile::pod_container_log_path(&data, "job", &pod, "main");
    append(&log, "one\n");
    let mut printed = lines_until(&rx, "the first line", SOON, |l| l == "one");
    node_relay.set_cut(true);
    tokio::time::sleep(Duration::from_millis(300)).await;
    node_relay.set_cut(false);
    append(&log, "two\n");
    printed.extend(lines_until(&rx, "a line written after the break", SOON, |l| l == "two"));
    assert_eq!(printed, ["one", "two"], "each line once, in order");
    assert_eq!(exit_code(&mut run, "the break").await, Some(0), "the command's exit code");
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_whose_attach_stream_went_silent_resumes_to_the_exit_code() {
    let mut c = Cluster::start().await;
    let direct = c.admin.authority().to_string();
    c.node(false, &format!("https://{direct}"));
    eventually("the node is Ready", SOON, || async {
        c.admin.get_node("edge").await.ok().filter(|n| n.status.condition == NodeCondition::Ready)
    })
    .await;
    // The hollow runtime ends `sleep 4` after four seconds, with code 0.
    let (mut run, _out) = c.cli(&["run", "job", "--host", "--no-init", "--", "sleep", "4"]);
    c.running("job", SOON).await;
    let silenced = c.relay.silence_established();
    assert_eq!(exit_code(&mut run, "the silence").await, Some(0), "the command's exit code");
    assert!(c.relay.connections() > silenced, "the attach stream resumed over a new connection");
    c.stop().await;
}

/// The exit code of `pinion run`, which must exit within `SOON` of `after`.
async fn exit_code(run: &mut Proc, after: &str) -> Option<i32> {
    let deadline = Instant::now() + SOON;
    loop {
        if let Some(s) = run.0.try_wait().expect("wait for pinion run") {
            return s.code();
        }
        assert!(Instant::now() < deadline, "pinion run did not exit within {SOON:?} of {after}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn append(path: &Path, text: &str) {
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(path).expect("open the log");
    f.write_all(text.as_bytes()).expect("write the log");
}
