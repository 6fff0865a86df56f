//! Reading a Pinion process's `/metrics` from its plain-HTTP loopback
//! listener (`--local-listen`), for the benchmarks' breakdowns.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{bail, Context};

/// One scrape, parsed.
pub fn scrape(addr: SocketAddr) -> anyhow::Result<prometheus_parse::Scrape> {
    let mut tcp = std::net::TcpStream::connect(addr).with_context(|| format!("{addr} (--local-listen)"))?;
    tcp.set_read_timeout(Some(Duration::from_secs(30)))?;
    tcp.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")?;
    let mut reply = String::new();
    tcp.read_to_string(&mut reply)?;
    let (head, body) = reply.split_once("\r\n\r\n").context("an HTTP reply")?;
    if !head.starts_with("HTTP/1.1 200") {
        bail!("GET /metrics: {head}");
    }
    Ok(prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_string())))?)
}

/// A histogram's `_count` and `_sum` (all label sets together).
pub fn count_and_sum(scrape: &prometheus_parse::Scrape, metric: &str) -> (f64, f64) {
    let (count, sum) = (format!("{metric}_count"), format!("{metric}_sum"));
    let mut out = (0.0, 0.0);
    for s in &scrape.samples {
        let prometheus_parse::Value::Untyped(v) = s.value else { continue };
        if s.metric == count {
            out.0 += v;
        } else if s.metric == sum {
            out.1 += v;
        }
    }
    out
}
