//! Accounting records (`specs::acct::Record`, Slurm's `sacct`) in the
//! store: written in the write that ends a pod or job, or deletes one
//! before its end (CANCELLED), so a record outlives the pod, its job and a
//! crash; pruned once past the retention (`prune`, the controller's).

use specs::acct::{self, Record, Times};
use specs::job::Job;
use specs::Pod;

use super::ClusterError;
use crate::store::Txn;

fn unix(ts: Option<&str>) -> Option<i64> {
    ts.and_then(|s| chrono::DateTime::parse_from_rfc3339(s).ok()).map(|t| t.timestamp())
}

/// Whether a pod is accounted for on its own: a Deployment's or a
/// DaemonSet's pods are services, not jobs.
fn accounted(pod: &Pod) -> bool {
    let l = &pod.metadata.labels;
    !l.contains_key(specs::deployment::DEPLOYMENT_LABEL) && !l.contains_key(specs::daemonset::DAEMONSET_LABEL)
}

/// Records a pod that ended now, or was deleted before it ended
/// (`cancelled`). A member takes its job's partition and account.
pub fn pod_ended(t: &mut Txn<'_>, pod: &Pod, cancelled: bool) -> Result<(), ClusterError> {
    if !accounted(pod) {
        return Ok(());
    }
    let status = pod.status.as_ref();
    let times = Times {
        submit: unix(pod.metadata.creation_timestamp.as_deref()),
        start: unix(status.and_then(|s| s.start_time.as_deref())),
        end: chrono::Utc::now().timestamp(),
    };
    let mut record = acct::pod_record(pod, times, cancelled);
    if let Some((job, _, _)) = specs::job::membership(pod) {
        if let Some(job) = t.get::<Job>(job)? {
            record.partition = job.spec.partition.clone();
            record.account = record.account.or_else(|| job.metadata.labels.get(specs::batch::ACCOUNT_LABEL).cloned());
        }
    }
    t.put(&mut record)?;
    Ok(())
}

/// Records a job that ended now (its members as they ended), or was
/// deleted before it ended (`cancelled`).
pub fn job_ended(t: &mut Txn<'_>, job: &Job, members: &[&Pod], cancelled: bool) -> Result<(), ClusterError> {
    let status = job.status.clone().unwrap_or_default();
    let times = Times {
        submit: unix(job.metadata.creation_timestamp.as_deref()),
        start: unix(status.start_time.as_deref()),
        end: unix(status.completion_time.as_deref()).unwrap_or_else(|| chrono::Utc::now().timestamp()),
    };
    let mut record = acct::job_record(job, members, times, cancelled);
    t.put(&mut record)?;
    Ok(())
}

/// Removes the records past `retention_seconds` at `now` among `names`
/// (the controller lists them outside the write); how many went.
pub fn prune(t: &mut Txn<'_>, names: &[String], now: i64, retention_seconds: u64) -> Result<usize, ClusterError> {
    let mut gone = 0;
    for name in names {
        let expired = t.get::<Record>(name)?.is_some_and(|r| acct::expired(&r, now, retention_seconds));
        if expired && t.delete::<Record>(name)?.is_some() {
            gone += 1;
        }
    }
    Ok(gone)
}
