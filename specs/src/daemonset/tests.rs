use super::*;

const PTP: &str = r#"
apiVersion: pinion.io/v1
kind: DaemonSet
metadata: {name: ptp}
spec:
  selector: {matchLabels: {app: ptp}}
  template:
    metadata: {labels: {app: ptp}}
    spec:
      nodeSelector: {role: edge}
      containers: [{name: main, rootfs: host, command: [sleep, infinity]}]
"#;

fn ptp() -> DaemonSet {
    serde_yaml_ng::from_str(PTP).expect("the fixture reads")
}

fn node(name: &str, edge: bool, ready: bool) -> ObservedNode {
    let role = if edge { "edge" } else { "core" };
    ObservedNode { name: name.into(), labels: BTreeMap::from([("role".into(), role.into())]), ready }
}

fn dpod(name: &str, node: &str, hash: &str, ready: bool) -> DaemonPod {
    DaemonPod {
        name: name.into(),
        node: node.into(),
        template_hash: hash.into(),
        phase: PodPhase::Running,
        created: 1,
        ready_since: ready.then_some(1),
        deleting: false,
    }
}

#[test]
fn validation_names_each_field() {
    type Edit = Box<dyn Fn(&mut DaemonSet)>;
    let ru = |v| Some(DaemonSetRollingUpdate { max_unavailable: Some(v) });
    let cases: Vec<(&str, Edit, &str)> = vec![
        ("kind", Box::new(|d| d.kind = "Deployment".into()), "kind"),
        ("name", Box::new(|d| d.metadata.name = "a".repeat(50)), "metadata.name"),
        ("selector", Box::new(|d| d.spec.selector.match_labels.clear()), "spec.selector.matchLabels"),
        (
            "zero unavailable",
            Box::new(move |d| d.spec.update_strategy.rolling_update = ru(IntOrPercent::Int(0))),
            "spec.updateStrategy.rollingUpdate.maxUnavailable",
        ),
        (
            "over 100%",
            Box::new(move |d| d.spec.update_strategy.rolling_update = ru(IntOrPercent::Percent(101))),
            "spec.updateStrategy.rollingUpdate.maxUnavailable",
        ),
        (
            "on delete with rolling settings",
            Box::new(move |d| {
                d.spec.update_strategy.kind = DaemonSetStrategyType::OnDelete;
                d.spec.update_strategy.rolling_update = ru(IntOrPercent::Int(1))
            }),
            "spec.updateStrategy.rollingUpdate",
        ),
        (
            "never replaced elsewhere",
            Box::new(|d| {
                d.spec.template.spec.node_lost_replace_after_seconds = Some(crate::node_lost::ReplaceAfter::Seconds(5))
            }),
            "spec.template.spec.nodeLostReplaceAfterSeconds",
        ),
        (
            "too much history",
            Box::new(|d| d.spec.revision_history_limit = Some(crate::limits::MAX_REVISION_HISTORY + 1)),
            "spec.revisionHistoryLimit",
        ),
        (
            "placed by hand",
            Box::new(|d| d.spec.template.spec.node_name = Some("n1".into())),
            "spec.template.spec.nodeName",
        ),
        (
            "a template problem at its place",
            Box::new(|d| d.spec.template.spec.containers[0].name = "Main".into()),
            "spec.template.spec.containers[0].name",
        ),
    ];
    assert!(validate_daemonset(&ptp()).is_empty(), "{:?}", validate_daemonset(&ptp()));
    for (what, edit, field) in cases {
        let mut d = ptp();
        edit(&mut d);
        let errs = validate_daemonset(&d);
        assert!(errs.iter().any(|e| e.field == field), "{what}: want {field}, got {errs:?}");
    }
}

#[test]
fn pods_are_named_for_their_node_and_bound_to_it() {
    let ds = ptp();
    let p = new_pod(&ds, "edge-7.lab.example");
    assert!(p.metadata.name.starts_with("ptp-edge-7-lab-example-"), "{}", p.metadata.name);
    assert_eq!(p.spec.node_name.as_deref(), Some("edge-7.lab.example"));
    assert_eq!(p.metadata.labels.get(DAEMONSET_LABEL).map(String::as_str), Some("ptp"));
    assert_eq!(p.metadata.labels.get("app").map(String::as_str), Some("ptp"));
    assert!(crate::validate::validate_pod(&p).is_empty(), "{:?}", crate::validate::validate_pod(&p));
    let seen = DaemonPod::of(&p).expect("bound");
    assert_eq!((seen.node.as_str(), seen.template_hash), ("edge-7.lab.example", template_hash(&ds.spec.template)));
    let mut loose = p.clone();
    loose.spec.node_name = None;
    assert_eq!(DaemonPod::of(&loose), None);
    assert_eq!(new_pod(&ds, "edge-7.lab.example").metadata.name, p.metadata.name, "deterministic");
    let long = "n".repeat(63);
    let (a, b) = (pod_name("ptp", &format!("{long}a"), "h"), pod_name("ptp", &format!("{long}b"), "h"));
    assert!(a.len() <= crate::limits::MAX_NAME_LEN && crate::validate::is_dns1123_label(&a), "{a}");
    assert_ne!(a, b, "names that shorten alike still differ");
    assert_ne!(pod_name("ptp", "n1", "h1"), pod_name("ptp", "n1", "h2"), "a new revision, a new name");
    let longest = pod_name(&"d".repeat(crate::limits::MAX_WORKLOAD_NAME_LEN), &long, "h");
    assert!(crate::validate::is_dns1123_label(&longest), "{longest}");
}

#[test]
fn reconcile_table() {
    struct Case {
        what: &'static str,
        nodes: Vec<ObservedNode>,
        pods: Vec<DaemonPod>,
        create: Vec<&'static str>,
        delete: Vec<&'static str>,
    }
    let ds = ptp();
    let h = template_hash(&ds.spec.template);
    let cases = vec![
        Case {
            what: "one per matching ready node",
            nodes: vec![node("a", true, true), node("b", false, true), node("c", true, true), node("d", true, false)],
            pods: vec![],
            create: vec!["a", "c"],
            delete: vec![],
        },
        Case {
            what: "a node joins",
            nodes: vec![node("a", true, true), node("e", true, true)],
            pods: vec![dpod("pa", "a", &h, true)],
            create: vec!["e"],
            delete: vec![],
        },
        Case {
            what: "a node leaves, another stops matching",
            nodes: vec![node("a", true, true), node("b", false, true)],
            pods: vec![dpod("pa", "a", &h, true), dpod("pb", "b", &h, true), dpod("pz", "z", &h, true)],
            create: vec![],
            delete: vec!["pb", "pz"],
        },
        Case {
            what: "a NotReady node keeps its pod, nothing elsewhere",
            nodes: vec![node("a", true, false), node("b", true, true)],
            pods: vec![dpod("pa", "a", &h, false), dpod("pb", "b", &h, true)],
            create: vec![],
            delete: vec![],
        },
        Case {
            what: "an ended pod goes; its node waits for it to be gone",
            nodes: vec![node("a", true, true)],
            pods: vec![DaemonPod { phase: PodPhase::Failed, ..dpod("pa", "a", &h, false) }],
            create: vec![],
            delete: vec!["pa"],
        },
        Case {
            what: "a stopping pod holds its node",
            nodes: vec![node("a", true, true)],
            pods: vec![DaemonPod { deleting: true, ..dpod("pa", "a", "old", true) }],
            create: vec![],
            delete: vec![],
        },
        Case {
            what: "two on one node: the current revision stays",
            nodes: vec![node("a", true, true)],
            pods: vec![dpod("p1", "a", "old", true), dpod("p2", "a", &h, false)],
            create: vec![],
            delete: vec!["p1"],
        },
        Case {
            what: "two of one revision: the ready one stays",
            nodes: vec![node("a", true, true)],
            pods: vec![dpod("p1", "a", &h, false), dpod("p2", "a", &h, true)],
            create: vec![],
            delete: vec!["p1"],
        },
    ];
    for c in cases {
        let plan = reconcile(&ds, &c.nodes, &c.pods, 10);
        assert_eq!(plan.create, c.create.iter().map(|s| s.to_string()).collect::<Vec<_>>(), "{}", c.what);
        assert_eq!(plan.delete, c.delete.iter().map(|s| s.to_string()).collect::<Vec<_>>(), "{}", c.what);
    }
    let plan = reconcile(&ds, &[node("a", true, true), node("b", true, true)], &[dpod("pz", "z", &h, true)], 10);
    let s = &plan.status;
    assert_eq!(
        (s.desired_number_scheduled, s.current_number_scheduled, s.number_misscheduled, s.number_unavailable),
        (2, 0, 1, 2)
    );
}

#[test]
fn rolling_updates_go_node_by_node_within_max_unavailable() {
    for (max, limit) in [(IntOrPercent::Int(1), 1), (IntOrPercent::Int(2), 2), (IntOrPercent::Percent(40), 2)] {
        let mut ds = ptp();
        ds.spec.update_strategy.rolling_update = Some(DaemonSetRollingUpdate { max_unavailable: Some(max) });
        let old = template_hash(&ds.spec.template);
        let nodes: Vec<ObservedNode> = (0..5).map(|i| node(&format!("n{i}"), true, true)).collect();
        let mut pods: Vec<DaemonPod> =
            nodes.iter().map(|n| dpod(&format!("old-{}", n.name), &n.name, &old, true)).collect();
        ds.spec.template.spec.containers[0].command.push("v2".into());
        let new = template_hash(&ds.spec.template);
        let mut now = 10;
        let mut done = false;
        for _ in 0..100 {
            now += 1;
            let plan = reconcile(&ds, &nodes, &pods, now);
            for name in &plan.delete {
                pods.iter_mut().filter(|p| &p.name == name).for_each(|p| p.deleting = true);
            }
            for n in &plan.create {
                assert!(pods.iter().all(|p| &p.node != n), "{max:?}: a new pod only once the old is gone");
                pods.push(DaemonPod { created: now, ..dpod(&pod_name("ptp", n, &new), n, &new, false) });
            }
            let available = nodes
                .iter()
                .filter(|n| pods.iter().any(|p| p.node == n.name && !p.deleting && p.ready_since.is_some()))
                .count();
            assert!(5 - available <= limit, "{max:?}: {} nodes unavailable, at most {limit}", 5 - available);
            if pods.len() == 5 && pods.iter().all(|p| p.template_hash == new && p.ready_since.is_some()) {
                assert_eq!(plan.status.updated_number_scheduled, 5);
                done = true;
                break;
            }
            // The world: stopped pods go, started pods become ready.
            pods.retain(|p| !p.deleting);
            pods.iter_mut().filter(|p| p.created < now).for_each(|p| p.ready_since = p.ready_since.or(Some(now)));
        }
        assert!(done, "{max:?}: the update ends");
    }
}

#[test]
fn on_delete_waits_for_someone_to_delete() {
    let mut ds = ptp();
    ds.spec.update_strategy.kind = DaemonSetStrategyType::OnDelete;
    let old = template_hash(&ds.spec.template);
    ds.spec.template.spec.containers[0].command.push("v2".into());
    let nodes = [node("a", true, true), node("b", true, true)];
    let pods = vec![dpod("pa", "a", &old, true), dpod("pb", "b", &old, true)];
    let plan = reconcile(&ds, &nodes, &pods, 10);
    assert_eq!((plan.create.len(), plan.delete.len(), plan.status.updated_number_scheduled), (0, 0, 0));
    let plan = reconcile(&ds, &nodes, &pods[1..], 10);
    assert_eq!(plan.create, vec!["a".to_string()]);
}

#[test]
fn min_ready_seconds_delay_available() {
    let mut ds = ptp();
    ds.spec.min_ready_seconds = 20;
    let h = template_hash(&ds.spec.template);
    let pods = vec![DaemonPod { ready_since: Some(100), ..dpod("pa", "a", &h, true) }];
    let plan = reconcile(&ds, &[node("a", true, true)], &pods, 110);
    assert_eq!((plan.status.number_ready, plan.status.number_available, plan.requeue_at), (1, 0, Some(120)));
}

/// What the reconcile recorded: the DaemonSet with its plan's status, as
/// the controller writes it.
fn observed(mut ds: DaemonSet) -> DaemonSet {
    let plan = reconcile(&ds, &[node("a", true, true)], &[], 10);
    ds.status = Some(plan.status);
    ds
}

fn with_command(ds: &DaemonSet, word: &str) -> PodTemplate {
    let mut t = ds.spec.template.clone();
    t.spec.containers[0].command = vec!["sleep".into(), word.into()];
    t
}

#[test]
fn revisions_are_kept_undone_and_restarted_as_a_deployments() {
    let numbers = |d: &DaemonSet| d.status.as_ref().map(|s| (s.history.iter().map(|r| r.number).collect(), s.revision));
    let mut ds = observed(ptp());
    assert_eq!(numbers(&ds), Some((vec![1], 1)));
    assert_eq!(undo(&ds, None), Err(RolloutError::NoPrevious { kind: "daemonset", name: "ptp".into() }));
    let v1 = ds.spec.template.clone();
    // The same template again is no new revision.
    ds = observed(ds);
    assert_eq!(numbers(&ds), Some((vec![1], 1)));
    ds.spec.template = with_command(&ds, "2");
    ds = observed(ds);
    let v2 = ds.spec.template.clone();
    ds.spec.template = with_command(&ds, "3");
    ds = observed(ds);
    assert_eq!(numbers(&ds), Some((vec![1, 2, 3], 3)));
    assert_eq!(undo(&ds, None), Ok(v2.clone()));
    assert_eq!(undo(&ds, Some(3)), Err(RolloutError::AlreadyCurrent(3)));
    assert_eq!(
        undo(&ds, Some(9)).map_err(|e| e.to_string()),
        Err("daemonset ptp has no revision 9 (kept: 1, 2, 3)".to_string())
    );
    // Undo to 1: its template becomes revision 4, and the nodes roll to it.
    ds.spec.template = undo(&ds, Some(1)).expect("revision 1 is kept");
    ds = observed(ds);
    assert_eq!(numbers(&ds), Some((vec![2, 3, 4], 4)));
    let plan = reconcile(&ds, &[node("a", true, true)], &[dpod("old", "a", &template_hash(&v2), true)], 10);
    assert_eq!(plan.delete, ["old"], "the node's pod of another revision is replaced");
    assert_eq!(plan.status.template_hash, template_hash(&v1));
    // A restart: a new revision whose only change is the annotation.
    ds.spec.template = crate::deployment::restart(&ds.spec.template, "2026-11-29T07:00:00Z");
    ds = observed(ds);
    assert_eq!(numbers(&ds), Some((vec![2, 3, 4, 5], 5)));
    // revisionHistoryLimit: 1 keeps the current and one older.
    ds.spec.revision_history_limit = Some(1);
    ds.spec.template = with_command(&ds, "6");
    ds = observed(ds);
    assert_eq!(numbers(&ds), Some((vec![5, 6], 6)));
}
