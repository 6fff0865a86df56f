//! Partitions in the store (`specs::partition`): an admin's apply, which
//! creates one or changes the stored one of that name, and delete. The API
//! lets only admins write them (`Request::WritePartitions`); anyone known
//! reads them. At most one is the cluster's default: a second is refused in
//! the write that would make it, naming the first.

use specs::partition::Partition;

use super::{now_rfc3339, ClusterError};
use crate::store::Txn;

/// What an apply did.
#[derive(Debug)]
pub struct Applied {
    /// 201 when new; 200 when it repeated or changed the stored one.
    pub new: bool,
    pub partition: Partition,
}

/// Stores the partition, or changes the stored one of its name (its spec,
/// labels and annotations the given ones). Jobs already submitted keep what
/// they were given; the next ones get the new limits.
pub fn apply(t: &mut Txn<'_>, given: &Partition, uid: &str) -> Result<Applied, ClusterError> {
    let name = given.metadata.name.clone();
    if given.spec.default {
        let other = t.list::<Partition>()?.into_iter().find(|p| p.spec.default && p.metadata.name != name);
        if let Some(other) = other {
            return Err(ClusterError::Conflict(format!(
                "partition {:?} is the cluster's default already: set its default to false first",
                other.metadata.name
            )));
        }
    }
    if let Some(mut existing) = t.get::<Partition>(&name)? {
        let same = existing.spec == given.spec
            && existing.metadata.labels == given.metadata.labels
            && existing.metadata.annotations == given.metadata.annotations;
        if same {
            return Ok(Applied { new: false, partition: existing });
        }
        // One more at each change, as a workload's: `pinion apply` says
        // `configured` from it.
        existing.metadata.generation = Some(existing.metadata.generation.unwrap_or(1) + 1);
        existing.spec = given.spec.clone();
        existing.metadata.labels = given.metadata.labels.clone();
        existing.metadata.annotations = given.metadata.annotations.clone();
        t.put(&mut existing)?;
        return Ok(Applied { new: false, partition: existing });
    }
    let mut p = given.clone();
    p.metadata.uid = Some(uid.to_string());
    p.metadata.creation_timestamp = Some(now_rfc3339());
    p.metadata.owner = None;
    p.metadata.generation = Some(1);
    t.put(&mut p)?;
    Ok(Applied { new: true, partition: p })
}

/// Removes the partition; jobs placed in it keep its name and limits.
pub fn delete(t: &mut Txn<'_>, name: &str) -> Result<Partition, ClusterError> {
    t.delete::<Partition>(name)?.ok_or_else(|| ClusterError::not_found("Partition", name))
}
