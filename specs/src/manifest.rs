//! Manifest parsing: YAML (one or more `---` documents) or JSON (an object or a
//! list of objects) into validated `Pod`s. Unknown fields, bad quantities and
//! wrong types carry their field path (via `serde_path_to_error`), all of them
//! (`decode_pod` takes each field at fault out and decodes again); semantic
//! problems come from `validate::validate_pod`, for every document. The orchestrator's
//! API and the nodelet's manifest folder both parse through here.

use serde::Deserialize;

use crate::limits::{MAX_MANIFEST_BYTES, MAX_PODS};
use crate::pod::Pod;
use crate::validate::{validate_pod, FieldError};

/// One problem in a manifest; `document` is the 0-based document (or JSON list
/// element) index, set when the manifest holds more than one pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestProblem {
    pub document: Option<usize>,
    pub error: FieldError,
}

impl std::fmt::Display for ManifestProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(d) = self.document {
            write!(f, "document {d}: ")?;
        }
        if self.error.field.is_empty() {
            write!(f, "{}", self.error.message)
        } else {
            write!(f, "{}", self.error)
        }
    }
}

/// Every problem found in a manifest; Display is one line per problem.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ManifestError {
    pub problems: Vec<ManifestProblem>,
}

impl std::fmt::Display for ManifestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, p) in self.problems.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{p}")?;
        }
        Ok(())
    }
}

impl ManifestError {
    fn one(field: &str, message: impl Into<String>) -> ManifestError {
        ManifestError {
            problems: vec![ManifestProblem {
                document: None,
                error: FieldError { field: field.into(), message: message.into() },
            }],
        }
    }
}

/// Most structural problems collected from one pod before giving up.
const MAX_DECODE_PROBLEMS: usize = 64;

/// One pod decoded with [`decode_pod`].
#[derive(Debug)]
pub struct Decoded {
    /// The pod decoded from what was left after taking out the fields at
    /// fault; `None` when the value could not be pruned to a pod.
    pub pod: Option<Pod>,
    /// Every structural problem (unknown fields, bad quantities, wrong types).
    pub errors: Vec<FieldError>,
}

impl Decoded {
    /// Adds the semantic problems found on the pruned pod (one per field).
    /// They are true of the pod without the fields at fault: `rootfs: guest`
    /// taken out, "set one of image or rootfs" follows, which is also what
    /// the author must fix.
    pub fn add_semantic(&mut self, found: Vec<FieldError>) {
        for e in found {
            if !self.errors.iter().any(|x| x.field == e.field) {
                self.errors.push(e);
            }
        }
    }
}

/// Deserializes one pod, collecting every structural problem, not just the
/// first: after each error the field at fault is taken out and the rest
/// decoded again, so one typo does not hide the next.
pub fn decode_pod(value: &serde_yaml_ng::Value) -> Decoded {
    let mut d = Decoded { pod: None, errors: Vec::new() };
    let mut pruned = value.clone();
    let mut removed: Vec<String> = Vec::new();
    while d.errors.len() < MAX_DECODE_PROBLEMS {
        let e = match serde_path_to_error::deserialize::<_, Pod>(&pruned) {
            Ok(pod) => {
                d.pod = Some(pod);
                return d;
            }
            Err(e) => e,
        };
        let segments: Vec<serde_path_to_error::Segment> = e.path().iter().cloned().collect();
        let path = e.path().to_string();
        let field = if path == "." { String::new() } else { path };
        let message = e.into_inner().to_string();
        // A missing field is named by its own path (`spec.containers`, not
        // `spec`; `apiVersion`, not the empty root).
        let mut named = field.clone();
        if let Some(name) = message.strip_prefix("missing field `").and_then(|m| m.strip_suffix('`')) {
            let full = if field.is_empty() { name.to_string() } else { format!("{field}.{name}") };
            // A required field we took out ourselves is not a second problem.
            if removed.contains(&full) {
                return d;
            }
            named = full;
        }
        d.errors.push(FieldError { field: named, message });
        match remove_at(&mut pruned, &segments) {
            Removed::Key => removed.push(field),
            // Later elements' indexes moved: their paths would be wrong.
            Removed::Element | Removed::Nothing => return d,
        }
    }
    d
}

enum Removed {
    Key,
    Element,
    Nothing,
}

/// Takes out the value at `path`.
fn remove_at(v: &mut serde_yaml_ng::Value, path: &[serde_path_to_error::Segment]) -> Removed {
    use serde_path_to_error::Segment;
    use serde_yaml_ng::Value;
    let Some((last, parents)) = path.split_last() else { return Removed::Nothing };
    let mut cur = v;
    for seg in parents {
        let next = match (seg, cur) {
            (Segment::Map { key }, Value::Mapping(m)) => m.get_mut(key.as_str()),
            (Segment::Seq { index }, Value::Sequence(s)) => s.get_mut(*index),
            (Segment::Enum { .. }, other) => Some(other),
            _ => None,
        };
        let Some(next) = next else { return Removed::Nothing };
        cur = next;
    }
    match (last, cur) {
        (Segment::Map { key }, Value::Mapping(m)) => match m.remove(key.as_str()) {
            Some(_) => Removed::Key,
            None => Removed::Nothing,
        },
        (Segment::Seq { index }, Value::Sequence(s)) if *index < s.len() => {
            s.remove(*index);
            Removed::Element
        }
        _ => Removed::Nothing,
    }
}

/// Why `text` nests too deep to be handed to a YAML parser, if it does:
/// more than `MAX_NESTING` unclosed `[` or `{` at some point. Counted over
/// every byte, quoted or not (a string cannot hide an opening from libyaml's
/// point of view without this scan knowing YAML's quoting rules), so it only
/// ever refuses more, never less; a closing bracket never takes the count
/// below zero, so leading closers cannot buy depth. Linear in the text.
pub fn nesting_problem(text: &str) -> Option<String> {
    let mut depth = 0usize;
    for b in text.bytes() {
        match b {
            b'[' | b'{' => {
                depth += 1;
                if depth > crate::limits::MAX_NESTING {
                    return Some(format!("nested deeper than {} levels of [ and {{", crate::limits::MAX_NESTING));
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    None
}

/// Parses and validates every pod in `text` (YAML or JSON; JSON is YAML).
pub fn parse_pods(text: &str) -> Result<Vec<Pod>, ManifestError> {
    if text.len() > MAX_MANIFEST_BYTES {
        return Err(ManifestError::one("", format!("manifest larger than {MAX_MANIFEST_BYTES} bytes")));
    }
    if let Some(p) = nesting_problem(text) {
        return Err(ManifestError::one("", p));
    }
    // First split into raw values: a document that is a list holds several pods.
    let mut values = Vec::new();
    for (d, doc) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
        let v = match serde_yaml_ng::Value::deserialize(doc) {
            Ok(v) => v,
            Err(e) => {
                let mut err = ManifestError::one("", format!("syntax error: {e}"));
                err.problems[0].document = Some(d);
                return Err(err);
            }
        };
        match v {
            serde_yaml_ng::Value::Null => {} // empty document, e.g. a trailing `---`
            serde_yaml_ng::Value::Sequence(items) => values.extend(items),
            other => values.push(other),
        }
        if values.len() > MAX_PODS {
            return Err(ManifestError::one("", format!("more than {MAX_PODS} pods in one manifest")));
        }
    }
    if values.is_empty() {
        return Err(ManifestError::one("", "no pod in manifest"));
    }
    let many = values.len() > 1;
    let mut pods = Vec::with_capacity(values.len());
    let mut problems = Vec::new();
    for (i, v) in values.into_iter().enumerate() {
        let document = many.then_some(i);
        let mut d = decode_pod(&v);
        if let Some(pod) = d.pod.take() {
            d.add_semantic(validate_pod(&pod));
            pods.push(pod);
        }
        problems.extend(d.errors.into_iter().map(|error| ManifestProblem { document, error }));
    }
    if problems.is_empty() {
        Ok(pods)
    } else {
        Err(ManifestError { problems })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // in tests a panic is the failure report
mod tests {
    use super::*;

    const POD: &str =
        "apiVersion: pinion.io/v1\nkind: Pod\nmetadata: {name: a}\nspec:\n  containers:\n  - {name: c, rootfs: host}\n";

    /// `Ok(n)`: n pods; `Err(lines)`: the exact Display lines.
    fn check(text: &str, expected: Result<usize, &[&str]>) {
        match (parse_pods(text), expected) {
            (Ok(p), Ok(n)) => assert_eq!(p.len(), n, "{text}"),
            (Err(e), Err(lines)) => assert_eq!(e.to_string().lines().collect::<Vec<_>>(), lines, "{text}"),
            (got, want) => panic!("input {text:?}: got {got:?}, want {want:?}"),
        }
    }

    #[test]
    fn parses_and_reports() {
        let two = format!("{POD}---\n{}", POD.replace("name: a", "name: b"));
        let json = r#"{"apiVersion":"pinion.io/v1","kind":"Pod","metadata":{"name":"a"},"spec":{"containers":[{"name":"c","rootfs":"host"}]}}"#;
        let json_list = format!("[{json}, {json}]");
        let cases: Vec<(String, Result<usize, &[&str]>)> = vec![
            (POD.into(), Ok(1)),
            (two.clone(), Ok(2)),
            (format!("{two}---\n"), Ok(2)),
            (json.into(), Ok(1)),
            (json_list, Ok(2)),
            ("".into(), Err(&["no pod in manifest"])),
            // 64 levels are a manifest's business; 65 never reach the parser.
            (
                format!("{{\"k\": {}{}}}", "[".repeat(63), "]".repeat(63)),
                Err(&[
                    "k: unknown field `k`, expected one of `apiVersion`, `kind`, `metadata`, `spec`, `status`",
                    "apiVersion: missing field `apiVersion`",
                ]),
            ),
            (
                format!("{{\"k\": {}{}}}", "[".repeat(64), "]".repeat(64)),
                Err(&["nested deeper than 64 levels of [ and {"]),
            ),
            // Closers first buy nothing.
            (format!("{}{{\"k\": {}", "]".repeat(100), "[".repeat(64)), Err(&["nested deeper than 64 levels of [ and {"])),
            (
                POD.replace("rootfs: host", "rootfs: host, cpuPolcy: exclusive"),
                Err(&[
                    "spec.containers[0].cpuPolcy: unknown field `cpuPolcy`, expected one of `name`, `image`, `imagePullPolicy`, `rootfs`, \
                     `command`, `args`, `env`, `workingDir`, `resources`, `cpuPolicy`, `securityContext`, `volumeMounts`, \
                     `livenessProbe`, `readinessProbe`, `startupProbe`",
                ]),
            ),
            (
                POD.replace("rootfs: host", "rootfs: host, resources: {limits: {cpu: 1x}}"),
                Err(&["spec.containers[0].resources.limits.cpu: invalid quantity \"1x\": unknown suffix (use n, u, m, k, M, G, T, \
                     P, E, Ki..Ei or an exponent like e3)"]),
            ),
            (
                POD.replace("rootfs: host", "rootfs: guest"),
                Err(&[
                    "spec.containers[0].rootfs: unknown variant `guest`, expected `host`",
                    "spec.containers[0].image: set exactly one of image or rootfs: host",
                ]),
            ),
            (
                format!("{two}---\n{}", POD.replace("name: a", "name: A").replace("name: c", "name: C")),
                Err(&[
                    "document 2: metadata.name: \"A\" is not a DNS-1123 label (1-63 of a-z 0-9 -, alphanumeric at both ends)",
                    "document 2: spec.containers[0].name: \"C\" is not a DNS-1123 label",
                ]),
            ),
            (
                // Every problem at once: two structural ones (an unknown field, a
                // bad quantity) and the semantic ones beside them.
                POD.replace("name: a", "name: Bad_Name").replace(
                    "rootfs: host}",
                    "rootfs: host, bogus: 1, resources: {limits: {cpu: '1', memory: 10Qi}}}\n  - {name: D, rootfs: host}",
                ),
                Err(&[
                    "spec.containers[0].bogus: unknown field `bogus`, expected one of `name`, `image`, `imagePullPolicy`, `rootfs`, \
                     `command`, `args`, `env`, `workingDir`, `resources`, `cpuPolicy`, `securityContext`, `volumeMounts`, \
                     `livenessProbe`, `readinessProbe`, `startupProbe`",
                    "spec.containers[0].resources.limits.memory: invalid quantity \"10Qi\": unknown suffix (use n, u, m, \
                     k, M, G, T, P, E, Ki..Ei or an exponent like e3)",
                    "metadata.name: \"Bad_Name\" is not a DNS-1123 label (1-63 of a-z 0-9 -, alphanumeric at both ends)",
                    "spec.containers[1].name: \"D\" is not a DNS-1123 label",
                ]),
            ),
            ("a: [".into(), Err(&["document 0: syntax error: did not find expected node content at line 2 column 1, while parsing a flow node"])),
        ];
        for (text, want) in cases {
            check(&text, want);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // in tests a panic is the failure report
mod example_tests {
    use super::*;

    /// Every file in specs/examples parses and validates, with the pod count we expect.
    #[test]
    fn examples_parse() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
        let want = [
            ("gpu.yaml", 1),
            ("hbm-memory.yaml", 1),
            ("hpc-job.yaml", 1),
            ("mpi-job.yaml", 0),
            ("numa-policies.yaml", 4),
            ("pinned.yaml", 1),
            ("ptp-daemonset.yaml", 0),
            ("relaxed-nic.yaml", 1),
            ("shared.yaml", 1),
            ("telecom-upf.yaml", 1),
            ("upf-deployment.yaml", 0),
        ];
        let mut names: Vec<String> =
            std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        names.sort();
        assert_eq!(names, want.iter().map(|(n, _)| n.to_string()).collect::<Vec<_>>());
        for (name, n) in want {
            let text = std::fs::read_to_string(dir.join(name)).unwrap();
            if n == 0 {
                // A Job, Deployment or DaemonSet: its template is validated
                // as a pod by the kind's own check.
                let kind: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).unwrap();
                let problems = match kind.get("kind").and_then(|k| k.as_str()) {
                    Some("Job") => crate::job::validate_job(&serde_yaml_ng::from_str(&text).unwrap()),
                    Some("Deployment") => {
                        crate::deployment::validate_deployment(&serde_yaml_ng::from_str(&text).unwrap())
                    }
                    Some("DaemonSet") => crate::daemonset::validate_daemonset(&serde_yaml_ng::from_str(&text).unwrap()),
                    other => panic!("{name}: kind {other:?}"),
                };
                assert_eq!(problems, Vec::new(), "{name}");
                continue;
            }
            match parse_pods(&text) {
                Ok(pods) => assert_eq!(pods.len(), n, "{name}"),
                Err(e) => panic!("{name}:\n{e}"),
            }
        }
    }

    /// Every example the project's documents name is one of those validated above.
    #[test]
    fn the_examples_the_docs_name_exist() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut named = 0;
        for doc in ["README.md", "ARCHITECTURE.md", "BENCHMARKS.md"] {
            let text = std::fs::read_to_string(root.join(doc)).unwrap();
            for (i, _) in text.match_indices("specs/examples/") {
                let rest = &text[i..];
                let end = rest.find(|c: char| !(c.is_ascii_alphanumeric() || "/-_.".contains(c))).unwrap_or(rest.len());
                let path = rest[..end].trim_end_matches('.');
                if path.ends_with(".yaml") {
                    assert!(root.join(path).is_file(), "{doc} names {path}, which does not exist");
                    named += 1;
                }
            }
        }
        assert!(named > 0, "the README's quick start names an example");
    }
}
