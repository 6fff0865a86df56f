//! Headless Chromium for the web view's tests, driven over the DevTools
//! protocol (a WebSocket on loopback): open a page, evaluate JavaScript in it
//! until a condition holds, save a screenshot. Its profile lives in a
//! temporary directory; every call is bounded; dropping it kills its whole
//! process group (the browser and its renderers).

use std::io::ErrorKind;
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use base64::Engine;
use serde_json::{json, Value};
use tungstenite::{Message, WebSocket};

/// How long the browser has to start and say where it listens.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long one protocol call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// Where `chromium` is; `None` (the test prints SKIPPED) where it is not
/// installed. Under `CI=true` its absence fails the test (e2e/host-setup.sh
/// installs it).
pub fn binary_or_skip() -> Option<&'static str> {
    let found = pinion_wire::testing::on_path("chromium");
    pinion_wire::testing::requires(found, "chromium (apt-get install chromium; e2e/host-setup.sh)")
        .then_some("chromium")
}

pub struct Chromium {
    child: Child,
    ws: WebSocket<TcpStream>,
    /// The page's session (`Target.attachToTarget` with `flatten`).
    session: String,
    next_id: u64,
    // Last: removed after the browser is gone.
    _profile: tempfile::TempDir,
}

impl Chromium {
    /// Starts `binary` headless with a blank page of `width` x `height` CSS pixels.
    pub fn start(binary: &str, width: u32, height: u32) -> anyhow::Result<Chromium> {
        let profile = tempfile::Builder::new().prefix("pinion-chromium-").tempdir()?;
        let child = Command::new(binary)
            // As root (CI) Chromium refuses to start without --no-sandbox.
            .args(["--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-port=0"])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg(format!("--window-size={width},{height}"))
            // Traffic to the page under test only: no updates, sync, safe browsing or pings.
            .args([
                "--no-first-run",
                "--no-default-browser-check",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-default-apps",
                "--disable-domain-reliability",
                "--disable-extensions",
                "--disable-sync",
                "--no-pings",
                "--hide-scrollbars",
                "about:blank",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            // Its own process group, so that Drop reaches every process it started.
            .process_group(0)
            .spawn()
            .with_context(|| format!("starting {binary}"))?;
        let mut guard = KillOnDrop(Some(child));
        let port_file = profile.path().join("DevToolsActivePort");
        let deadline = Instant::now() + START_TIMEOUT;
        let (port, path) = loop {
            if let Ok(text) = std::fs::read_to_string(&port_file) {
                let mut lines = text.lines();
                if let (Some(port), Some(path)) = (lines.next(), lines.next()) {
                    break (port.parse::<u16>().context("DevToolsActivePort: the port")?, path.to_string());
                }
            }
            if let Some(status) = guard.0.as_mut().map(Child::try_wait).transpose()?.flatten() {
                bail!("{binary} exited ({status}) before it listened for DevTools");
            }
            if Instant::now() > deadline {
                bail!("{binary} did not listen for DevTools within {START_TIMEOUT:?}");
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        let tcp = TcpStream::connect_timeout(&addr, CALL_TIMEOUT)?;
        tcp.set_read_timeout(Some(CALL_TIMEOUT))?;
        tcp.set_write_timeout(Some(CALL_TIMEOUT))?;
        let (ws, _) = tungstenite::client(format!("ws://127.0.0.1:{port}{path}"), tcp)
            .map_err(|e| anyhow!("DevTools WebSocket handshake: {e}"))?;
        // Short reads from here on, so that `call` checks its deadline.
        ws.get_ref().set_read_timeout(Some(Duration::from_millis(200)))?;
        let child = guard.0.take().ok_or_else(|| anyhow!("the browser process went missing"))?;
        let mut c = Chromium { child, ws, session: String::new(), next_id: 0, _profile: profile };
        let target = c.call("Target.createTarget", json!({"url": "about:blank"}))?;
        let target = target["targetId"].as_str().ok_or_else(|| anyhow!("no targetId: {target}"))?.to_string();
        let attached = c.call("Target.attachToTarget", json!({"targetId": target, "flatten": true}))?;
        c.session = attached["sessionId"].as_str().ok_or_else(|| anyhow!("no sessionId: {attached}"))?.to_string();
        c.call(
            "Emulation.setDeviceMetricsOverride",
            json!({"width": width, "height": height, "deviceScaleFactor": 1, "mobile": false}),
        )?;
        Ok(c)
    }

    /// Loads `url` in the page (returns once navigation started; wait for
    /// what the test needs with `wait_for`).
    pub fn open(&mut self, url: &str) -> anyhow::Result<()> {
        let r = self.call("Page.navigate", json!({"url": url}))?;
        if let Some(e) = r["errorText"].as_str() {
            bail!("opening {url}: {e}");
        }
        Ok(())
    }

    /// The value of a JavaScript expression in the page (a promise is awaited).
    pub fn eval(&mut self, expression: &str) -> anyhow::Result<Value> {
        let r = self
            .call("Runtime.evaluate", json!({"expression": expression, "returnByValue": true, "awaitPromise": true}))?;
        if let Some(e) = r.get("exceptionDetails") {
            bail!("{expression}: {e}");
        }
        Ok(r["result"]["value"].clone())
    }

    /// Evaluates `expression` until it is truthy (neither false, null, 0 nor
    /// ""), for at most `timeout`; returns its last value either way, and
    /// whether it held.
    pub fn wait_for(&mut self, expression: &str, timeout: Duration) -> anyhow::Result<(bool, Value)> {
        let deadline = Instant::now() + timeout;
        loop {
            let v = self.eval(expression)?;
            let holds = match &v {
                Value::Null | Value::Bool(false) => false,
                Value::Number(n) => n.as_f64() != Some(0.0),
                Value::String(s) => !s.is_empty(),
                _ => true,
            };
            if holds || Instant::now() > deadline {
                return Ok((holds, v));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// A PNG of the whole page (the viewport grown to the page's height) at `path`.
    pub fn screenshot(&mut self, path: &Path) -> anyhow::Result<()> {
        let size = self
            .eval("[document.documentElement.scrollWidth, Math.ceil(document.body.getBoundingClientRect().height)]")?;
        let (w, h) = (size[0].as_u64().unwrap_or(1280), size[1].as_u64().unwrap_or(800));
        self.call(
            "Emulation.setDeviceMetricsOverride",
            json!({"width": w, "height": h.min(8000), "deviceScaleFactor": 1, "mobile": false}),
        )?;
        let shot = self.call("Page.captureScreenshot", json!({"format": "png"}))?;
        let data = shot["data"].as_str().ok_or_else(|| anyhow!("no screenshot data"))?;
        let png = base64::engine::general_purpose::STANDARD.decode(data).context("screenshot data")?;
        std::fs::write(path, png).with_context(|| format!("writing {}", path.display()))
    }

    /// One DevTools call (on the page's session once there is one): its
    /// result, or its error, within `CALL_TIMEOUT`. Events on the way are dropped.
    fn call(&mut self, method: &str, params: Value) -> anyhow::Result<Value> {
        self.next_id += 1;
        let id = self.next_id;
        let mut msg = json!({"id": id, "method": method, "params": params});
        if !self.session.is_empty() {
            msg["sessionId"] = json!(self.session);
        }
        self.ws.send(Message::text(msg.to_string())).map_err(|e| anyhow!("{method}: sending: {e}"))?;
        let deadline = Instant::now() + CALL_TIMEOUT;
        loop {
            if Instant::now() > deadline {
                bail!("{method}: no answer within {CALL_TIMEOUT:?}");
            }
            let text = match self.ws.read() {
                Ok(Message::Text(t)) => t,
                Ok(Message::Close(_)) => bail!("{method}: the browser closed the DevTools connection"),
                Ok(_) => continue,
                Err(tungstenite::Error::Io(e)) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    continue
                }
                Err(e) => bail!("{method}: {e}"),
            };
            let v: Value =
                serde_json::from_str(text.as_str()).with_context(|| format!("{method}: a DevTools message"))?;
            if v["id"].as_u64() != Some(id) {
                continue;
            }
            if let Some(e) = v.get("error") {
                bail!("{method}: {e}");
            }
            return Ok(v["result"].clone());
        }
    }
}

impl Drop for Chromium {
    fn drop(&mut self) {
        kill_group(&mut self.child);
    }
}

/// The browser until `Chromium` owns it: killed if starting fails half-way.
struct KillOnDrop(Option<Child>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(c) = self.0.as_mut() {
            kill_group(c);
        }
    }
}

/// SIGKILL to the browser's process group (its renderers and helpers), then
/// reaps the browser.
fn kill_group(child: &mut Child) {
    if let Ok(pid) = i32::try_from(child.id()) {
        let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
    }
    let _ = child.kill();
    let _ = child.wait();
}
