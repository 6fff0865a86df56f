//! A real registry on loopback for the pull tests: Debian's `docker-registry`
//! (distribution 2.8) with a config of the test's own, plain HTTP or TLS with
//! htpasswd auth (a CA and a password made here), images pushed into it with
//! `skopeo` from OCI layouts the test writes. Stopped (and its port given
//! back) when dropped.
#![allow(dead_code)] // each test crate uses a part

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Registry {
    child: Child,
    pub host: String,
    dir: PathBuf,
    /// The CA the registry's certificate is signed by, with TLS.
    pub ca: Option<PathBuf>,
    /// `user:password`, with auth.
    pub login: Option<(String, String)>,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free loopback port")
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(out.status.success(), "{cmd:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

impl Registry {
    /// Plain HTTP, no auth.
    pub fn plain(dir: &Path) -> Registry {
        Registry::start(dir, false)
    }

    /// TLS with a CA of its own, and htpasswd auth.
    pub fn secure(dir: &Path) -> Registry {
        Registry::start(dir, true)
    }

    fn start(dir: &Path, secure: bool) -> Registry {
        let dir = dir.to_path_buf();
        std::fs::create_dir_all(&dir).expect("registry dir");
        let host = format!("127.0.0.1:{}", free_port());
        let mut extra = String::new();
        let (mut ca, mut login) = (None, None);
        if secure {
            let (key, crt, ca_crt) = (dir.join("reg.key"), dir.join("reg.crt"), dir.join("ca.crt"));
            let ca_key = dir.join("ca.key");
            run(Command::new("openssl").args(["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]).args([
                "-subj",
                "/CN=pinion test CA",
                "-keyout",
                path(&ca_key),
                "-out",
                path(&ca_crt),
            ]));
            let csr = dir.join("reg.csr");
            run(Command::new("openssl")
                .args(["req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1"])
                .args(["-keyout", path(&key), "-out", path(&csr)]));
            let ext = dir.join("san.ext");
            std::fs::write(&ext, "subjectAltName=IP:127.0.0.1\n").expect("san");
            run(Command::new("openssl").args(["x509", "-req", "-days", "1", "-CAcreateserial"]).args([
                "-in",
                path(&csr),
                "-CA",
                path(&ca_crt),
                "-CAkey",
                path(&ca_key),
                "-extfile",
                path(&ext),
                "-out",
                path(&crt),
            ]));
            let htpasswd = dir.join("htpasswd");
            let line = run(Command::new("htpasswd").args(["-Bbn", "alice", "s3cret-pw"]));
            std::fs::write(&htpasswd, line).expect("htpasswd");
            extra = format!(
                "  tls:\n    certificate: {}\n    key: {}\nauth:\n  htpasswd:\n    realm: pinion-test\n    path: {}\n",
                crt.display(),
                key.display(),
                htpasswd.display()
            );
            ca = Some(ca_crt);
            login = Some(("alice".to_string(), "s3cret-pw".to_string()));
        }
        let config = dir.join("config.yml");
        let text = format!(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: {host}\n{extra}",
            dir.join("data").display()
        );
        std::fs::write(&config, text).expect("registry config");
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("registry.log")).expect("log"))
            .spawn()
            .expect("docker-registry (host-setup installs it)");
        let r = Registry { child, host, dir, ca, login };
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(&r.host).is_err() {
            assert!(Instant::now() < deadline, "the registry did not listen on {}", r.host);
            std::thread::sleep(Duration::from_millis(50));
        }
        r
    }

    /// Pushes the image `image` (its ref name) of the OCI layout `layout` as
    /// `NAME:TAG` here, compressing its uncompressed layers as `compress`
    /// says (`gzip`, `zstd`; skopeo's default is gzip); returns the reference.
    pub fn push(&self, layout: &Path, image: &str, name_tag: &str, compress: Option<&str>) -> String {
        let dest = format!("{}/{name_tag}", self.host);
        let mut cmd = Command::new("skopeo");
        cmd.args(["copy", "--quiet", "--dest-tls-verify=false"]);
        if let Some((u, p)) = &self.login {
            cmd.arg("--dest-creds").arg(format!("{u}:{p}"));
        }
        if let Some(c) = compress {
            // skopeo compresses only what the layout has uncompressed.
            cmd.args(["--dest-compress-format", c]);
        }
        cmd.arg(format!("oci:{}:{image}", layout.display())).arg(format!("docker://{dest}"));
        run(&mut cmd);
        dest
    }

    /// The manifest digest the registry holds for `NAME:TAG`.
    pub fn digest(&self, name_tag: &str) -> String {
        let mut cmd = Command::new("skopeo");
        cmd.args(["inspect", "--tls-verify=false", "--format", "{{.Digest}}"]);
        if let Some((u, p)) = &self.login {
            cmd.arg("--creds").arg(format!("{u}:{p}"));
        }
        run(cmd.arg(format!("docker://{}/{name_tag}", self.host))).trim().to_string()
    }
}

fn path(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(self.dir.join("data"));
    }
}
