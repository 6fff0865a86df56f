//! A step inside an allocation (Slurm's `srun` inside `salloc`): `pinion run`
//! where `PINION_JOB` names an allocation runs its command in the
//! allocation's member pods rather than in new ones. This module decides
//! which members run it and with which environment, or why the step does
//! not fit the allocation, naming the flag that asks too much.

use crate::Quantity;

/// One member of the allocation, as its pod says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub rank: u32,
    pub pod: String,
    pub node: String,
    /// The CPUs its container holds (its limit); `None`: the shared pool.
    pub cpus: Option<Quantity>,
}

/// What the step asks for (`pinion run`'s flags); `None`: not said.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StepAsk {
    pub nodes: Option<u32>,
    pub ntasks: Option<u32>,
    pub ntasks_per_node: Option<u32>,
    pub cpus: Option<Quantity>,
}

/// One task of the step: the member pod it runs in and the environment it
/// gets on top of the member's own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepTask {
    /// The task's rank in the step (0 first), Slurm's `SLURM_PROCID`.
    pub rank: u32,
    pub pod: String,
    pub env: Vec<(String, String)>,
}

/// The environment variable naming the allocation (set in the allocation's
/// shell and in every member): a job's.
pub use crate::job::JOB_ENV;
use crate::job::{RANK_ENV, WORLD_SIZE_ENV};
/// The environment variable holding the step's id (Slurm's `SLURM_STEP_ID`).
pub const STEP_ENV: &str = "PINION_STEP";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StepError {
    #[error("allocation {job} has no running member (it was released or has not started)")]
    Empty { job: String },
    #[error("{flag} 0: at least 1")]
    Zero { flag: &'static str },
    #[error("{flag} {asked}: allocation {job} holds {held}")]
    TooMany { flag: &'static str, asked: u32, job: String, held: String },
    #[error("--nodes {nodes} is more than --ntasks {tasks}: every node runs at least one task")]
    NodesOverTasks { nodes: u32, tasks: u32 },
    #[error("--cpus {asked}: member {pod} of allocation {job} holds {held}")]
    Cpus { asked: Quantity, pod: String, job: String, held: String },
}

/// The tasks of step `step` of allocation `job`, given its running members
/// and what the step asks for. Without flags every member runs one task, as
/// `srun` runs on the whole allocation; `-N n` keeps the members of the first
/// `n` nodes (in rank order), `--ntasks-per-node k` the first `k` of each,
/// `-n t` at most `ceil(t/n)` per node up to `t` (the block distribution).
pub fn plan(job: &str, step: &str, members: &[Member], ask: &StepAsk) -> Result<Vec<StepTask>, StepError> {
    for (flag, v) in [("--nodes", ask.nodes), ("--ntasks", ask.ntasks), ("--ntasks-per-node", ask.ntasks_per_node)] {
        if v == Some(0) {
            return Err(StepError::Zero { flag });
        }
    }
    if members.is_empty() {
        return Err(StepError::Empty { job: job.into() });
    }
    let mut members: Vec<&Member> = members.iter().collect();
    members.sort_by_key(|m| m.rank);
    // The nodes in the order of their first member, each with its members.
    let mut nodes: Vec<(&str, Vec<&Member>)> = Vec::new();
    for m in members {
        match nodes.iter_mut().find(|(n, _)| *n == m.node) {
            Some((_, ms)) => ms.push(m),
            None => nodes.push((&m.node, vec![m])),
        }
    }
    let too_many = |flag, asked, held: String| StepError::TooMany { flag, asked, job: job.into(), held };
    if let Some(n) = ask.nodes {
        if n as usize > nodes.len() {
            return Err(too_many("--nodes", n, plural(nodes.len(), "node")));
        }
        nodes.truncate(n as usize);
        if let Some(t) = ask.ntasks.filter(|t| *t < n) {
            return Err(StepError::NodesOverTasks { nodes: n, tasks: t });
        }
    }
    let per_node = match (ask.ntasks_per_node, ask.ntasks) {
        (Some(k), _) => {
            let fewest = nodes.iter().map(|(_, ms)| ms.len()).min().unwrap_or(0);
            if k as usize > fewest {
                return Err(too_many("--ntasks-per-node", k, format!("{} on a node", plural(fewest, "task"))));
            }
            k as usize
        }
        (None, Some(t)) if ask.nodes.is_some() => (t as usize).div_ceil(nodes.len()),
        (None, _) => usize::MAX,
    };
    let mut chosen: Vec<&Member> = nodes.iter().flat_map(|(_, ms)| ms.iter().take(per_node).copied()).collect();
    if let Some(t) = ask.ntasks {
        if t as usize > chosen.len() {
            let held = match ask.nodes {
                Some(n) => format!("{} on {}", plural(chosen.len(), "task"), plural(n as usize, "node")),
                None => plural(chosen.len(), "task"),
            };
            return Err(too_many("--ntasks", t, held));
        }
        chosen.truncate(t as usize);
    }
    if let Some(asked) = &ask.cpus {
        for m in &chosen {
            let enough = m.cpus.as_ref().is_some_and(|held| held.millis_ceil() >= asked.millis_ceil());
            if !enough {
                let held = match &m.cpus {
                    Some(q) => format!("{q} CPUs"),
                    None => "no CPUs of its own (the shared pool)".into(),
                };
                return Err(StepError::Cpus { asked: asked.clone(), pod: m.pod.clone(), job: job.into(), held });
            }
        }
    }
    let size = chosen.len().to_string();
    Ok(chosen
        .iter()
        .enumerate()
        .map(|(i, m)| StepTask {
            rank: i as u32,
            pod: m.pod.clone(),
            env: vec![
                (JOB_ENV.into(), job.into()),
                (STEP_ENV.into(), step.into()),
                (RANK_ENV.into(), i.to_string()),
                (WORLD_SIZE_ENV.into(), size.clone()),
            ],
        })
        .collect())
}

fn plural(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Members `(node, cpus)` of allocation `a`, ranks in order.
    fn members(of: &[(&str, Option<i64>)]) -> Vec<Member> {
        of.iter()
            .enumerate()
            .map(|(r, (node, cpus))| Member {
                rank: r as u32,
                pod: format!("a-{r}"),
                node: node.to_string(),
                cpus: cpus.map(Quantity::from_units),
            })
            .collect()
    }

    fn ask(nodes: Option<u32>, ntasks: Option<u32>, per_node: Option<u32>, cpus: Option<&str>) -> StepAsk {
        StepAsk { nodes, ntasks, ntasks_per_node: per_node, cpus: cpus.map(|c| c.parse().expect("quantity")) }
    }

    /// The pods chosen, in step rank order, or a part of the error.
    fn check(of: &[(&str, Option<i64>)], asked: StepAsk, expected: Result<&[&str], &str>) {
        let got = plan("a", "s1", &members(of), &asked);
        match (got, expected) {
            (Ok(tasks), Ok(pods)) => {
                let got: Vec<&str> = tasks.iter().map(|t| t.pod.as_str()).collect();
                assert_eq!(got, pods, "{asked:?}");
                for (i, t) in tasks.iter().enumerate() {
                    assert_eq!(t.rank, i as u32);
                }
            }
            (Err(e), Err(part)) => assert!(e.to_string().contains(part), "{asked:?}: {e}"),
            (got, _) => panic!("{asked:?}: {got:?}"),
        }
    }

    #[test]
    fn a_step_takes_the_members_its_flags_ask_for() {
        let two_by_two = [("n1", Some(2)), ("n1", Some(2)), ("n2", Some(2)), ("n2", Some(2))];
        check(&two_by_two, ask(None, None, None, None), Ok(&["a-0", "a-1", "a-2", "a-3"]));
        check(&two_by_two, ask(Some(1), None, None, None), Ok(&["a-0", "a-1"]));
        check(&two_by_two, ask(None, Some(1), None, None), Ok(&["a-0"]));
        check(&two_by_two, ask(Some(2), Some(2), None, None), Ok(&["a-0", "a-2"]));
        check(&two_by_two, ask(Some(2), Some(3), None, None), Ok(&["a-0", "a-1", "a-2"]));
        check(&two_by_two, ask(Some(2), None, Some(1), None), Ok(&["a-0", "a-2"]));
        check(&two_by_two, ask(None, None, None, Some("2")), Ok(&["a-0", "a-1", "a-2", "a-3"]));
        check(&two_by_two, ask(None, None, None, Some("1500m")), Ok(&["a-0", "a-1", "a-2", "a-3"]));
        check(&[("n1", Some(1))], ask(None, None, None, None), Ok(&["a-0"]));
    }

    #[test]
    fn a_step_bigger_than_its_allocation_names_the_flag() {
        let one = [("n1", Some(1))];
        check(&one, ask(None, Some(2), None, None), Err("--ntasks 2: allocation a holds 1 task"));
        check(&one, ask(Some(2), None, None, None), Err("--nodes 2: allocation a holds 1 node"));
        check(&one, ask(Some(1), None, Some(2), None), Err("--ntasks-per-node 2: allocation a holds 1 task on a node"));
        check(&one, ask(None, None, None, Some("2")), Err("--cpus 2: member a-0 of allocation a holds 1 CPUs"));
        check(&[("n1", None)], ask(None, None, None, Some("1")), Err("holds no CPUs of its own"));
        check(&one, ask(None, Some(0), None, None), Err("--ntasks 0: at least 1"));
        let two_nodes = [("n1", Some(1)), ("n2", Some(1))];
        check(&two_nodes, ask(Some(2), Some(1), None, None), Err("--nodes 2 is more than --ntasks 1"));
        check(&two_nodes, ask(Some(1), Some(2), None, None), Err("--ntasks 2: allocation a holds 1 task on 1 node"));
        check(&[], ask(None, None, None, None), Err("allocation a has no running member"));
    }

    #[test]
    fn each_task_knows_its_allocation_step_and_rank() {
        let tasks =
            plan("a", "s1", &members(&[("n1", Some(1)), ("n2", Some(1))]), &ask(None, None, None, None)).expect("plan");
        let env = |t: &StepTask| t.env.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" ");
        assert_eq!(env(&tasks[1]), "PINION_JOB=a PINION_STEP=s1 PINION_RANK=1 PINION_WORLD_SIZE=2");
    }
}
