//! Locating the `pinion` binary for whole-system tests.
//!
//! `CARGO_BIN_EXE_pinion` exists only for tests of the package that owns the binary
//! (`cli`), not for `e2e`. So the tests build it themselves with `cargo build -p cli
//! --message-format=json` (quick when nothing changed) and take the executable's path
//! from cargo's own report, which stays right under `CARGO_TARGET_DIR`, `--release` or
//! a custom profile. `PINION_BIN` overrides all of it.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};

/// The workspace root: `e2e/..`.
pub fn repo_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_path_buf()
}

/// The `pinion` binary: `$PINION_BIN`, or freshly built (debug) from this workspace.
pub fn pinion() -> anyhow::Result<PathBuf> {
    if let Some(path) = std::env::var_os("PINION_BIN") {
        let path = PathBuf::from(path);
        if !path.is_file() {
            bail!("PINION_BIN={} is not a file", path.display());
        }
        return Ok(path);
    }
    // Cargo sets CARGO for the processes it runs; a plain `cargo` otherwise.
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let output = Command::new(&cargo)
        .current_dir(repo_root())
        .args(["build", "-p", "cli", "--bin", "pinion", "--message-format=json"])
        .output()
        .with_context(|| format!("running {} build -p cli", cargo.to_string_lossy()))?;
    if !output.status.success() {
        bail!("cargo build -p cli failed:\n{}", String::from_utf8_lossy(&output.stderr));
    }
    executable_from_messages(&String::from_utf8_lossy(&output.stdout))
        .context("cargo build -p cli reported no `pinion` executable")
}

/// The `executable` of the `pinion` compiler artifact in cargo's JSON messages.
fn executable_from_messages(messages: &str) -> Option<PathBuf> {
    messages
        .lines()
        .rev()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == "pinion")
        .find_map(|m| m["executable"].as_str().map(PathBuf::from))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(messages: &str, expected: Option<&str>) {
        assert_eq!(executable_from_messages(messages), expected.map(PathBuf::from), "messages: {messages}");
    }

    #[test]
    fn finds_the_pinion_executable_in_cargo_messages() {
        let lib = r#"{"reason":"compiler-artifact","target":{"name":"specs"},"executable":null}"#;
        let bin = r#"{"reason":"compiler-artifact","target":{"name":"pinion"},"executable":"/t/debug/pinion"}"#;
        let other = r#"{"reason":"compiler-artifact","target":{"name":"other"},"executable":"/t/debug/other"}"#;
        check(&format!("{lib}\n{bin}\n{{\"reason\":\"build-finished\",\"success\":true}}"), Some("/t/debug/pinion"));
        check(&format!("{lib}\n{other}"), None);
        check("not json\n", None);
        check("", None);
    }
}
