//! With the real binary (issue 27): `pinion token create|list|revoke`, and a
//! person's credentials file renewed in place by an ordinary command once it
//! is two thirds into its certificate's life.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};

use pinion_wire::tls::{CertificateFacts, Credentials};

const PINION: &str = env!("CARGO_BIN_EXE_pinion");

/// Kills the server when the test ends, even on failure.
struct ServerProcess(Child);

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_server(dir: &Path, extra: &[&str]) -> ServerProcess {
    let mut child = Command::new(PINION)
        .args(["server", "--data-dir"])
        .arg(dir)
        .args(["--listen", "127.0.0.1:0"])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn pinion server");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    loop {
        match lines.next() {
            Some(Ok(l)) if l.starts_with("listening on") => break,
            Some(Ok(_)) => continue,
            other => panic!("server did not start: {other:?}"),
        }
    }
    std::thread::spawn(move || for _ in lines {});
    ServerProcess(child)
}

fn pinion(config: &Path, args: &[&str]) -> Output {
    let out = Command::new(PINION).args(args).arg("--config").arg(config).output().expect("run pinion");
    assert!(
        out.status.success(),
        "pinion {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

#[test]
fn tokens_are_made_listed_without_their_secret_and_revoked() {
    let dir = tempfile::tempdir().expect("tempdir");
    let _server = start_server(dir.path(), &[]);
    let admin = dir.path().join("admin.conf");
    let made = pinion(&admin, &["token", "create", "--ttl", "2h", "--uses", "1", "--description", "rack 4"]);
    let token = String::from_utf8_lossy(&made.stdout).trim().to_string();
    let parts: Vec<&str> = token.split('.').collect();
    assert_eq!(parts.len(), 3, "PIN.ID.SECRET: {token}");
    let listed = String::from_utf8_lossy(&pinion(&admin, &["token", "list"]).stdout).to_string();
    assert!(listed.contains("USES LEFT") && listed.contains(parts[1]) && listed.contains("rack 4"), "{listed}");
    assert!(listed.contains("bootstrap"), "the first start's token is listed: {listed}");
    assert!(!listed.contains(parts[2]), "the secret is never listed: {listed}");
    let revoked = String::from_utf8_lossy(&pinion(&admin, &["token", "revoke", parts[1]]).stdout).to_string();
    assert!(revoked.contains("revoked"), "{revoked}");
    let listed = String::from_utf8_lossy(&pinion(&admin, &["token", "list"]).stdout).to_string();
    assert!(listed.contains("revoked"), "{listed}");
}

#[test]
fn a_persons_credentials_file_is_renewed_in_place_by_any_command() {
    let dir = tempfile::tempdir().expect("tempdir");
    let _server = start_server(&dir.path().join("server"), &["--user-cert-ttl", "6s"]);
    let admin = dir.path().join("server/admin.conf");
    let alice = dir.path().join("alice.conf");
    pinion(
        &admin,
        &["user", "add", "alice", "--uid", "1001", "--gid", "1001", "--out", alice.to_str().expect("utf-8")],
    );
    let facts = || {
        let c = Credentials::load(&alice).expect("alice.conf");
        CertificateFacts::from_pem(&c.client_cert, "alice.conf").expect("facts")
    };
    let first = facts();
    // Six seconds from six back: due for renewal two seconds after issue.
    std::thread::sleep(std::time::Duration::from_secs(3));
    pinion(&alice, &["get", "pods"]);
    let second = facts();
    assert!(second.not_after > first.not_after, "renewed: {first:?} then {second:?}");
    assert_eq!((&second.common_name, &second.incarnation), (&first.common_name, &first.incarnation));
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&alice).expect("stat").permissions());
    assert_eq!(mode & 0o777, 0o600);
    // A young file is left alone.
    pinion(&alice, &["get", "pods"]);
    assert_eq!(facts(), second);
}
