use super::*;
use crate::deployment::{template_hash, IntOrPercent, RollingUpdate};
use crate::node_lost::{self, LostVerdict, NodeCondition, ReplaceAfter};

fn deployment(replicas: u32, unavailable: IntOrPercent, surge: IntOrPercent) -> Deployment {
    let mut d = crate::deployment::tests::upf();
    d.spec.replicas = replicas;
    d.spec.strategy.rolling_update = Some(RollingUpdate { max_unavailable: Some(unavailable), max_surge: Some(surge) });
    d
}

fn set_command(d: &mut Deployment, word: &str) {
    d.spec.template.spec.containers[0].command = vec!["sleep".into(), word.into()];
}

fn pod(name: &str, hash: &str, created: u64, ready_since: Option<u64>) -> ObservedPod {
    ObservedPod {
        name: name.into(),
        template_hash: hash.into(),
        phase: PodPhase::Running,
        created,
        ready_since,
        node: Some("n1".into()),
        ..Default::default()
    }
}

/// A world of pods the tests drive: plans applied, pods made ready or gone.
struct World {
    d: Deployment,
    pods: Vec<ObservedPod>,
    now: u64,
    made: u64,
}

impl World {
    /// `replicas` ready pods of `d`'s template, recorded as its revision 1.
    fn steady(d: Deployment) -> World {
        let hash = template_hash(&d.spec.template);
        let pods = (0..d.spec.replicas).map(|i| pod(&format!("old{i}"), &hash, 0, Some(0))).collect();
        let mut w = World { d, pods, now: 100, made: 0 };
        let plan = w.step();
        assert_eq!((plan.create, plan.delete.len()), (0, 0), "a steady world is left alone");
        w
    }

    fn step(&mut self) -> DeploymentPlan {
        let plan = reconcile(&self.d, &self.pods, self.now);
        for name in &plan.delete {
            let p = self.pods.iter_mut().find(|p| &p.name == name).expect("deletes a pod it was shown");
            assert!(!p.deleting, "{name} deleted twice");
            p.deleting = true;
        }
        for _ in 0..plan.create {
            self.made += 1;
            let mut p = pod(&format!("new{}", self.made), &plan.status.template_hash, self.now, None);
            p.node = Some("n2".into());
            self.pods.push(p);
        }
        self.d.status = Some(plan.status.clone());
        plan
    }

    fn count(&self, f: impl Fn(&ObservedPod) -> bool) -> u32 {
        self.pods.iter().filter(|p| f(p)).count() as u32
    }

    fn available(&self) -> u32 {
        let min_ready = u64::from(self.d.spec.min_ready_seconds);
        self.count(|p| p.available(self.now, min_ready) && p.standing != NodeStanding::Lost)
    }
}

/// A small deterministic generator, so a failing sequence can be replayed.
struct Lcg(u64);
impl Lcg {
    fn next(&mut self, n: usize) -> usize {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((self.0 >> 33) % n as u64) as usize
    }
}

#[test]
fn rolling_updates_keep_their_bounds_for_every_pair() {
    use IntOrPercent::{Int, Percent};
    let pairs = [
        (Int(0), Int(1)),
        (Int(1), Int(0)),
        (Percent(25), Percent(25)),
        (Int(0), Percent(100)),
        (Int(1), Int(1)),
        (Int(2), Int(0)),
        (Int(0), Int(3)),
        (Percent(100), Int(0)),
        (Percent(50), Percent(50)),
    ];
    for (unavailable, surge) in pairs {
        for replicas in [1, 3, 4, 10] {
            for (seed, min_ready) in [(0, 0), (1, 0), (2, 5), (3, 5)] {
                let what = format!(
                    "maxUnavailable {unavailable:?} maxSurge {surge:?} replicas {replicas} minReady {min_ready} seed {seed}"
                );
                let mut d = deployment(replicas, unavailable, surge);
                d.spec.min_ready_seconds = min_ready;
                let mut w = World::steady(d);
                let (s, u) = budget(&w.d);
                set_command(&mut w.d, "2");
                let new_hash = template_hash(&w.d.spec.template);
                let mut rng = Lcg(seed);
                let mut done = false;
                for _ in 0..1000 {
                    w.now += 1;
                    w.step();
                    let total = w.count(|p| !p.phase.is_terminal());
                    assert!(total <= replicas + s, "{what}: {total} pods, at most {}", replicas + s);
                    let avail = w.available();
                    let least = replicas.saturating_sub(u);
                    assert!(avail >= least, "{what}: {avail} available, at least {least}");
                    if w.pods.iter().all(|p| p.template_hash == new_hash && !p.deleting)
                        && total == replicas
                        && avail == replicas
                    {
                        let again = w.step();
                        assert_eq!((again.create, again.delete.len()), (0, 0), "{what}: done is done");
                        let c = again.status.condition(ConditionType::Progressing).map(|c| c.reason.clone());
                        assert_eq!(c.as_deref(), Some(reason::NEW_REVISION_AVAILABLE), "{what}");
                        assert_eq!(again.status.updated_replicas, replicas, "{what}");
                        done = true;
                        break;
                    }
                    // The world moves one thing: a deleted pod goes, or a new pod becomes ready.
                    let movable: Vec<usize> =
                        (0..w.pods.len()).filter(|i| w.pods[*i].deleting || w.pods[*i].ready_since.is_none()).collect();
                    if let Some(&i) = movable.get(rng.next(movable.len().max(1))) {
                        if w.pods[i].deleting {
                            w.pods.remove(i);
                        } else {
                            w.pods[i].ready_since = Some(w.now);
                        }
                    }
                }
                assert!(done, "{what}: the rollout ends");
            }
        }
    }
}

#[test]
fn scale_up_down_and_ended_pods() {
    struct Case {
        what: &'static str,
        replicas: u32,
        pods: Vec<ObservedPod>,
        create: u32,
        delete: Vec<&'static str>,
    }
    let d = deployment(3, IntOrPercent::Int(1), IntOrPercent::Int(1));
    let h = template_hash(&d.spec.template);
    let ready = |name: &str, created| pod(name, &h, created, Some(created));
    let cases = vec![
        Case { what: "from nothing", replicas: 3, pods: vec![], create: 3, delete: vec![] },
        Case {
            what: "scale up",
            replicas: 5,
            pods: vec![ready("a", 1), ready("b", 2), ready("c", 3)],
            create: 2,
            delete: vec![],
        },
        Case {
            what: "scale down: not ready first, then the newest",
            replicas: 2,
            pods: vec![ready("a", 1), ready("b", 5), pod("c", &h, 3, None), ready("d", 2)],
            create: 0,
            delete: vec!["c", "b"],
        },
        Case {
            what: "scale to zero",
            replicas: 0,
            pods: vec![ready("a", 1), ready("b", 2)],
            create: 0,
            delete: vec!["b", "a"],
        },
        Case {
            what: "an ended pod goes and is replaced at once",
            replicas: 2,
            pods: vec![ready("a", 1), ObservedPod { phase: PodPhase::Failed, ..ready("b", 2) }],
            create: 1,
            delete: vec!["b"],
        },
        Case {
            what: "a stopping pod still holds its place",
            replicas: 2,
            pods: vec![ready("a", 1), ObservedPod { deleting: true, ..ready("b", 2) }],
            create: 1,
            delete: vec![],
        },
        Case {
            what: "unplaced before placed, pending before running",
            replicas: 1,
            pods: vec![
                ready("a", 1),
                ObservedPod { node: None, phase: PodPhase::Pending, ..pod("b", &h, 2, None) },
                ObservedPod { phase: PodPhase::Pending, ..pod("c", &h, 3, None) },
            ],
            create: 0,
            delete: vec!["b", "c"],
        },
    ];
    for c in cases {
        let mut d = d.clone();
        d.spec.replicas = c.replicas;
        let plan = reconcile(&d, &c.pods, 100);
        assert_eq!(
            (plan.create, plan.delete.clone()),
            (c.create, c.delete.iter().map(|s| s.to_string()).collect()),
            "{}",
            c.what
        );
    }
}

#[test]
fn recreate_stops_all_old_before_any_new() {
    let mut d = crate::deployment::tests::upf();
    d.spec.strategy.kind = StrategyType::Recreate;
    let mut w = World::steady(d);
    set_command(&mut w.d, "2");
    w.now += 1;
    let plan = w.step();
    assert_eq!((plan.create, plan.delete.len()), (0, 3), "every old pod goes, nothing new yet");
    let plan = w.step();
    assert_eq!((plan.create, plan.delete.len()), (0, 0), "waits while old pods stop");
    w.pods.remove(0);
    w.pods.remove(0);
    assert_eq!(w.step().create, 0, "one old pod is still stopping");
    w.pods.clear();
    let plan = w.step();
    assert_eq!(plan.create, 3);
    assert_eq!(plan.status.updated_replicas, 0, "made, not yet seen");
}

#[test]
fn min_ready_seconds_make_available_later() {
    let mut d = crate::deployment::tests::upf();
    d.spec.min_ready_seconds = 30;
    let h = template_hash(&d.spec.template);
    let pods = vec![pod("a", &h, 0, Some(100)), pod("b", &h, 0, Some(90)), pod("c", &h, 0, None)];
    let plan = reconcile(&d, &pods, 110);
    assert_eq!((plan.status.ready_replicas, plan.status.available_replicas), (2, 0));
    assert_eq!(plan.requeue_at, Some(120), "b becomes available at 120");
    let plan = reconcile(&d, &pods, 130);
    assert_eq!(plan.status.available_replicas, 2);
    let avail = plan.status.condition(ConditionType::Available).map(|c| c.status);
    assert_eq!(avail, Some(ConditionStatus::False), "2 of 3, and 25% of 3 rounds down to 0 unavailable");
}

#[test]
fn a_stuck_rollout_stops_at_its_deadline_and_undo_brings_it_back() {
    let mut d = deployment(2, IntOrPercent::Int(0), IntOrPercent::Int(1));
    d.spec.progress_deadline_seconds = Some(600);
    let mut w = World::steady(d);
    let v1 = w.d.spec.template.clone();
    set_command(&mut w.d, "broken");
    w.now = 1000;
    let plan = w.step();
    assert_eq!((plan.create, plan.delete.len()), (1, 0), "one surge pod");
    let progressing = |p: &DeploymentPlan| {
        p.status.condition(ConditionType::Progressing).map(|c| (c.status, c.reason.clone(), c.last_update_time))
    };
    assert_eq!(progressing(&plan), Some((ConditionStatus::True, reason::NEW_REVISION_CREATED.into(), 1000)));
    assert_eq!(plan.requeue_at, Some(1600));
    // The next look sees the new pod: progress, the clock starts again.
    w.now = 1001;
    let plan = w.step();
    assert_eq!(progressing(&plan), Some((ConditionStatus::True, reason::REVISION_UPDATED.into(), 1001)));
    // The new pod never becomes ready.
    w.now = 1600;
    let plan = w.step();
    assert_eq!((plan.create, plan.delete.len()), (0, 0));
    assert_eq!(progressing(&plan).map(|p| (p.0, p.2)), Some((ConditionStatus::True, 1001)), "not yet");
    assert_eq!(plan.requeue_at, Some(1601));
    w.now = 1601;
    let plan = w.step();
    assert_eq!(progressing(&plan), Some((ConditionStatus::False, reason::PROGRESS_DEADLINE_EXCEEDED.into(), 1601)));
    assert_eq!(plan.requeue_at, None);
    // Stopped: the bad pod dies and is not made again beyond the count; the old pods stay.
    w.pods.retain(|p| p.ready_since.is_some());
    w.now = 2000;
    let plan = w.step();
    assert_eq!((plan.create, plan.delete.len()), (0, 0), "holds: {plan:?}");
    assert_eq!(progressing(&plan).map(|p| p.1), Some(reason::PROGRESS_DEADLINE_EXCEEDED.to_string()));
    // Stopped with a pod lost: only that one is made again.
    let gone = w.pods.remove(0);
    let plan = w.step();
    assert_eq!((plan.create, plan.delete.len()), (1, 0), "{plan:?} {:?}", w.pods);
    w.pods.push(ObservedPod { ready_since: Some(w.now), ..gone });
    w.pods.retain(|p| p.ready_since.is_some());
    // Undo: revision 1's template comes back as revision 3, and its pods are current again.
    w.d.spec.template = crate::deployment::undo(&w.d, None).expect("revision 1 is kept");
    assert_eq!(w.d.spec.template, v1);
    w.now = 2100;
    let plan = w.step();
    assert_eq!((plan.status.revision, plan.status.updated_replicas), (3, 2));
    assert_eq!(progressing(&plan).map(|p| p.0), Some(ConditionStatus::True));
    let plan = w.step();
    assert_eq!(progressing(&plan).map(|p| p.1), Some(reason::NEW_REVISION_AVAILABLE.to_string()));
    assert_eq!((plan.create, plan.delete.len()), (0, 0));
}

#[test]
fn a_finished_rollout_is_not_timed_again() {
    let mut w = World::steady(crate::deployment::tests::upf());
    w.now = 1_000_000;
    w.pods[0].ready_since = None;
    let plan = w.step();
    let c = plan.status.condition(ConditionType::Progressing).map(|c| c.reason.clone());
    assert_eq!(c.as_deref(), Some(reason::NEW_REVISION_AVAILABLE));
    assert_eq!(plan.status.available_replicas, 2);
}

#[test]
fn paused_holds_the_current_revision() {
    let mut w = World::steady(crate::deployment::tests::upf());
    w.d.spec.paused = true;
    set_command(&mut w.d, "2");
    let plan = w.step();
    assert_eq!((plan.create, plan.delete.len(), plan.status.revision), (0, 0, 1));
    let c = plan.status.condition(ConditionType::Progressing).map(|c| (c.status, c.reason.clone()));
    assert_eq!(c, Some((ConditionStatus::Unknown, reason::PAUSED.into())));
    // Scaling still works, with the current revision's template.
    w.d.spec.replicas = 4;
    let plan = w.step();
    assert_eq!(plan.create, 1);
    assert_eq!(plan.revision().map(|r| r.template_hash.clone()), Some(w.pods[0].template_hash.clone()));
    let made = plan.new_pods(&w.d, [7]);
    assert_eq!(made.len(), 1);
    assert_eq!(crate::deployment::pod_template_hash(&made[0]), Some(w.pods[0].template_hash.as_str()));
    w.d.spec.replicas = 2;
    let plan = w.step();
    assert_eq!((plan.create, plan.delete.len()), (0, 2), "the not-ready new pod and one old pod go");
}

/// The node-lost timer and the node's return, through the caller's steps:
/// `node_lost::verdict` for each pod's node, `standing`, then `reconcile`.
#[test]
fn a_lost_nodes_pods_are_replaced_after_their_time_and_one_duplicate_goes() {
    struct Case {
        what: &'static str,
        setting: Option<ReplaceAfter>,
        replacement_ready: bool,
        returned_ready: bool,
        stop: &'static str,
    }
    let cases = [
        Case {
            what: "both ready: the returning node's pod stops",
            setting: Some(ReplaceAfter::Seconds(60)),
            replacement_ready: true,
            returned_ready: true,
            stop: "c",
        },
        Case {
            what: "replacement not ready yet: it stops",
            setting: Some(ReplaceAfter::Seconds(60)),
            replacement_ready: false,
            returned_ready: true,
            stop: "new1",
        },
        Case {
            what: "neither ready: the returning node's pod stops, never both",
            setting: Some(ReplaceAfter::Seconds(0)),
            replacement_ready: false,
            returned_ready: false,
            stop: "c",
        },
        Case {
            what: "the returning pod not ready: it stops",
            setting: None,
            replacement_ready: true,
            returned_ready: false,
            stop: "c",
        },
    ];
    for c in cases {
        let mut d = crate::deployment::tests::upf();
        d.spec.template.spec.node_lost_replace_after_seconds = c.setting;
        let after = match c.setting {
            Some(ReplaceAfter::Seconds(s)) => s,
            _ => node_lost::DEFAULT_REPLACE_AFTER_SECONDS,
        };
        let mut w = World::steady(d);
        for (p, n) in w.pods.iter_mut().zip(["a", "b", "c"]) {
            p.node = Some(n.into());
            p.name = n.into();
        }
        let lost_since = 1000;
        let mut marked = false;
        let mut observe = |w: &mut World, node_c: NodeCondition| {
            let v = node_lost::verdict(
                w.d.spec.template.spec.node_lost_replace_after_seconds,
                ReplaceAfter::Seconds(node_lost::DEFAULT_REPLACE_AFTER_SECONDS),
                node_c,
                w.now,
            );
            marked |= v == LostVerdict::Replace;
            if let Some(p) = w.pods.iter_mut().find(|p| p.name == "c") {
                p.standing = node_lost::standing(v, marked);
            }
            v
        };
        let down = NodeCondition::NotReady { since: lost_since };
        w.now = lost_since + after - 1;
        assert_eq!(observe(&mut w, down), LostVerdict::ReplaceAt(lost_since + after), "{}", c.what);
        let plan = w.step();
        assert_eq!(plan.create, 0, "{}: not before its time", c.what);
        assert_eq!(plan.requeue_at, None, "{}", c.what);
        w.now = lost_since + after;
        assert_eq!(observe(&mut w, down), LostVerdict::Replace, "{}", c.what);
        let plan = w.step();
        assert_eq!((plan.create, plan.delete.len()), (1, 0), "{}: replaced, the lost pod left alone", c.what);
        assert_eq!(plan.status.replicas, 2, "{}: the lost pod is not counted", c.what);
        if c.replacement_ready {
            w.pods.iter_mut().filter(|p| p.name == "new1").for_each(|p| p.ready_since = Some(w.now));
        }
        w.now += 100;
        let plan = w.step();
        assert_eq!((plan.create, plan.delete.len()), (0, 0), "{}: nothing more while lost", c.what);
        // The node is back.
        if !c.returned_ready {
            w.pods.iter_mut().filter(|p| p.name == "c").for_each(|p| p.ready_since = None);
        }
        observe(&mut w, NodeCondition::Ready);
        let plan = w.step();
        assert_eq!(plan.delete, vec![c.stop.to_string()], "{}", c.what);
        assert_eq!(plan.create, 0, "{}", c.what);
        w.pods.retain(|p| !p.deleting);
        assert_eq!(w.pods.len(), 3, "{}: exactly the replicas left", c.what);
    }
}

#[test]
fn never_is_never_replaced() {
    let mut d = crate::deployment::tests::upf();
    d.spec.template.spec.node_lost_replace_after_seconds = Some(ReplaceAfter::Never);
    let v = node_lost::verdict(
        d.spec.template.spec.node_lost_replace_after_seconds,
        ReplaceAfter::Seconds(300),
        NodeCondition::NotReady { since: 0 },
        1_000_000,
    );
    assert_eq!(node_lost::standing(v, false), NodeStanding::Present);
    let h = template_hash(&d.spec.template);
    let pods: Vec<ObservedPod> = (0..3).map(|i| pod(&format!("p{i}"), &h, 0, Some(0))).collect();
    assert_eq!(reconcile(&d, &pods, 1_000_000).create, 0);
}

#[test]
fn deletion_order_table() {
    let base = pod("x", "h", 10, Some(20));
    let cases: Vec<(&str, ObservedPod, ObservedPod)> = vec![
        ("unplaced first", ObservedPod { node: None, ..base.clone() }, base.clone()),
        ("pending before running", ObservedPod { phase: PodPhase::Pending, ..base.clone() }, base.clone()),
        ("unknown before running", ObservedPod { phase: PodPhase::Unknown, ..base.clone() }, base.clone()),
        ("not ready before ready", ObservedPod { ready_since: None, ..base.clone() }, base.clone()),
        (
            "returned before other ready",
            ObservedPod { standing: NodeStanding::Returned, ready_since: Some(1), ..base.clone() },
            base.clone(),
        ),
        (
            "not ready before returned ready",
            ObservedPod { ready_since: None, ..base.clone() },
            ObservedPod { standing: NodeStanding::Returned, ..base.clone() },
        ),
        ("ready less long first", ObservedPod { ready_since: Some(30), ..base.clone() }, base.clone()),
        ("newer first", ObservedPod { created: 11, ..base.clone() }, base.clone()),
    ];
    for (what, first, second) in cases {
        let first = ObservedPod { name: "first".into(), ..first };
        let second = ObservedPod { name: "second".into(), ..second };
        for mut pair in [vec![&first, &second], vec![&second, &first]] {
            deletion_order(&mut pair);
            assert_eq!(pair[0].name, "first", "{what}");
        }
    }
}

#[test]
fn a_pod_says_its_revision_phase_and_node() {
    let d = crate::deployment::tests::upf();
    let (history, i) = crate::deployment::next_history(&d);
    let mut p = crate::deployment::new_pod(&d, &history[i], 1);
    p.spec.node_name = Some("n4".into());
    p.status = Some(crate::status::PodStatus { phase: PodPhase::Running, ..Default::default() });
    let o = ObservedPod::of(&p);
    assert_eq!(
        (o.template_hash.as_str(), o.phase, o.node.as_deref(), o.ready_since, o.deleting),
        (history[i].template_hash.as_str(), PodPhase::Running, Some("n4"), None, false)
    );
}

#[test]
fn an_unchecked_budget_does_not_overflow() {
    let mut d = deployment(crate::limits::MAX_REPLICAS, IntOrPercent::Int(0), IntOrPercent::Int(u32::MAX));
    d.spec.replicas = u32::MAX;
    let plan = reconcile(&d, &[], 0);
    assert_eq!(plan.create, crate::limits::MAX_REPLICAS, "held to the bound");
}

#[test]
fn a_returning_pod_of_an_older_revision_goes_as_an_old_pod() {
    let d = crate::deployment::tests::upf();
    let h = template_hash(&d.spec.template);
    let pods = vec![
        pod("a", &h, 1, Some(1)),
        pod("b", &h, 1, Some(1)),
        pod("new1", &h, 50, Some(60)),
        ObservedPod { standing: NodeStanding::Returned, ..pod("c", "older", 1, Some(1)) },
    ];
    let plan = reconcile(&d, &pods, 100);
    assert_eq!((plan.create, plan.delete.clone()), (0, vec!["c".to_string()]));
}
