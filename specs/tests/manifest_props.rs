//! Property test of manifest decoding: a valid pod with random fields replaced
//! by junk (wrong types, unknown keys, bad quantities, deep nesting) is never
//! accepted when serde refuses it, never panics, and each problem has a message.

use proptest::prelude::*;
use serde_yaml_ng::Value;
use specs::manifest::{decode_pod, parse_pods};

const POD: &str = "apiVersion: pinion.io/v1
kind: Pod
metadata: {name: web, labels: {app: web}}
spec:
  containers:
  - name: main
    rootfs: host
    command: [sleep, inf]
    resources: {limits: {cpu: '2', memory: 1Gi, hugepages-2Mi: 4Mi}}
    securityContext: {capabilities: {add: [SYS_NICE]}}
  - name: side
    image: busybox:1
    env: [{name: A, value: b}]
";

fn junk() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| Value::Number(n.into())),
        "[a-zA-Z0-9.+-]{0,12}".prop_map(Value::String),
        Just(Value::String("10Qi".into())),
        Just(Value::String("-1".into())),
        Just(Value::String("1e999".into())),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Sequence),
            prop::collection::vec(("[a-zA-Z]{1,8}", inner), 0..4)
                .prop_map(|kv| { Value::Mapping(kv.into_iter().map(|(k, v)| (Value::String(k), v)).collect()) }),
        ]
    })
}

/// Every (path, node) of the value, as indexes to follow.
fn paths(v: &Value, here: Vec<Value>, out: &mut Vec<Vec<Value>>) {
    out.push(here.clone());
    match v {
        Value::Mapping(m) => {
            for (k, child) in m {
                let mut p = here.clone();
                p.push(k.clone());
                paths(child, p, out);
            }
        }
        Value::Sequence(s) => {
            for (i, child) in s.iter().enumerate() {
                let mut p = here.clone();
                p.push(Value::Number((i as u64).into()));
                paths(child, p, out);
            }
        }
        _ => {}
    }
}

fn at<'a>(v: &'a mut Value, path: &[Value]) -> Option<&'a mut Value> {
    let mut cur = v;
    for k in path {
        cur = match (cur, k) {
            (Value::Mapping(m), key) => m.get_mut(key)?,
            (Value::Sequence(s), Value::Number(n)) => s.get_mut(n.as_u64()? as usize)?,
            _ => return None,
        };
    }
    Some(cur)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]
    #[test]
    fn junk_anywhere_is_reported_with_a_field_and_never_panics(
        edits in prop::collection::vec((any::<prop::sample::Index>(), junk(), any::<bool>(), "[a-z]{1,6}"), 1..4)
    ) {
        let mut v: Value = serde_yaml_ng::from_str(POD).expect("the base pod parses");
        for (ix, new, add_key, key) in edits {
            let mut all = Vec::new();
            paths(&v, Vec::new(), &mut all);
            let path = all[ix.index(all.len())].clone();
            let Some(node) = at(&mut v, &path) else { continue };
            match node {
                // Sometimes an unknown key next to the others.
                Value::Mapping(m) if add_key => { m.insert(Value::String(key), new); }
                _ => *node = new,
            }
        }
        let d = decode_pod(&v);
        let typed: Result<specs::Pod, _> = serde_yaml_ng::from_value(v.clone());
        // decode_pod refuses exactly what serde refuses, and says where.
        prop_assert_eq!(typed.is_ok(), d.errors.is_empty(), "{:?}", d.errors);
        for e in &d.errors {
            prop_assert!(!e.message.is_empty());
        }
        // The whole pipeline, text in: an answer, never a panic.
        let text = serde_yaml_ng::to_string(&v).expect("a Value serializes");
        let _ = parse_pods(&text);
    }
}
