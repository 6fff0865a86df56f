//! Fair share and job priority: Slurm's multifactor priority in its
//! simplest honest form. A job's priority is its site priority (an admin's
//! `--priority`, 0 otherwise) plus weighted factors between 0 and 1:
//!
//! - age: how long it has been eligible (its members made), up to
//!   `max_age_seconds`;
//! - size: its CPUs over the cluster's;
//! - fair share: `2^(-U/S)`, where `U` is its user's share of the cluster's
//!   recent usage and `S` the share each user is due (one over the number of
//!   users with usage); the same for its account, the two averaged.
//!
//! Usage is the CPU-seconds of finished jobs, decayed with a half-life
//! (`Decayed`), kept durably per user and per account (`Usage`). All pure:
//! the caller passes the times.

use serde::{Deserialize, Serialize};

use crate::pod::ObjectMeta;

/// The weights and times of the formula (Slurm's `PriorityWeight*`,
/// `PriorityMaxAge`, `PriorityDecayHalfLife`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Weights {
    pub age: f64,
    pub size: f64,
    pub fairshare: f64,
    pub max_age_seconds: u64,
    pub half_life_seconds: u64,
}

/// Fair share weighs most, as sites usually set it: a user who used
/// nothing lately goes ahead of one who used the whole cluster, whatever
/// their jobs' age and size.
pub const DEFAULT_WEIGHTS: Weights = Weights {
    age: 1000.0,
    size: 1000.0,
    fairshare: 10_000.0,
    max_age_seconds: 7 * 86_400,
    half_life_seconds: 7 * 86_400,
};

/// Usage as of a time: CPU-seconds, halved every half-life after `at`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Decayed {
    pub cpu_seconds: f64,
    /// Unix seconds.
    pub at: i64,
}

impl Decayed {
    /// The usage as of `now` (never grows; a time before `at` reads as `at`).
    pub fn at(self, now: i64, half_life_seconds: u64) -> f64 {
        let elapsed = now.saturating_sub(self.at).max(0) as f64;
        let half_life = half_life_seconds.max(1) as f64;
        self.cpu_seconds * (-elapsed / half_life).exp2()
    }

    /// `cpu_seconds` more, at `now`.
    pub fn charge(self, cpu_seconds: f64, now: i64, half_life_seconds: u64) -> Decayed {
        let at = now.max(self.at);
        Decayed { cpu_seconds: self.at(at, half_life_seconds) + cpu_seconds.max(0.0), at }
    }
}

/// A user's or an account's recorded usage, stored by the server (`kind:
/// Usage`, named `user.NAME` or `account.NAME`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Usage {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    pub usage: Decayed,
}

/// Whose usage a record holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holder<'a> {
    User(&'a str),
    Account(&'a str),
}

impl Holder<'_> {
    /// The record's name.
    pub fn record(self) -> String {
        match self {
            Holder::User(n) => format!("user.{n}"),
            Holder::Account(n) => format!("account.{n}"),
        }
    }

    /// The holder a record's name stands for.
    pub fn of(record: &str) -> Option<Holder<'_>> {
        if let Some(n) = record.strip_prefix("user.") {
            return Some(Holder::User(n));
        }
        record.strip_prefix("account.").map(Holder::Account)
    }
}

/// `2^(-U/S)`: `used` of `total` against an equal share among `holders`;
/// 1 when nothing was used (by anyone, or by this one).
pub fn share_factor(used: f64, total: f64, holders: usize) -> f64 {
    if total <= 0.0 || used <= 0.0 || holders == 0 {
        return 1.0;
    }
    let u = used / total;
    let s = 1.0 / holders as f64;
    (-u / s).exp2()
}

/// The usage of every user and account as of `now`, to judge one job's
/// fair share from.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Ledger {
    users: std::collections::BTreeMap<String, f64>,
    accounts: std::collections::BTreeMap<String, f64>,
}

impl Ledger {
    /// From the stored records, decayed to `now`.
    pub fn new(records: &[Usage], now: i64, w: &Weights) -> Ledger {
        let mut l = Ledger::default();
        for r in records {
            let used = r.usage.at(now, w.half_life_seconds);
            match Holder::of(&r.metadata.name) {
                Some(Holder::User(n)) => l.users.insert(n.to_string(), used),
                Some(Holder::Account(n)) => l.accounts.insert(n.to_string(), used),
                None => None,
            };
        }
        l
    }

    /// A user's fair-share factor (and their account's, averaged in when
    /// the job has one); a newcomer counts among the holders.
    pub fn factor(&self, user: &str, account: Option<&str>) -> f64 {
        let of = |m: &std::collections::BTreeMap<String, f64>, who: &str| {
            let total: f64 = m.values().sum();
            let holders = m.len() + usize::from(!m.contains_key(who));
            share_factor(m.get(who).copied().unwrap_or(0.0), total, holders)
        };
        let mine = of(&self.users, user);
        match account {
            Some(a) => (mine + of(&self.accounts, a)) / 2.0,
            None => mine,
        }
    }
}

/// One user's or account's standing, as `pinion share` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Share {
    /// `user` or `account`.
    pub kind: String,
    pub name: String,
    /// Decayed CPU-seconds, as of now.
    pub usage: f64,
    /// Of the usage of all users (or accounts), 0 to 1.
    pub usage_share: f64,
    /// The fair-share factor, 0 to 1 (1: used nothing lately).
    pub fair_share: f64,
}

impl Ledger {
    /// Every user's and account's standing, users first, by name.
    pub fn shares(&self) -> Vec<Share> {
        let mut out = Vec::new();
        for (kind, m) in [("user", &self.users), ("account", &self.accounts)] {
            let total: f64 = m.values().sum();
            for (name, used) in m {
                out.push(Share {
                    kind: kind.into(),
                    name: name.clone(),
                    usage: *used,
                    usage_share: if total > 0.0 { used / total } else { 0.0 },
                    fair_share: share_factor(*used, total, m.len()),
                });
            }
        }
        out
    }
}

/// A job's factors, each 0 to 1.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Factors {
    pub age: f64,
    pub size: f64,
    pub fairshare: f64,
}

impl Factors {
    /// `age_seconds` eligible, `cpus` of the cluster's `cluster_cpus`, a
    /// fair-share factor as `Ledger::factor` gives it.
    pub fn new(age_seconds: u64, cpus: f64, cluster_cpus: f64, fairshare: f64, w: &Weights) -> Factors {
        let ratio = |a: f64, b: f64| if b > 0.0 { (a / b).clamp(0.0, 1.0) } else { 0.0 };
        Factors {
            age: ratio(age_seconds as f64, w.max_age_seconds as f64),
            size: ratio(cpus, cluster_cpus),
            fairshare: fairshare.clamp(0.0, 1.0),
        }
    }
}

/// The priority without its age: the site priority and the weighted size
/// and fair share, rounded. Fixed when the job becomes eligible.
pub fn base_priority(site: i32, f: &Factors, w: &Weights) -> i64 {
    i64::from(site) + (w.size * f.size + w.fairshare * f.fairshare).round() as i64
}

/// The whole priority at a time: the base and the weighted age.
pub fn priority(base: i64, age_seconds: u64, w: &Weights) -> i64 {
    let age = Factors::new(age_seconds, 0.0, 0.0, 0.0, w).age;
    base + (w.age * age).round() as i64
}

/// A key that orders waiting jobs as `priority` does at any one time (the
/// higher first), with no clock: every waiting job ages at the same rate,
/// so an earlier eligibility is worth `w.age` per `max_age_seconds`
/// (exactly so until a job reaches the maximum age). Thousandths of a point.
pub fn order_key(base: i64, eligible_at: i64, w: &Weights) -> i64 {
    let per_second = w.age * 1000.0 / w.max_age_seconds.max(1) as f64;
    base.saturating_mul(1000).saturating_sub((eligible_at as f64 * per_second).round() as i64)
}

#[cfg(test)]
mod tests;
