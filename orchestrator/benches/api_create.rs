//! Pods created per second through the HTTPS API, durability on (every reply
//! after the store's flush), the scheduling loop running. Not a test: run with
//!
//!   cargo bench -p orchestrator --bench api_create -- [PODS] [CONNECTIONS]
//!
//! and report the printed figure.

use std::time::{Duration, Instant};

use bytes::Bytes;
use hyper::Method;
use orchestrator::server::{Server, ServerOptions};
use orchestrator::tls::Credentials;
use pinion_wire::Client;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let pods: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(20_000);
    let conns: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(64);
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => return eprintln!("runtime: {e}"),
    };
    rt.block_on(run(pods, conns));
}

async fn run(pods: usize, conns: usize) {
    let dir = match tempfile::tempdir() {
        Ok(d) => d,
        Err(e) => return eprintln!("tempdir: {e}"),
    };
    let mut opts = ServerOptions::new(dir.path(), "127.0.0.1:0");
    opts.controller.heartbeat_grace = Duration::from_secs(600);
    let server = match Server::bind(opts).await {
        Ok(s) => s,
        Err(e) => return eprintln!("server: {e}"),
    };
    let creds = match Credentials::load(&server.admin_config) {
        Ok(c) => c,
        Err(e) => return eprintln!("credentials: {e}"),
    };
    let (stop, rx) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(server.run(rx));
    let per = pods / conns;
    let start = Instant::now();
    let mut workers = Vec::new();
    for w in 0..conns {
        // A client per worker: its own pool, so `conns` connections in all.
        let conn = match Client::new(&creds) {
            Ok(c) => c,
            Err(e) => return eprintln!("client: {e}"),
        };
        workers.push(tokio::spawn(async move {
            let mut latencies = Vec::with_capacity(per);
            for i in 0..per {
                let body = format!(
                    "{{\"apiVersion\":\"pinion.io/v1\",\"kind\":\"Pod\",\"metadata\":{{\"name\":\"p-{w}-{i}\",\"labels\":{{\"bench\":\"x\"}}}},\"spec\":{{\"containers\":[{{\"name\":\"c\",\"image\":\"busybox\",\"resources\":{{\"requests\":{{\"cpu\":\"1\",\"memory\":\"64Mi\"}}}}}}]}}}}"
                );
                let t = Instant::now();
                let (code, _) = conn
                    .request(Method::POST, "/api/v1/pods", Some(("application/json", Bytes::from(body))))
                    .await
                    .map_err(|e| e.to_string())?;
                if code != 201 {
                    return Err(format!("create returned {code}"));
                }
                latencies.push(t.elapsed());
            }
            Ok::<_, String>(latencies)
        }));
    }
    let mut all = Vec::new();
    for w in workers {
        match w.await {
            Ok(Ok(l)) => all.extend(l),
            Ok(Err(e)) => return eprintln!("worker: {e}"),
            Err(e) => return eprintln!("worker: {e}"),
        }
    }
    let elapsed = start.elapsed();
    all.sort();
    let pct = |p: f64| {
        all.get(((all.len() as f64 * p) as usize).min(all.len().saturating_sub(1))).copied().unwrap_or_default()
    };
    println!(
        "api_create: {} pods over {conns} connections in {:.2}s = {:.0} pods/s (p50 {:.1} ms, p99 {:.1} ms), durable (flushed) before each reply",
        all.len(),
        elapsed.as_secs_f64(),
        all.len() as f64 / elapsed.as_secs_f64(),
        pct(0.5).as_secs_f64() * 1e3,
        pct(0.99).as_secs_f64() * 1e3,
    );
    let _ = stop.send(true);
    let _ = task.await;
}
