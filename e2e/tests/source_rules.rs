//! The invariants of ARCHITECTURE.md ("Invariants") that the sources show,
//! read from the workspace's `.rs` files and manifests (as
//! `dependency_rules.rs` reads `cargo metadata`): which modules touch etcd,
//! where the bounds on input live, what the orchestrator's domain layer may
//! not know, and which crates use `anyhow`. Comments and string literals are
//! left out before a file is read, so a doc comment may name what the code
//! may not use.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The files that name the etcd client (`etcdv3`, whose own files say
/// `super::`), relative to the workspace root. ARCHITECTURE.md lists the
/// same modules.
const ETCD_FILES: &[&str] = &[
    // Declares the client's module.
    "orchestrator/src/lib.rs",
    // The store's etcd backend and its opening.
    "orchestrator/src/store/etcd.rs",
    "orchestrator/src/store/mod.rs",
    // Their own keys: the election, the shared CA, the servers' addresses,
    // and the leader's compaction of etcd's history.
    "orchestrator/src/leader.rs",
    "orchestrator/src/identity.rs",
    "orchestrator/src/peers.rs",
    "orchestrator/src/compaction.rs",
    // Holds the client it connected and hands it to the modules above.
    "orchestrator/src/server.rs",
];

/// Bound constants that stay outside `specs::limits`, each with why: none of
/// them bounds an object or a manifest a user submits. A new `MAX_*` (or
/// `*_BYTES`, `*_LIMIT`) constant goes into `specs::limits`, or here with its
/// reason.
const BOUNDS_ELSEWHERE: &[(&str, &str, &str)] = &[
    ("specs/src/api.rs", "MAX_STREAM_LINE", "transport: a stream reader's unfinished line"),
    ("nodelet/src/registry.rs", "MAX_SETTINGS_FILE", "node files: an operator's auth.json or CA bundle"),
    (
        "nodelet/src/runtime/libcontainer/filter.rs",
        "MAX_INSTRUCTIONS",
        "kernel: BPF_MAXINSNS, a seccomp program's length",
    ),
    ("nodelet/src/runtime/libcontainer/filter.rs", "INSTRUCTION_BYTES", "format: one struct sock_filter"),
    ("nodelet/src/agent/prober.rs", "MAX_STATUS_LINE", "transport: bytes read to find a probe answer's status line"),
    ("nodelet/src/agent/prober.rs", "MAX_OUTPUT", "output: a failed exec probe's output kept for its message"),
    (
        "nodelet/src/runtime/libcontainer/cgroups.rs",
        "PROBE_MEMORY_BYTES",
        "node: memory.max of a container's exec probes",
    ),
    ("nodelet/src/runtime/libcontainer/cgroups.rs", "MAX_PROBE_PIDS", "node: pids.max of a container's exec probes"),
    ("nodelet/src/agent/prober/grpc.rs", "MAX_ANSWER_BYTES", "transport: a gRPC probe answer's body read"),
    ("nodelet/src/agent/prober/grpc.rs", "MAX_HEADER_LIST_BYTES", "transport: a gRPC probe answer's headers"),
    ("orchestrator/src/etcdv3/grpc.rs", "MAX_MESSAGE_BYTES", "transport: one message from etcd"),
    ("orchestrator/src/etcdv3/mod.rs", "MAX_HEADER_LIST_BYTES", "transport: an etcd answer's headers"),
    ("specs/src/manifest.rs", "MAX_DECODE_PROBLEMS", "output: problems one decode reports"),
    ("specs/src/topology/draw.rs", "MAX_MATRIX", "output: the largest distance matrix drawn"),
    ("orchestrator/src/api/mod.rs", "MAX_STREAMS_PER_CONNECTION", "transport: HTTP/2 streams"),
    ("orchestrator/src/api/mod.rs", "MAX_HEADER_BYTES", "transport: a request's head"),
    ("orchestrator/src/api/attach.rs", "MAX_REOPENS", "retries of a node's broken log stream"),
    ("orchestrator/src/store/mod.rs", "MAX_BATCH", "store: writes per commit"),
    ("orchestrator/src/store/mod.rs", "MAX_CONFLICTS", "store: compare failures before a refusal"),
    ("orchestrator/src/store/mod.rs", "FIXED_BYTES", "store: an etcd transaction's own size"),
    ("orchestrator/src/store/mod.rs", "OP_BYTES", "store: an etcd operation's framing"),
    ("orchestrator/src/store/mod.rs", "RECENT_BYTES", "store: the watch cache's memory"),
    ("orchestrator/src/store/sled.rs", "SEGMENT_BYTES", "store: sled's segment size"),
    ("orchestrator/wire/src/lib.rs", "MAX_RESPONSE", "transport: a reply body the client reads"),
    ("nodelet/src/endpoint.rs", "EXEC_BODY_LIMIT", "transport: the node endpoint's exec body"),
    ("nodelet/src/hwloc.rs", "MAX_XML_BYTES", "an operator's hwloc file, not an API object"),
    ("nodelet/src/hwloc.rs", "MAX_XML_NODES", "an operator's hwloc file, not an API object"),
    ("cli/src/cmd/run.rs", "MAX_FOLLOWED", "the CLI's own work: attach streams at once"),
    ("cli/src/cmd/run.rs", "MAX_ARRAY_TASKS", "the CLI's own: `pinion run --array` size"),
];

/// Crates that may use `anyhow` (at the top of a binary, in test harnesses);
/// every other workspace crate is a library returning `thiserror` enums.
const ANYHOW_CRATES: &[&str] = &["cli", "e2e"];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").canonicalize().expect("workspace root")
}

/// The workspace's member folders, from the root manifest's `members`.
fn members() -> Vec<String> {
    let manifest = std::fs::read_to_string(root().join("Cargo.toml")).expect("read Cargo.toml");
    let line = manifest.lines().find(|l| l.trim_start().starts_with("members")).expect("workspace members");
    let list = &line[line.find('[').expect("members list") + 1..line.rfind(']').expect("members list")];
    let members: Vec<String> =
        list.split(',').map(|m| m.trim().trim_matches('"').to_string()).filter(|m| !m.is_empty()).collect();
    assert!(members.len() >= 5, "members read from Cargo.toml: {members:?}");
    members
}

/// Every `.rs` file under `dir`, as paths relative to the workspace root.
fn rust_files(dir: &Path) -> Vec<String> {
    let root = root();
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("read {}: {e}", d.display())) {
            let path = entry.expect("folder entry").path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if path.is_dir() {
                if name != "target" && !name.starts_with('.') {
                    todo.push(path);
                }
            } else if name.ends_with(".rs") {
                out.push(path.strip_prefix(&root).expect("under the root").to_string_lossy().into_owned());
            }
        }
    }
    out.sort();
    out
}

/// Every `.rs` file of every workspace member (a member inside another, as
/// `orchestrator/wire` is, counted once).
fn workspace_files() -> BTreeSet<String> {
    members().iter().flat_map(|m| rust_files(&root().join(m))).collect()
}

fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("read {path}: {e}"))
}

/// The code of a Rust file: comments and the contents of string and char
/// literals blanked out (raw strings are read as code, which errs on the side
/// of seeing too much).
fn code(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < c.len() {
        match c[i] {
            '/' if c.get(i + 1) == Some(&'/') => {
                while i < c.len() && c[i] != '\n' {
                    i += 1;
                }
            }
            '/' if c.get(i + 1) == Some(&'*') => {
                i += 2;
                while i < c.len() && !(c[i] == '*' && c.get(i + 1) == Some(&'/')) {
                    i += 1;
                }
                i += 2;
                out.push(' ');
            }
            '"' => {
                i += 1;
                while i < c.len() && c[i] != '"' {
                    i += if c[i] == '\\' { 2 } else { 1 };
                }
                i += 1;
                out.push_str("\"\"");
            }
            // A char literal ('x', '\n', '\''); a lifetime ('a) is left as code.
            '\'' if c.get(i + 1) == Some(&'\\') => {
                i += 3;
                while i < c.len() && c[i] != '\'' {
                    i += 1;
                }
                i += 1;
                out.push_str("' '");
            }
            '\'' if c.get(i + 2) == Some(&'\'') => {
                i += 3;
                out.push_str("' '");
            }
            ch => {
                out.push(ch);
                i += 1;
            }
        }
    }
    out
}

/// The identifiers of a piece of code, in order.
fn tokens(code: &str) -> Vec<&str> {
    code.split(|c: char| !(c.is_alphanumeric() || c == '_')).filter(|t| !t.is_empty()).collect()
}

fn touches_etcd(text: &str) -> bool {
    tokens(&code(text)).contains(&"etcdv3")
}

/// A constant that reads as a bound: `MAX_*`, or `*_BYTES` / `*_LIMIT` that is
/// not a flag's `DEFAULT_*`.
fn is_bound_name(name: &str) -> bool {
    name.starts_with("MAX_")
        || ((name.ends_with("_BYTES") || name.ends_with("_LIMIT")) && !name.starts_with("DEFAULT_"))
}

/// The constants `specs::limits` defines.
fn limit_names() -> BTreeSet<String> {
    let code = code(&read("specs/src/limits.rs"));
    let names: BTreeSet<String> = code
        .match_indices("const ")
        .map(|(at, _)| code[at + 6..].chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect())
        .collect();
    assert!(names.contains("MAX_ID") && names.contains("MAX_MANIFEST_BYTES"), "limits read: {names:?}");
    names
}

/// The bound constants (and statics) a file defines, other than another name
/// or another unit for a `specs::limits` bound (`const MAX_NODES: usize =
/// limits::MAX_NUMA_NODES`, `MAX_CPUS as i128 * NANO`).
fn bound_constants(text: &str, limits: &BTreeSet<String>) -> Vec<String> {
    let code = code(text);
    let mut found = Vec::new();
    for (at, _) in code.match_indices("const ").chain(code.match_indices("static ")) {
        // Only an item's keyword: at a line's start or after its visibility.
        let before = code[..at].rsplit('\n').next().unwrap_or("").trim();
        let visibility = before.is_empty() || before == "pub" || (before.starts_with("pub(") && before.ends_with(')'));
        if !visibility {
            continue;
        }
        let rest = &code[at..];
        let rest = &rest[rest.find(' ').expect("keyword") + 1..];
        let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        let Some(colon) = rest.find(':') else { continue };
        if rest[name.len()..colon].trim() != "" || !is_bound_name(&name) {
            continue; // `const fn`, `static mut`, or not a bound's name
        }
        let value = rest.split_once('=').map(|(_, v)| v.split(';').next().unwrap_or("")).unwrap_or("");
        if !value.contains("limits::") && !tokens(value).iter().any(|t| limits.contains(*t)) {
            found.push(name);
        }
    }
    found
}

/// What a file of the domain layer must not name: the API layer, an HTTP
/// crate, an HTTP status or answer.
fn http_or_api_mentions(text: &str) -> Vec<String> {
    let code = code(text);
    let flat: String = code.chars().filter(|c| !c.is_whitespace()).collect();
    let mut found = BTreeSet::new();
    for path in ["crate::api", "super::api", "super::super::api"] {
        for (at, _) in flat.match_indices(path) {
            let next = flat[at + path.len()..].chars().next();
            if !next.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                found.insert(path.to_string());
            }
        }
    }
    // `use crate::{api, ...}` and the like.
    for prefix in ["crate::{", "super::{"] {
        for (at, _) in flat.match_indices(prefix) {
            let group = &flat[at + prefix.len()..];
            let mut depth = 1;
            let end = group
                .char_indices()
                .find(|&(_, c)| {
                    depth += match c {
                        '{' => 1,
                        '}' => -1,
                        _ => 0,
                    };
                    depth == 0
                })
                .map_or(group.len(), |(i, _)| i);
            if group[..end].split(|c: char| !(c.is_alphanumeric() || c == '_')).next() == Some("api")
                || group[..end].split(',').any(|item| item == "api" || item.starts_with("api::"))
            {
                found.insert(format!("{prefix}api"));
            }
        }
    }
    for t in tokens(&code) {
        if matches!(t, "hyper" | "hyper_util" | "http" | "http_body" | "http_body_util" | "StatusCode" | "ApiError") {
            found.insert(t.to_string());
        }
    }
    found.into_iter().collect()
}

#[test]
fn only_the_listed_modules_touch_etcd() {
    let touching: BTreeSet<String> = workspace_files().into_iter().filter(|f| touches_etcd(&read(f))).collect();
    let listed: BTreeSet<String> = ETCD_FILES.iter().map(|f| f.to_string()).collect();
    let mut broken = Vec::new();
    for f in touching.difference(&listed) {
        broken.push(format!("{f} names etcdv3 but is not in ETCD_FILES (nor in ARCHITECTURE.md)"));
    }
    for f in listed.difference(&touching) {
        broken.push(format!("{f} is in ETCD_FILES but no longer names etcdv3: take it off (and off ARCHITECTURE.md)"));
    }
    assert!(broken.is_empty(), "the modules that touch etcd:\n{}", broken.join("\n"));
}

#[test]
fn every_bound_on_input_is_in_specs_limits() {
    let limits = limit_names();
    let mut seen = BTreeSet::new();
    let mut broken = Vec::new();
    for f in workspace_files() {
        // The product's sources: not tests, test fixtures, benches or e2e.
        let product = !f.starts_with("e2e/")
            && f.contains("/src/")
            && !f.ends_with("/tests.rs")
            && !f.ends_with("/testing.rs")
            && !f.contains("/testing/")
            && !f.contains("/tests/")
            && f != "specs/src/limits.rs";
        if !product {
            continue;
        }
        for name in bound_constants(&read(&f), &limits) {
            match BOUNDS_ELSEWHERE.iter().find(|(file, n, _)| *file == f && *n == name) {
                Some(_) => {
                    seen.insert((f.clone(), name));
                }
                None => broken.push(format!(
                    "{f}: `{name}` is a bound outside specs::limits: move it there, or add it to \
                     BOUNDS_ELSEWHERE with why it is not a bound on what users submit"
                )),
            }
        }
    }
    for (file, name, _) in BOUNDS_ELSEWHERE {
        if !seen.contains(&(file.to_string(), name.to_string())) {
            broken.push(format!("{file}: `{name}` is in BOUNDS_ELSEWHERE but not defined there any more: take it off"));
        }
    }
    assert!(broken.is_empty(), "bounds:\n{}", broken.join("\n"));
}

#[test]
fn the_cluster_module_knows_nothing_of_http_or_the_api() {
    let dir = root().join("orchestrator/src/cluster");
    assert!(
        dir.join("mod.rs").is_file(),
        "orchestrator/src/cluster/mod.rs is gone: the domain layer moved; say where in ARCHITECTURE.md and here"
    );
    let files = rust_files(&dir);
    let mut broken = Vec::new();
    for f in &files {
        for m in http_or_api_mentions(&read(f)) {
            broken.push(format!("{f} names `{m}`"));
        }
    }
    assert!(
        broken.is_empty(),
        "the domain layer (cluster/) returns ClusterError and leaves HTTP to api::error::answer:\n{}",
        broken.join("\n")
    );
}

/// What a decider must not name: the store, a spawned task, an await, the
/// file system, the network or a process. Its effects are the executor's.
fn io_mentions(text: &str) -> Vec<String> {
    let code = code(text);
    let found: BTreeSet<&str> = tokens(&code)
        .into_iter()
        .filter(|t| {
            matches!(
                *t,
                "Store" | "Txn" | "async" | "await" | "spawn" | "fs" | "File" | "TcpStream" | "TcpListener" | "Command"
            )
        })
        .collect();
    found.into_iter().map(str::to_string).collect()
}

/// The controller's files whose code is decisions over its in-memory state;
/// `mod.rs` (the executor and the loops) and `tests.rs` are the rest.
const CONTROLLER_DECIDERS: &[&str] =
    &["daemonsets.rs", "decide.rs", "effect.rs", "expiry.rs", "lifecycle.rs", "rollout.rs", "state.rs"];

#[test]
fn the_controllers_deciders_do_no_io() {
    let dir = root().join("orchestrator/src/controller");
    let mut broken = Vec::new();
    let mut seen = Vec::new();
    for f in rust_files(&dir) {
        let name = f.rsplit('/').next().unwrap_or_default();
        if matches!(name, "mod.rs" | "tests.rs") {
            continue;
        }
        if !CONTROLLER_DECIDERS.contains(&name) {
            broken.push(format!("{f} is new: a decider (list it in CONTROLLER_DECIDERS) or I/O (move it to mod.rs)"));
            continue;
        }
        seen.push(name.to_string());
        for m in io_mentions(&read(&f)) {
            broken.push(format!("{f} names `{m}`"));
        }
    }
    assert_eq!(seen.len(), CONTROLLER_DECIDERS.len(), "a listed decider is gone: {seen:?}");
    assert!(
        broken.is_empty(),
        "the controller's deciders return effects and leave the writes to Controller::execute:\n{}",
        broken.join("\n")
    );
}

/// The node agent's pure deciders: `plan` (state, event, now -> actions) and
/// `reconcile` (restarts, phases, what a container is given).
const AGENT_DECIDERS: &[&str] =
    &["nodelet/src/agent/plan.rs", "nodelet/src/agent/reconcile.rs", "nodelet/src/agent/probes.rs"];

#[test]
fn the_agents_deciders_do_no_io() {
    let mut broken = Vec::new();
    for f in AGENT_DECIDERS {
        for m in io_mentions(&read(f)) {
            broken.push(format!("{f} names `{m}`"));
        }
    }
    assert!(broken.is_empty(), "the agent's deciders leave I/O to its executor:\n{}", broken.join("\n"));
}

#[test]
fn only_cli_and_e2e_use_anyhow() {
    let mut broken = Vec::new();
    let members = members();
    for m in &members {
        if ANYHOW_CRATES.contains(&m.as_str()) {
            continue;
        }
        let manifest = format!("{m}/Cargo.toml");
        if tokens(&read(&manifest)).contains(&"anyhow") {
            broken.push(format!("{manifest} names anyhow"));
        }
        // A member inside another (orchestrator/wire) is read as its own.
        let inner: Vec<&String> = members.iter().filter(|o| o.starts_with(&format!("{m}/"))).collect();
        for f in rust_files(&root().join(m)) {
            if inner.iter().any(|o| f.starts_with(&format!("{o}/"))) {
                continue;
            }
            if tokens(&code(&read(&f))).contains(&"anyhow") {
                broken.push(format!("{f} uses anyhow"));
            }
        }
    }
    assert!(
        broken.is_empty(),
        "libraries return thiserror enums; anyhow only in {ANYHOW_CRATES:?}:\n{}",
        broken.join("\n")
    );
}

#[test]
fn the_readers_see_what_the_rules_are_about() {
    // Comments and strings do not count; code does.
    assert!(!touches_etcd("// etcdv3::Client\nlet s = \"etcdv3\";"));
    assert!(touches_etcd("use crate::etcdv3::{Client, RangeRequest};"));
    assert!(!touches_etcd("use etcdv3x::Client;"));
    assert_eq!(code("let c = '\"'; let s = \"a // b\"; x"), "let c = ' '; let s = \"\"; x");

    // A new bound anywhere is seen; another name for a limit, a default, or a
    // non-bound is not.
    let text = "pub const MAX_FOO_BYTES: usize = 1 << 20;\n\
                const X: u32 = 1;\n\
                pub(crate) const MAX_NODES: usize = crate::limits::MAX_NUMA_NODES;\n\
                pub const MAX_CPU_NANOS: i128 = MAX_CPUS as i128 * NANO;\n\
                pub const DEFAULT_CACHE_BYTES: u64 = 64 << 20;\n\
                const fn MAX_F() -> u32 { 1 }\n\
                    const BODY_LIMIT: usize = 1 << 20;\n\
                static MAX_S: u64 = 3;\n\
                /// const MAX_DOC: usize = 1;\n";
    let limits = BTreeSet::from(["MAX_CPUS".to_string()]);
    assert_eq!(bound_constants(text, &limits), ["MAX_FOO_BYTES", "BODY_LIMIT", "MAX_S"]);

    // The domain layer may name the wire types (`specs::api`) but not the API
    // layer or HTTP.
    assert!(http_or_api_mentions("use specs::api::{Event, ObjectRef};\n// crate::api::error\n").is_empty());
    assert_eq!(http_or_api_mentions("use crate::api::error::answer;"), ["crate::api"]);
    assert_eq!(http_or_api_mentions("use crate::{\n    api,\n    store::Txn,\n};"), ["crate::{api"]);
    assert_eq!(http_or_api_mentions("use crate::{store::Txn, api::parse::Action};"), ["crate::{api"]);
    assert!(http_or_api_mentions("use crate::{store::Txn, tls::Identity};").is_empty());
    assert_eq!(http_or_api_mentions("fn f() -> hyper::StatusCode { todo!() }"), ["StatusCode", "hyper"]);
    assert_eq!(http_or_api_mentions("let s = http::StatusCode::OK;"), ["StatusCode", "http"]);

    // A decider may name effects and the state, not the store or an await.
    assert!(io_mentions("fn timers(&mut self) -> Vec<Effect> { /* store.write */ Vec::new() }").is_empty());
    assert_eq!(
        io_mentions("async fn f(s: &Store) { s.write(|t: &mut Txn| ()).await }"),
        ["Store", "Txn", "async", "await"]
    );
    assert_eq!(io_mentions("let _ = std::fs::read(\"x\");"), ["fs"]);
}

/// Whether a test file starts pinion's agent or `up` with real containers
/// (its pod network then comes from `--cni-conf-dir`, by default the host's
/// /etc/cni/net.d) without naming a folder of its own.
fn reads_the_hosts_cni_folder(text: &str) -> bool {
    let real = text.contains("\"libcontainer\"") || text.contains("--runtime libcontainer");
    let daemon = text.contains("\"agent\"") || text.contains("\"up\"") || text.contains(" agent ");
    real && daemon && !text.contains("--cni-conf-dir")
}

/// Tests never read the host's pod network (a host's `pinion up` writes
/// /etc/cni/net.d/10-pinion.conflist, which a guest kernel without bridges,
/// or any other test, must not pick up): every test, the scenario runner
/// and the QEMU guest's script that start real containers name their own.
#[test]
fn tests_name_their_own_cni_folder() {
    let root = root();
    let mut files: Vec<String> = members()
        .iter()
        .filter(|m| root.join(m).join("tests").is_dir())
        .flat_map(|m| rust_files(&root.join(m).join("tests")))
        .collect();
    files.push("e2e/src/scenario.rs".into());
    files.push("e2e/qemu/guest-numa.sh".into());
    let offenders: Vec<&String> = files.iter().filter(|f| reads_the_hosts_cni_folder(&read(f))).collect();
    assert!(offenders.is_empty(), "these start real containers with the host's /etc/cni/net.d: {offenders:?}");
    assert!(reads_the_hosts_cni_folder(r#"cmd.args(["agent", "--runtime", "libcontainer"])"#));
    assert!(!reads_the_hosts_cni_folder(r#"cmd.args(["agent", "--runtime", "hollow"])"#));
}

#[test]
fn the_cli_prints_through_its_output_macros() {
    // `println!` panics when stdout's reader went away (`| head -1`):
    // `out!`/`outln!` (cli/src/out.rs) end the process quietly instead.
    let mut broken = Vec::new();
    for f in rust_files(&root().join("cli/src")) {
        if f == "cli/src/out.rs" {
            continue;
        }
        let code = code(&read(&f));
        let tokens = tokens(&code);
        for (i, t) in tokens.iter().enumerate() {
            if (*t == "println" || *t == "print") && code_has_bang_after(&code, &tokens, i) {
                broken.push(format!("{f} uses {t}!"));
            }
        }
    }
    broken.dedup();
    assert!(broken.is_empty(), "the CLI prints with out!/outln!, not print!/println!:\n{}", broken.join("\n"));
}

/// Whether the `i`th token is followed by `!` (a macro call) in `code`.
fn code_has_bang_after(code: &str, tokens: &[&str], i: usize) -> bool {
    // Tokens are slices of `code`: find where this one ends.
    let start = tokens[i].as_ptr() as usize - code.as_ptr() as usize;
    code[start + tokens[i].len()..].trim_start().starts_with('!')
}
