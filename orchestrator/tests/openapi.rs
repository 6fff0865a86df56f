//! The contract test: `openapi.yaml` lists exactly the routes the server
//! answers (paths and methods), and its version is the crate's.

use std::collections::BTreeSet;

use orchestrator::api::routes::routes;

#[test]
fn openapi_matches_the_route_table() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/openapi.yaml");
    let text = std::fs::read_to_string(path).expect("openapi.yaml");
    let doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).expect("openapi.yaml parses");
    assert_eq!(doc["info"]["version"].as_str(), Some(env!("CARGO_PKG_VERSION")), "info.version");
    let methods = ["get", "put", "post", "delete", "patch", "head", "options"];
    let mut documented = BTreeSet::new();
    for (p, item) in doc["paths"].as_mapping().expect("paths") {
        let p = p.as_str().expect("path string").to_string();
        for (m, _) in item.as_mapping().expect("path item") {
            let m = m.as_str().expect("method").to_string();
            if methods.contains(&m.as_str()) {
                documented.insert((m.to_uppercase(), p.clone()));
            }
        }
    }
    let served: BTreeSet<(String, String)> =
        routes().iter().map(|r| (r.method.as_str().to_string(), r.path.to_string())).collect();
    let missing: Vec<_> = served.difference(&documented).collect();
    let stale: Vec<_> = documented.difference(&served).collect();
    assert!(
        missing.is_empty() && stale.is_empty(),
        "undocumented routes: {missing:?}; documented but not served: {stale:?}"
    );
}
