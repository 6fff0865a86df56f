//! Job dependencies in Slurm's words (`--dependency`, `-d`): the syntax
//! (`afterok:J1:J2,afterany:J3`, `,` all of them, `?` any of them) and
//! [`decide`], whether a job may start now, must wait, or never will. Pure:
//! the server looks the named jobs up and passes what it found.
//!
//! A job's id in Pinion is its name, so the list names jobs. What each kind
//! needs of every job it names:
//!
//! | kind | met | never met |
//! | --- | --- | --- |
//! | `after` | it started (placed) or ended | - |
//! | `afterany` | it ended | - |
//! | `afterok` | it succeeded | it failed, or is gone |
//! | `afternotok` | it failed | it succeeded, or is gone |
//! | `singleton` | no earlier job of the same name and owner is unfinished | - |
//!
//! A job that is gone (deleted, or never was) cannot say how it ended, so
//! `afterok` and `afternotok` on it are never met; `after` and `afterany`
//! are (it is not running).

use std::fmt;

use crate::job::JobPhase;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    After,
    AfterAny,
    AfterOk,
    AfterNotOk,
    Singleton,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::After => "after",
            Kind::AfterAny => "afterany",
            Kind::AfterOk => "afterok",
            Kind::AfterNotOk => "afternotok",
            Kind::Singleton => "singleton",
        }
    }
}

/// One `kind:J1:J2` element: every job named must meet it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Condition {
    pub kind: Kind,
    /// Empty for `singleton`.
    pub jobs: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dependency {
    /// `?`: any one condition suffices; `,` (or one condition): all of them.
    pub any: bool,
    pub conditions: Vec<Condition>,
}

impl Dependency {
    /// Every job the dependency names, once each.
    pub fn jobs(&self) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        for j in self.conditions.iter().flat_map(|c| &c.jobs) {
            if !out.contains(&j.as_str()) {
                out.push(j);
            }
        }
        out
    }

    pub fn has_singleton(&self) -> bool {
        self.conditions.iter().any(|c| c.kind == Kind::Singleton)
    }
}

impl fmt::Display for Dependency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sep = if self.any { "?" } else { "," };
        for (i, c) in self.conditions.iter().enumerate() {
            if i > 0 {
                f.write_str(sep)?;
            }
            f.write_str(c.kind.as_str())?;
            for j in &c.jobs {
                write!(f, ":{j}")?;
            }
        }
        Ok(())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DependencyError {
    #[error("empty (expected e.g. afterok:JOB or afterany:J1:J2,afterok:J3)")]
    Empty,
    #[error("{0:?}: unknown kind (after, afterany, afterok, afternotok, singleton)")]
    UnknownKind(String),
    #[error("{0}: names no job (write {0}:JOB)")]
    NoJob(&'static str),
    #[error("singleton names no job, got {0:?}")]
    SingletonWithJob(String),
    #[error("{0:?} is not a job name")]
    BadJob(String),
    #[error("both , and ? : Slurm does not mix them")]
    Mixed,
    #[error("{0:?}: a time after the job (+MINUTES) is not supported")]
    Delay(String),
    #[error("at most {max} jobs, got {got}")]
    TooMany { max: usize, got: usize },
}

/// The most jobs one dependency may name.
pub use crate::limits::MAX_LABELS as MAX_DEPENDENCY_JOBS;

/// Slurm's `--dependency` syntax.
pub fn parse(s: &str) -> Result<Dependency, DependencyError> {
    let s = s.trim();
    if s.is_empty() {
        return Err(DependencyError::Empty);
    }
    let (any, parts): (bool, Vec<&str>) = match (s.contains(','), s.contains('?')) {
        (true, true) => return Err(DependencyError::Mixed),
        (false, true) => (true, s.split('?').collect()),
        _ => (false, s.split(',').collect()),
    };
    let mut conditions = Vec::new();
    let mut named = 0usize;
    for part in parts {
        let mut words = part.split(':');
        let kind = match words.next().unwrap_or_default() {
            "" => return Err(DependencyError::Empty),
            "after" => Kind::After,
            "afterany" => Kind::AfterAny,
            "afterok" => Kind::AfterOk,
            "afternotok" => Kind::AfterNotOk,
            "singleton" => Kind::Singleton,
            other => return Err(DependencyError::UnknownKind(other.into())),
        };
        let jobs: Vec<String> = words.map(str::to_string).collect();
        for j in &jobs {
            if j.contains('+') {
                return Err(DependencyError::Delay(j.clone()));
            }
            if !crate::validate::is_dns1123_label(j) {
                return Err(DependencyError::BadJob(j.clone()));
            }
        }
        match (kind, jobs.is_empty()) {
            (Kind::Singleton, false) => return Err(DependencyError::SingletonWithJob(part.into())),
            (Kind::Singleton, true) => {}
            (k, true) => return Err(DependencyError::NoJob(k.as_str())),
            _ => {}
        }
        named += jobs.len();
        conditions.push(Condition { kind, jobs });
    }
    if named > MAX_DEPENDENCY_JOBS {
        return Err(DependencyError::TooMany { max: MAX_DEPENDENCY_JOBS, got: named });
    }
    Ok(Dependency { any, conditions })
}

/// A job a dependency names, as the server found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// Deleted, or never was.
    Gone,
    /// Not placed yet.
    Waiting,
    /// Placed, not ended.
    Started,
    Succeeded,
    Failed,
}

impl Seen {
    pub fn of(phase: JobPhase) -> Seen {
        match phase {
            JobPhase::Pending => Seen::Waiting,
            JobPhase::Running => Seen::Started,
            JobPhase::Succeeded => Seen::Succeeded,
            JobPhase::Failed => Seen::Failed,
        }
    }
}

/// What the dependency allows now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Start the job.
    Met,
    /// Keep it waiting (Slurm's reason `Dependency`).
    Wait,
    /// It can never start (Slurm's `DependencyNeverSatisfied`): why, in words.
    Never(String),
}

/// Whether `dep` is met, given how each named job was `seen` (a job not
/// listed is `Gone`) and whether an earlier unfinished job of the same name
/// and owner exists (for `singleton`).
pub fn decide(dep: &Dependency, seen: &dyn Fn(&str) -> Seen, singleton_busy: bool) -> Verdict {
    let verdicts: Vec<Verdict> = dep.conditions.iter().map(|c| condition(c, seen, singleton_busy)).collect();
    if dep.any {
        if verdicts.contains(&Verdict::Met) {
            return Verdict::Met;
        }
        if verdicts.iter().all(|v| matches!(v, Verdict::Never(_))) {
            let why: Vec<String> =
                verdicts.into_iter().filter_map(|v| if let Verdict::Never(w) = v { Some(w) } else { None }).collect();
            return Verdict::Never(why.join("; "));
        }
        return Verdict::Wait;
    }
    if let Some(never) = verdicts.iter().find(|v| matches!(v, Verdict::Never(_))) {
        return never.clone();
    }
    if verdicts.iter().all(|v| *v == Verdict::Met) {
        Verdict::Met
    } else {
        Verdict::Wait
    }
}

fn condition(c: &Condition, seen: &dyn Fn(&str) -> Seen, singleton_busy: bool) -> Verdict {
    if c.kind == Kind::Singleton {
        return if singleton_busy { Verdict::Wait } else { Verdict::Met };
    }
    let mut all_met = true;
    for j in &c.jobs {
        let s = seen(j);
        let met = match (c.kind, s) {
            (Kind::After, Seen::Waiting) => false,
            (Kind::After, _) => true,
            (Kind::AfterAny, Seen::Waiting | Seen::Started) => false,
            (Kind::AfterAny, _) => true,
            (Kind::AfterOk, Seen::Succeeded) => true,
            (Kind::AfterOk, Seen::Failed) => return Verdict::Never(format!("afterok:{j}: job {j} failed")),
            (Kind::AfterOk, Seen::Gone) => return Verdict::Never(format!("afterok:{j}: job {j} is gone")),
            (Kind::AfterNotOk, Seen::Failed) => true,
            (Kind::AfterNotOk, Seen::Succeeded) => return Verdict::Never(format!("afternotok:{j}: job {j} succeeded")),
            (Kind::AfterNotOk, Seen::Gone) => return Verdict::Never(format!("afternotok:{j}: job {j} is gone")),
            (Kind::AfterOk | Kind::AfterNotOk, Seen::Waiting | Seen::Started) => false,
            (Kind::Singleton, _) => true,
        };
        all_met &= met;
    }
    if all_met {
        Verdict::Met
    } else {
        Verdict::Wait
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_parse(s: &str, expected: Result<&str, DependencyError>) {
        assert_eq!(parse(s).map(|d| d.to_string()), expected.map(str::to_string), "{s}");
    }

    #[test]
    fn slurms_syntax() {
        check_parse("afterok:a", Ok("afterok:a"));
        check_parse("afterok:a:b,afterany:c", Ok("afterok:a:b,afterany:c"));
        check_parse("afterok:a?afternotok:b", Ok("afterok:a?afternotok:b"));
        check_parse("after:a", Ok("after:a"));
        check_parse("singleton", Ok("singleton"));
        check_parse(" singleton,afterok:x ", Ok("singleton,afterok:x"));
        check_parse("", Err(DependencyError::Empty));
        check_parse("afterok:a,", Err(DependencyError::Empty));
        check_parse("before:a", Err(DependencyError::UnknownKind("before".into())));
        check_parse("afterok", Err(DependencyError::NoJob("afterok")));
        check_parse("singleton:a", Err(DependencyError::SingletonWithJob("singleton:a".into())));
        check_parse("afterok:A_b", Err(DependencyError::BadJob("A_b".into())));
        check_parse("afterok:a,afterany:b?after:c", Err(DependencyError::Mixed));
        check_parse("after:a+10", Err(DependencyError::Delay("a+10".into())));
        let many =
            format!("afterok:{}", (0..=MAX_DEPENDENCY_JOBS).map(|i| format!("j{i}")).collect::<Vec<_>>().join(":"));
        check_parse(&many, Err(DependencyError::TooMany { max: MAX_DEPENDENCY_JOBS, got: MAX_DEPENDENCY_JOBS + 1 }));
    }

    fn check(dep: &str, jobs: &[(&str, Seen)], busy: bool, expected: Verdict) {
        let d = parse(dep).expect(dep);
        let seen = |name: &str| jobs.iter().find(|(n, _)| *n == name).map_or(Seen::Gone, |(_, s)| *s);
        assert_eq!(decide(&d, &seen, busy), expected, "{dep} {jobs:?} busy={busy}");
    }

    #[test]
    fn every_kind_in_every_state() {
        use Seen::*;
        use Verdict::*;
        let never = |s: &str| Never(s.to_string());
        // (dependency, how each job was seen, singleton busy, verdict)
        type Case = (&'static str, Vec<(&'static str, Seen)>, bool, Verdict);
        let cases: Vec<Case> = vec![
            ("after:a", vec![("a", Waiting)], false, Wait),
            ("after:a", vec![("a", Started)], false, Met),
            ("after:a", vec![("a", Failed)], false, Met),
            ("after:a", vec![], false, Met),
            ("afterany:a", vec![("a", Started)], false, Wait),
            ("afterany:a", vec![("a", Succeeded)], false, Met),
            ("afterany:a", vec![("a", Failed)], false, Met),
            ("afterany:a", vec![], false, Met),
            ("afterok:a", vec![("a", Waiting)], false, Wait),
            ("afterok:a", vec![("a", Started)], false, Wait),
            ("afterok:a", vec![("a", Succeeded)], false, Met),
            ("afterok:a", vec![("a", Failed)], false, never("afterok:a: job a failed")),
            ("afterok:a", vec![], false, never("afterok:a: job a is gone")),
            ("afternotok:a", vec![("a", Started)], false, Wait),
            ("afternotok:a", vec![("a", Failed)], false, Met),
            ("afternotok:a", vec![("a", Succeeded)], false, never("afternotok:a: job a succeeded")),
            ("afternotok:a", vec![], false, never("afternotok:a: job a is gone")),
            ("singleton", vec![], true, Wait),
            ("singleton", vec![], false, Met),
            // `:` within a kind: every job.
            ("afterok:a:b", vec![("a", Succeeded), ("b", Started)], false, Wait),
            ("afterok:a:b", vec![("a", Succeeded), ("b", Succeeded)], false, Met),
            ("afterok:a:b", vec![("a", Started), ("b", Failed)], false, never("afterok:b: job b failed")),
            // `,`: all; one never is never.
            ("afterok:a,afterany:b", vec![("a", Succeeded), ("b", Started)], false, Wait),
            ("afterok:a,afterany:b", vec![("a", Succeeded), ("b", Failed)], false, Met),
            ("afterok:a,afterany:b", vec![("a", Failed), ("b", Started)], false, never("afterok:a: job a failed")),
            ("afterok:a,singleton", vec![("a", Succeeded)], true, Wait),
            // `?`: any; never only when every one is.
            ("afterok:a?afternotok:a", vec![("a", Started)], false, Wait),
            ("afterok:a?afternotok:a", vec![("a", Failed)], false, Met),
            ("afterok:a?afterok:b", vec![("a", Failed), ("b", Started)], false, Wait),
            (
                "afterok:a?afterok:b",
                vec![("a", Failed), ("b", Failed)],
                false,
                never("afterok:a: job a failed; afterok:b: job b failed"),
            ),
        ];
        for (dep, jobs, busy, expected) in cases {
            check(dep, &jobs, busy, expected);
        }
    }
}
