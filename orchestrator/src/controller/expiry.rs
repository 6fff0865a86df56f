//! When finished pods go: each finished pod's removal time, by name and
//! incarnation (uid), so that a deleted pod's timer goes with it and a new
//! pod of the same name is never removed by an old one's.

use std::collections::{BTreeSet, HashMap};

use tokio::time::Instant;

use super::effect::Effect;

#[derive(Debug, Default)]
pub(super) struct Expiry {
    /// (when, name, uid), soonest first.
    at: BTreeSet<(Instant, String, String)>,
    /// Name -> its entry in `at`.
    of: HashMap<String, (Instant, String)>,
}

impl Expiry {
    /// The finished pod `name` (incarnation `uid`) goes at `at`; a timer
    /// set before for that name is replaced.
    pub(super) fn set(&mut self, at: Instant, name: &str, uid: String) {
        if let Some((old_at, old_uid)) = self.of.insert(name.to_string(), (at, uid.clone())) {
            self.at.remove(&(old_at, name.to_string(), old_uid));
        }
        self.at.insert((at, name.to_string(), uid));
    }

    /// The pod is gone: its timer with it.
    pub(super) fn forget(&mut self, name: &str) {
        if let Some((at, uid)) = self.of.remove(name) {
            self.at.remove(&(at, name.to_string(), uid));
        }
    }

    /// The removals due at `now`, taken off the timers.
    pub(super) fn due(&mut self, now: Instant) -> Vec<Effect> {
        let mut out = Vec::new();
        while self.at.first().is_some_and(|first| first.0 <= now) {
            if let Some((_, pod, uid)) = self.at.pop_first() {
                self.of.remove(&pod);
                out.push(Effect::RemoveFinished { pod, uid });
            }
        }
        out
    }

    /// When the next removal is due.
    pub(super) fn next(&self) -> Option<Instant> {
        self.at.first().map(|(at, _, _)| *at)
    }
}
