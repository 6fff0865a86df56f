use super::*;
use crate::node_lost::ReplaceAfter;

pub(crate) const UPF: &str = r#"
apiVersion: pinion.io/v1
kind: Deployment
metadata: {name: upf}
spec:
  replicas: 3
  selector: {matchLabels: {app: upf}}
  template:
    metadata: {labels: {app: upf, tier: core}}
    spec:
      containers:
      - name: main
        rootfs: host
        command: [sleep, infinity]
        readinessProbe: {tcpSocket: {port: 8805}, periodSeconds: 2}
        livenessProbe: {exec: {command: [cat, /tmp/healthy]}}
      nodeLostReplaceAfterSeconds: 60
"#;

pub(crate) fn upf() -> Deployment {
    serde_yaml_ng::from_str(UPF).expect("the fixture reads")
}

#[test]
fn reads_with_kubernetes_defaults() {
    let d = upf();
    assert!(validate_deployment(&d).is_empty(), "{:?}", validate_deployment(&d));
    assert_eq!(d.spec.strategy.kind, StrategyType::RollingUpdate);
    assert_eq!((d.spec.progress_deadline_seconds(), d.spec.revision_history_limit()), (600, 10));
    assert_eq!(d.spec.template.spec.node_lost_replace_after_seconds, Some(ReplaceAfter::Seconds(60)));
    let json = serde_json::to_string(&d).expect("json");
    let back: Deployment = serde_json::from_str(&json).expect("reads back");
    assert_eq!(back, d);
    let typo = UPF.replace("replicas: 3", "replica: 3");
    assert!(serde_yaml_ng::from_str::<Deployment>(&typo).is_err(), "unknown fields are refused");
}

#[test]
fn int_or_percent_reads_and_rounds() {
    let read = |s: &str| serde_yaml_ng::from_str::<IntOrPercent>(s).map_err(|e| e.to_string());
    assert_eq!(read("2"), Ok(IntOrPercent::Int(2)));
    assert_eq!(read("\"25%\""), Ok(IntOrPercent::Percent(25)));
    for bad in ["-1", "\"%\"", "\"x%\"", "\"25\"", "\"2.5%\""] {
        assert!(read(bad).is_err(), "{bad}");
    }
    assert_eq!(serde_json::to_string(&IntOrPercent::Percent(30)).ok().as_deref(), Some("\"30%\""));
    let cases = [
        (IntOrPercent::Percent(25), 10, true, 3),
        (IntOrPercent::Percent(25), 10, false, 2),
        (IntOrPercent::Percent(25), 4, false, 1),
        (IntOrPercent::Percent(100), 7, true, 7),
        (IntOrPercent::Percent(1), 1, true, 1),
        (IntOrPercent::Percent(1), 1, false, 0),
        (IntOrPercent::Int(5), 2, false, 5),
    ];
    for (v, total, up, want) in cases {
        assert_eq!(v.resolve(total, up), want, "{v:?} of {total}, up {up}");
    }
}

#[test]
fn the_template_hash_is_fixed() {
    // FNV-1a's published test vectors.
    assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
    assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
    assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
    let d = upf();
    let h = template_hash(&d.spec.template);
    // Fixed: a change here renames every running Deployment's pods and
    // rolls them all on upgrade. Change the hash only on purpose.
    assert_eq!(h, GOLDEN);
    assert_eq!(h.len(), HASH_LEN);
    let mut t = d.spec.template.clone();
    t.spec.containers[0].command.push("x".into());
    assert_ne!(template_hash(&t), h, "another template, another hash");
    assert_eq!(template_hash(&d.spec.template.clone()), h);
}

const GOLDEN: &str = "rgqf94525w";

#[test]
fn pods_are_named_and_labelled() {
    let mut d = upf();
    d.metadata.owner = Some("ana".into());
    let rev = Revision { number: 4, template_hash: template_hash(&d.spec.template), template: d.spec.template.clone() };
    let p = new_pod(&d, &rev, 12345);
    assert_eq!(p.metadata.name, format!("upf-{}-{}", rev.template_hash, pod_suffix(12345)));
    assert_eq!(pod_suffix(12345).len(), SUFFIX_LEN);
    assert_ne!(pod_suffix(12345), pod_suffix(12346));
    let l = &p.metadata.labels;
    assert_eq!(l.get("app").map(String::as_str), Some("upf"));
    assert_eq!(l.get("tier").map(String::as_str), Some("core"));
    assert_eq!(l.get(DEPLOYMENT_LABEL).map(String::as_str), Some("upf"));
    assert_eq!(l.get(REVISION_LABEL).map(String::as_str), Some("4"));
    assert_eq!(pod_template_hash(&p), Some(rev.template_hash.as_str()));
    assert_eq!(p.metadata.owner.as_deref(), Some("ana"));
    assert_eq!(p.spec.node_name, None);
    assert!(crate::validate::validate_pod(&p).is_empty(), "{:?}", crate::validate::validate_pod(&p));
    // The longest name a Deployment may have still gives its pods a label.
    d.metadata.name = "a".repeat(crate::limits::MAX_WORKLOAD_NAME_LEN);
    assert!(validate_deployment(&d).is_empty());
    assert_eq!(new_pod(&d, &rev, u64::MAX).metadata.name.len(), crate::limits::MAX_NAME_LEN);
}

#[test]
fn validation_names_each_field() {
    type Edit = Box<dyn Fn(&mut Deployment)>;
    let ru = |u: IntOrPercent, s: IntOrPercent| Some(RollingUpdate { max_unavailable: Some(u), max_surge: Some(s) });
    let cases: Vec<(&str, Edit, &str)> = vec![
        ("kind", Box::new(|d| d.kind = "Job".into()), "kind"),
        ("api version", Box::new(|d| d.api_version = "apps/v1".into()), "apiVersion"),
        ("too many replicas", Box::new(|d| d.spec.replicas = crate::limits::MAX_REPLICAS + 1), "spec.replicas"),
        ("bad name", Box::new(|d| d.metadata.name = "UPF".into()), "metadata.name"),
        (
            "name too long for its pods",
            Box::new(|d| d.metadata.name = "a".repeat(crate::limits::MAX_WORKLOAD_NAME_LEN + 1)),
            "metadata.name",
        ),
        ("empty selector", Box::new(|d| d.spec.selector.match_labels.clear()), "spec.selector.matchLabels"),
        (
            "selector misses the template",
            Box::new(|d| {
                d.spec.selector.match_labels.insert("app".into(), "smf".into());
            }),
            "spec.selector.matchLabels",
        ),
        (
            "reserved label",
            Box::new(|d| {
                d.spec.selector.match_labels.insert(REVISION_LABEL.into(), "1".into());
            }),
            "spec.selector.matchLabels",
        ),
        (
            "both zero",
            Box::new(move |d| d.spec.strategy.rolling_update = ru(IntOrPercent::Int(0), IntOrPercent::Percent(0))),
            "spec.strategy.rollingUpdate.maxUnavailable",
        ),
        (
            "over 100%",
            Box::new(move |d| d.spec.strategy.rolling_update = ru(IntOrPercent::Int(1), IntOrPercent::Percent(101))),
            "spec.strategy.rollingUpdate.maxSurge",
        ),
        (
            "recreate with rolling settings",
            Box::new(move |d| {
                d.spec.strategy.kind = StrategyType::Recreate;
                d.spec.strategy.rolling_update = ru(IntOrPercent::Int(1), IntOrPercent::Int(1))
            }),
            "spec.strategy.rollingUpdate",
        ),
        (
            "deadline not above min ready",
            Box::new(|d| {
                d.spec.min_ready_seconds = 30;
                d.spec.progress_deadline_seconds = Some(30)
            }),
            "spec.progressDeadlineSeconds",
        ),
        ("deadline zero", Box::new(|d| d.spec.progress_deadline_seconds = Some(0)), "spec.progressDeadlineSeconds"),
        (
            "min ready too long",
            Box::new(|d| {
                d.spec.min_ready_seconds = crate::limits::MAX_WORKLOAD_SECONDS + 1;
                d.spec.progress_deadline_seconds = Some(crate::limits::MAX_PROGRESS_DEADLINE_SECONDS)
            }),
            "spec.minReadySeconds",
        ),
        (
            "history too long",
            Box::new(|d| d.spec.revision_history_limit = Some(crate::limits::MAX_REVISION_HISTORY + 1)),
            "spec.revisionHistoryLimit",
        ),
        (
            "pods that end",
            Box::new(|d| d.spec.template.spec.restart_policy = crate::pod::RestartPolicy::Never),
            "spec.template.spec.restartPolicy",
        ),
        (
            "placed by hand",
            Box::new(|d| d.spec.template.spec.node_name = Some("n1".into())),
            "spec.template.spec.nodeName",
        ),
        (
            "a template problem at its place",
            Box::new(|d| {
                d.spec.template.spec.containers[0]
                    .liveness_probe
                    .as_mut()
                    .into_iter()
                    .for_each(|p| p.period_seconds = Some(0))
            }),
            "spec.template.spec.containers[0].livenessProbe.periodSeconds",
        ),
        (
            "node lost after more than a year",
            Box::new(|d| {
                d.spec.template.spec.node_lost_replace_after_seconds =
                    Some(ReplaceAfter::Seconds(crate::limits::MAX_TTL_SECONDS + 1))
            }),
            "spec.template.spec.nodeLostReplaceAfterSeconds",
        ),
    ];
    for (what, edit, field) in cases {
        let mut d = upf();
        edit(&mut d);
        let errs = validate_deployment(&d);
        assert!(errs.iter().any(|e| e.field == field), "{what}: want {field}, got {errs:?}");
        let e = errs.iter().find(|e| e.field == field).map(|e| e.message.clone()).unwrap_or_default();
        assert!(!e.is_empty(), "{what}: the error says why");
    }
}

/// `d` after the controller recorded its template.
fn recorded(mut d: Deployment) -> Deployment {
    let (history, i) = next_history(&d);
    let mut status = d.status.clone().unwrap_or_default();
    status.revision = history[i].number;
    status.template_hash = history[i].template_hash.clone();
    status.history = history;
    d.status = Some(status);
    d
}

fn with_command(d: &Deployment, word: &str) -> PodTemplate {
    let mut t = d.spec.template.clone();
    t.spec.containers[0].command = vec!["sleep".into(), word.into()];
    t
}

#[test]
fn history_undo_and_restart() {
    let mut d = recorded(upf());
    let numbers = |d: &Deployment| d.status.as_ref().map(|s| s.history.iter().map(|r| r.number).collect::<Vec<_>>());
    let current = |d: &Deployment| d.status.as_ref().map(|s| s.revision);
    assert_eq!((numbers(&d), current(&d)), (Some(vec![1]), Some(1)));
    assert_eq!(undo(&d, None), Err(RolloutError::NoPrevious { kind: "deployment", name: "upf".into() }));
    let v1 = d.spec.template.clone();
    // The same template again is no new revision.
    d = recorded(d);
    assert_eq!(numbers(&d), Some(vec![1]));
    d.spec.template = with_command(&d, "2");
    d = recorded(d);
    let v2 = d.spec.template.clone();
    d.spec.template = with_command(&d, "3");
    d = recorded(d);
    assert_eq!((numbers(&d), current(&d)), (Some(vec![1, 2, 3]), Some(3)));
    assert_eq!(undo(&d, None), Ok(v2.clone()));
    assert_eq!(undo(&d, Some(1)), Ok(v1.clone()));
    assert_eq!(undo(&d, Some(3)), Err(RolloutError::AlreadyCurrent(3)));
    assert!(matches!(undo(&d, Some(9)), Err(RolloutError::NoSuchRevision { revision: 9, .. })));
    // Undo to 1: revision 1's template becomes revision 4 (Kubernetes renumbers).
    d.spec.template = undo(&d, Some(1)).expect("revision 1 is kept");
    d = recorded(d);
    assert_eq!((numbers(&d), current(&d)), (Some(vec![2, 3, 4]), Some(4)));
    assert_eq!(d.status.as_ref().map(|s| s.template_hash.clone()), Some(template_hash(&v1)));
    // A restart is a new revision whose only change is the annotation.
    let restarted = restart(&d.spec.template, "2026-11-29T01:00:00Z");
    assert_ne!(template_hash(&restarted), template_hash(&d.spec.template));
    assert_eq!(
        restarted.metadata.as_ref().and_then(|m| m.annotations.get(RESTARTED_AT_ANNOTATION)).map(String::as_str),
        Some("2026-11-29T01:00:00Z")
    );
    d.spec.template = restarted;
    d = recorded(d);
    assert_eq!(current(&d), Some(5));
    // The history keeps revisionHistoryLimit old revisions besides the current.
    d.spec.revision_history_limit = Some(1);
    d.spec.template = with_command(&d, "6");
    d = recorded(d);
    assert_eq!((numbers(&d), current(&d)), (Some(vec![5, 6]), Some(6)));
    // Paused: a new template is not recorded.
    d.spec.paused = true;
    d.spec.template = with_command(&d, "7");
    d = recorded(d);
    assert_eq!(current(&d), Some(6));
}
