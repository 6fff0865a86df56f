//! A node gone silent: when a Deployment's pod on it is replaced elsewhere,
//! and what its pod is to the Deployment when the node comes back.
//!
//! The pod keeps running on its node all along (the node is autonomous); the
//! controller only stops counting it once the node has been NotReady for the
//! pod's `nodeLostReplaceAfterSeconds` (the cluster's default when unset),
//! so the Deployment's reconcile makes a replacement. The caller marks such
//! a pod with `REPLACED_ANNOTATION` in the same write, so that when the node
//! returns the pod is known as the duplicate (`NodeStanding::Returned`) and
//! the reconcile stops one of the two (see `rollout::deletion_order` for
//! which). A DaemonSet's pod is never replaced elsewhere: this module is not
//! asked about it.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Kubernetes' eviction default (`tolerationSeconds` 300 for `not-ready`).
pub const DEFAULT_REPLACE_AFTER_SECONDS: u64 = 300;

/// Annotation the controller sets on a pod it replaced because its node was
/// lost (value: the `now` of that decision, in seconds).
pub const REPLACED_ANNOTATION: &str = "pinion.io/replaced-after-node-lost";

/// `spec.template.spec.nodeLostReplaceAfterSeconds`: a number of seconds, or
/// the word `never` for a workload that must not run twice (a UPF holding a
/// session state, a radio unit's DU). One field rather than a number and a
/// flag, so that no manifest can say both "after 60 s" and "never".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplaceAfter {
    Seconds(u64),
    Never,
}

impl Serialize for ReplaceAfter {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            ReplaceAfter::Seconds(n) => s.serialize_u64(*n),
            ReplaceAfter::Never => s.serialize_str("never"),
        }
    }
}

impl<'de> Deserialize<'de> for ReplaceAfter {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = ReplaceAfter;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a whole number of seconds or \"never\"")
            }
            fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<ReplaceAfter, E> {
                Ok(ReplaceAfter::Seconds(n))
            }
            fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<ReplaceAfter, E> {
                u64::try_from(n).map(ReplaceAfter::Seconds).map_err(|_| E::custom("seconds must not be negative"))
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<ReplaceAfter, E> {
                match s {
                    "never" => Ok(ReplaceAfter::Never),
                    _ => Err(E::custom(format!("{s:?}: want a whole number of seconds or \"never\""))),
                }
            }
        }
        d.deserialize_any(V)
    }
}

/// A node as the controller last heard of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeCondition {
    Ready,
    /// Silent (or reporting NotReady) since this time, unix seconds.
    NotReady {
        since: u64,
    },
}

/// What to do about one pod on a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LostVerdict {
    /// The node is Ready.
    Keep,
    /// The node is NotReady; replace the pod at this time unless it is back.
    ReplaceAt(u64),
    /// The node has been NotReady long enough: stop counting the pod, mark
    /// it `REPLACED_ANNOTATION`, and let the Deployment make another.
    Replace,
    /// The node is NotReady and the workload says `never`: wait for it.
    Never,
}

/// The verdict for a pod whose template says `setting`, on a node in
/// `node`'s condition, at `now`; `default` is the cluster's setting.
pub fn verdict(setting: Option<ReplaceAfter>, default: ReplaceAfter, node: NodeCondition, now: u64) -> LostVerdict {
    let NodeCondition::NotReady { since } = node else {
        return LostVerdict::Keep;
    };
    match setting.unwrap_or(default) {
        ReplaceAfter::Never => LostVerdict::Never,
        ReplaceAfter::Seconds(after) => {
            let at = since.saturating_add(after);
            if now >= at {
                LostVerdict::Replace
            } else {
                LostVerdict::ReplaceAt(at)
            }
        }
    }
}

/// What a pod's node means for the Deployment that owns it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum NodeStanding {
    /// On a node that is Ready, or NotReady within its time: counted.
    #[default]
    Present,
    /// Replaced: its node has been NotReady past its time. Not counted at
    /// all, neither as a pod nor as available.
    Lost,
    /// Was replaced, and its node is back: counted again, and the first to
    /// go among ready pods when the Deployment has one too many.
    Returned,
}

/// A pod's standing from its node's verdict and whether it was marked
/// replaced earlier.
pub fn standing(verdict: LostVerdict, marked_replaced: bool) -> NodeStanding {
    match (verdict, marked_replaced) {
        (LostVerdict::Replace, _) => NodeStanding::Lost,
        // Marked, and its node not (or no longer) past its time: the node is
        // back, or came back and went again; either way the pod is counted
        // and its replacement exists.
        (_, true) => NodeStanding::Returned,
        _ => NodeStanding::Present,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_timer_table() {
        use LostVerdict::{Keep, Replace, ReplaceAt};
        use ReplaceAfter::Seconds;
        let lost = |since| NodeCondition::NotReady { since };
        let cases: Vec<(&str, Option<ReplaceAfter>, NodeCondition, u64, LostVerdict)> = vec![
            ("ready node", None, NodeCondition::Ready, 10_000, Keep),
            ("default, just lost", None, lost(1000), 1000, ReplaceAt(1300)),
            ("default, one second short", None, lost(1000), 1299, ReplaceAt(1300)),
            ("default, on time", None, lost(1000), 1300, Replace),
            ("default, late", None, lost(1000), 5000, Replace),
            ("own 30 s, not yet", Some(Seconds(30)), lost(1000), 1029, ReplaceAt(1030)),
            ("own 30 s", Some(Seconds(30)), lost(1000), 1030, Replace),
            ("zero: at once", Some(Seconds(0)), lost(1000), 1000, Replace),
            ("never", Some(ReplaceAfter::Never), lost(1000), u64::MAX, LostVerdict::Never),
            ("never on a ready node", Some(ReplaceAfter::Never), NodeCondition::Ready, 0, Keep),
            ("no overflow", Some(Seconds(u64::MAX)), lost(5), 10, ReplaceAt(u64::MAX)),
        ];
        for (what, setting, node, now, want) in cases {
            assert_eq!(verdict(setting, Seconds(DEFAULT_REPLACE_AFTER_SECONDS), node, now), want, "{what}");
        }
        assert_eq!(
            verdict(None, ReplaceAfter::Never, lost(0), 1_000_000),
            LostVerdict::Never,
            "a cluster default of never"
        );
    }

    #[test]
    fn standing_table() {
        use LostVerdict::*;
        let cases = [
            (Keep, false, NodeStanding::Present),
            (ReplaceAt(5), false, NodeStanding::Present),
            (Replace, false, NodeStanding::Lost),
            (Replace, true, NodeStanding::Lost),
            (Keep, true, NodeStanding::Returned),
            (ReplaceAt(5), true, NodeStanding::Returned),
            (Never, false, NodeStanding::Present),
        ];
        for (v, marked, want) in cases {
            assert_eq!(standing(v, marked), want, "{v:?} marked {marked}");
        }
    }

    #[test]
    fn reads_seconds_or_never() {
        let read = |s: &str| serde_yaml_ng::from_str::<ReplaceAfter>(s).map_err(|e| e.to_string());
        assert_eq!(read("60"), Ok(ReplaceAfter::Seconds(60)));
        assert_eq!(read("never"), Ok(ReplaceAfter::Never));
        assert!(read("-1").is_err());
        assert!(read("soon").is_err());
        assert!(read("1.5").is_err());
        assert_eq!(serde_json::to_string(&ReplaceAfter::Never).ok().as_deref(), Some("\"never\""));
        assert_eq!(serde_json::to_string(&ReplaceAfter::Seconds(9)).ok().as_deref(), Some("9"));
    }
}
