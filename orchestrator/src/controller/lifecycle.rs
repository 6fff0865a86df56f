//! Node lifecycle's decider: which Ready nodes fell silent. The write that
//! carries it out (NotReady, its pods Unknown) is `cluster::nodes::mark_lost`.

use std::time::Duration;

use tokio::time::Instant;

use super::effect::Effect;
use super::state::State;

/// The Ready nodes whose last heartbeat is older than `grace` at `now`.
pub(super) fn silent_nodes<'a>(
    seen: impl Iterator<Item = (&'a str, bool, Instant)>,
    now: Instant,
    grace: Duration,
) -> Vec<String> {
    seen.filter(|&(_, ready, last)| ready && now.saturating_duration_since(last) > grace)
        .map(|(name, _, _)| name.to_string())
        .collect()
}

impl State {
    /// A `MarkLost` for each Ready node silent past `grace`.
    pub(super) fn silent(&self, now: Instant, grace: Duration) -> Vec<Effect> {
        let seen = self.nodes.iter().map(|(k, n)| (k.as_str(), n.ready, n.last_seen));
        silent_nodes(seen, now, grace).into_iter().map(Effect::MarkLost).collect()
    }
}
