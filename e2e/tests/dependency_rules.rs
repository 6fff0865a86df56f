//! The dependency rules between the crates (ARCHITECTURE.md, "Invariants"),
//! read from `cargo metadata --no-deps`: each workspace crate's own
//! dependencies, followed through the workspace's other crates (so `nodelet`
//! reaching sled through a workspace crate counts as `nodelet` reaching sled).
//! Development dependencies do not count: tests may start a real server.

use std::collections::{BTreeMap, BTreeSet};

/// Workspace crate -> the packages it depends on (normal and build).
fn dependencies() -> BTreeMap<String, BTreeSet<String>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = std::process::Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--no-deps", "--offline"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run cargo metadata");
    assert!(out.status.success(), "cargo metadata: {}", String::from_utf8_lossy(&out.stderr));
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).expect("cargo metadata JSON");
    let mut deps = BTreeMap::new();
    for p in meta["packages"].as_array().expect("packages") {
        let name = p["name"].as_str().expect("package name").to_string();
        let own: BTreeSet<String> = p["dependencies"]
            .as_array()
            .expect("dependencies")
            .iter()
            .filter(|d| d["kind"].is_null() || d["kind"] == "build")
            .map(|d| d["name"].as_str().expect("dependency name").to_string())
            .collect();
        deps.insert(name, own);
    }
    deps
}

/// What `krate` reaches: its dependencies, and theirs where they are workspace crates.
fn reaches(deps: &BTreeMap<String, BTreeSet<String>>, krate: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut todo = vec![krate.to_string()];
    while let Some(k) = todo.pop() {
        for d in deps.get(&k).into_iter().flatten() {
            if seen.insert(d.clone()) && deps.contains_key(d) {
                todo.push(d.clone());
            }
        }
    }
    seen
}

#[test]
fn crates_depend_only_on_what_the_architecture_allows() {
    let deps = dependencies();
    for krate in ["specs", "orchestrator", "pinion-wire", "nodelet", "cli", "e2e"] {
        assert!(deps.contains_key(krate), "no workspace crate {krate} (known: {:?})", deps.keys());
    }
    let mut broken = Vec::new();
    let mut forbid = |krate: &str, banned: &[&str]| {
        let reached = reaches(&deps, krate);
        for b in banned {
            if reached.contains(*b) {
                broken.push(format!("{krate} depends on {b}"));
            }
        }
    };
    // The pure engine: no async runtime, no network, no store.
    forbid("specs", &["tokio", "hyper", "hyper-util", "sled", "rustls", "tokio-rustls"]);
    // The node side and the client it shares with the CLI: no store, no CA,
    // and not the server.
    forbid("nodelet", &["sled", "rcgen", "orchestrator"]);
    forbid("pinion-wire", &["sled", "rcgen", "orchestrator"]);
    // Only the server has a store.
    for (krate, own) in &deps {
        if krate != "orchestrator" && own.contains("sled") {
            broken.push(format!("{krate} depends on sled directly (only orchestrator may)"));
        }
    }
    assert!(broken.is_empty(), "dependency rules broken:\n{}", broken.join("\n"));
}

#[test]
fn the_rules_see_a_dependency_through_another_workspace_crate() {
    let deps = BTreeMap::from([
        ("a".to_string(), BTreeSet::from(["b".to_string()])),
        ("b".to_string(), BTreeSet::from(["sled".to_string()])),
    ]);
    assert!(reaches(&deps, "a").contains("sled"));
    assert!(!reaches(&deps, "b").contains("b"));
}
