//! `specs::manifest::parse_pods` over arbitrary text (YAML, JSON, several
//! documents). Beyond "no panic": a pod that parses must survive the store's
//! JSON round trip, because the orchestrator stores it as JSON and reads it back.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(pods) = specs::manifest::parse_pods(text) else { return };
    for pod in pods {
        let json = serde_json::to_vec(&pod).expect("an accepted pod serializes");
        let back: specs::Pod = serde_json::from_slice(&json).expect("an accepted pod reads back from its JSON");
        assert_eq!(serde_json::to_vec(&back).expect("serializes again"), json, "JSON round trip changed the pod");
    }
});
