//! Who a container's processes are on this node: the pod's ids as they are,
//! or a user name looked up in the node's own passwd and group databases
//! (through NSS, so files, LDAP or sssd alike, as `id NAME` would). The
//! runtime calls [`resolve`] when it prepares a container; the agent's pure
//! deciders only copy the pod's fields into a [`RunAs`], since a lookup is I/O.

use std::ffi::CString;

use nix::unistd::{Gid, Uid, User};

use super::RunAs;

/// The group a non-root process gets when the pod names no group and the
/// node has no passwd entry for its uid: `nogroup`, never root's group 0,
/// which would let it read every `root:root 0640` file of a host rootfs.
pub(crate) const NOGROUP: u32 = 65534;

/// The identity a container's process runs with.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ProcessUser {
    pub uid: u32,
    pub gid: u32,
    /// The process's supplementary groups (`setgroups`). Empty leaves the
    /// runtime's own groups in place (libcontainer skips an empty list), so
    /// a non-root user always gets at least its primary group here.
    pub additional_gids: Vec<u32>,
    /// The user's home on this node, for `HOME` when the pod sets none
    /// (only for a user looked up by name).
    pub home: Option<String>,
}

impl ProcessUser {
    pub fn is_root(&self) -> bool {
        self.uid == 0
    }
}

#[derive(Debug, thiserror::Error)]
pub enum UserError {
    #[error("runAsUserName {0:?}: no such user on this node")]
    NoSuchUser(String),
    #[error("runAsUserName {name:?}: looking the user up: {source}")]
    Lookup { name: String, source: nix::Error },
    #[error("runAsUserName {name:?}: listing the user's groups: {source}")]
    Groups { name: String, source: nix::Error },
    #[error("runAsUser {uid}: looking the user up: {source}")]
    LookupUid { uid: u32, source: nix::Error },
}

/// `gid` first, then `more` without repeats, in order.
fn group_list(gid: u32, more: impl IntoIterator<Item = u32>) -> Vec<u32> {
    let mut out = vec![gid];
    for g in more {
        if !out.contains(&g) {
            out.push(g);
        }
    }
    out
}

/// The process identity of `run_as` on this node:
/// - a uid (the container's, else the pod's): that uid; the gid is the
///   pod's `runAsGroup`, else for a non-root uid the primary group of its
///   passwd entry on this node, else [`NOGROUP`]; the groups are the gid and
///   `supplementalGroups`. Root without a group stays gid 0, as before;
/// - no uid but a user name: the node's passwd entry of that name (its uid,
///   its primary group unless `runAsGroup` says otherwise, its home), its
///   groups from the group database (`getgrouplist`) plus
///   `supplementalGroups`; a name the node does not know is an error;
/// - neither: root, as every container ran before.
pub fn resolve(run_as: &RunAs) -> Result<ProcessUser, UserError> {
    let supplemental = run_as.supplemental_groups.iter().copied();
    match (run_as.uid, run_as.user_name.as_deref()) {
        (Some(0), _) | (None, None) => {
            let gid = run_as.gid.unwrap_or(0);
            // Root keeps what root had unless the pod lists groups.
            let additional_gids =
                if run_as.supplemental_groups.is_empty() { Vec::new() } else { group_list(gid, supplemental) };
            Ok(ProcessUser { uid: 0, gid, additional_gids, home: None })
        }
        (Some(uid), _) => {
            let gid = match run_as.gid {
                Some(gid) => gid,
                None => User::from_uid(Uid::from_raw(uid))
                    .map_err(|source| UserError::LookupUid { uid, source })?
                    .map_or(NOGROUP, |u| u.gid.as_raw()),
            };
            Ok(ProcessUser { uid, gid, additional_gids: group_list(gid, supplemental), home: None })
        }
        (None, Some(name)) => {
            let user = User::from_name(name)
                .map_err(|source| UserError::Lookup { name: name.to_string(), source })?
                .ok_or_else(|| UserError::NoSuchUser(name.to_string()))?;
            let gid = run_as.gid.unwrap_or(user.gid.as_raw());
            // Validation keeps NUL out of names; a NUL here finds no user.
            let cname = CString::new(name).map_err(|_| UserError::NoSuchUser(name.to_string()))?;
            let groups = nix::unistd::getgrouplist(&cname, Gid::from_raw(gid))
                .map_err(|source| UserError::Groups { name: name.to_string(), source })?;
            let home = user.dir.to_str().filter(|h| !h.is_empty()).map(str::to_string);
            Ok(ProcessUser {
                uid: user.uid.as_raw(),
                gid,
                additional_gids: group_list(gid, groups.into_iter().map(Gid::as_raw).chain(supplemental)),
                home,
            })
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // in tests a panic is the failure report
mod tests {
    use super::*;

    fn run_as(uid: Option<u32>, gid: Option<u32>, groups: &[u32], name: Option<&str>) -> RunAs {
        RunAs { uid, gid, supplemental_groups: groups.to_vec(), user_name: name.map(str::to_string) }
    }

    #[test]
    fn ids_as_the_pod_gives_them() {
        let check = |r: RunAs, want: ProcessUser| assert_eq!(resolve(&r).unwrap(), want, "{r:?}");
        let user = |uid, gid, groups: &[u32]| ProcessUser { uid, gid, additional_gids: groups.to_vec(), home: None };
        // Nothing said: root with root's groups, as before.
        check(RunAs::default(), user(0, 0, &[]));
        check(run_as(Some(0), None, &[], None), user(0, 0, &[]));
        check(run_as(None, Some(5), &[], None), user(0, 5, &[]));
        check(run_as(Some(0), None, &[7, 0], None), user(0, 0, &[0, 7]));
        // A uid wins over a name.
        check(run_as(Some(1001), Some(1001), &[1002, 1001], Some("root")), user(1001, 1001, &[1001, 1002]));
        check(run_as(Some(0), None, &[], Some("nobody")), user(0, 0, &[]));
    }

    /// A uid the node does not know and no group: nogroup, never group 0.
    #[test]
    fn a_non_root_uid_without_a_group_is_never_in_roots_group() {
        let uid = 3_999_999_999;
        assert!(User::from_uid(Uid::from_raw(uid)).unwrap().is_none(), "uid {uid} exists on this host");
        let got = resolve(&run_as(Some(uid), None, &[], None)).unwrap();
        assert_eq!((got.gid, got.additional_gids), (NOGROUP, vec![NOGROUP]));
    }

    /// `root` and `nobody` are in every Debian passwd (and every other Linux's).
    #[test]
    fn names_are_looked_up_on_the_node() {
        let root = resolve(&run_as(None, None, &[], Some("root"))).unwrap();
        assert_eq!((root.uid, root.gid, root.home.as_deref()), (0, 0, Some("/root")));
        assert_eq!(root.additional_gids.first(), Some(&0));
        let nobody = User::from_name("nobody").unwrap().unwrap();
        let got = resolve(&run_as(None, None, &[4242], Some("nobody"))).unwrap();
        assert_eq!((got.uid, got.gid), (nobody.uid.as_raw(), nobody.gid.as_raw()));
        assert_eq!(got.additional_gids.first(), Some(&nobody.gid.as_raw()));
        assert_eq!(got.additional_gids.last(), Some(&4242));
        assert_eq!(got.home, nobody.dir.to_str().map(str::to_string));
        let regrouped = resolve(&run_as(None, Some(4343), &[], Some("nobody"))).unwrap();
        assert_eq!(regrouped.gid, 4343, "runAsGroup over the user's primary group");
    }

    #[test]
    fn an_unknown_name_is_an_error_naming_it() {
        let err = resolve(&run_as(None, None, &[], Some("no-such-user-pinion"))).unwrap_err();
        assert_eq!(err.to_string(), "runAsUserName \"no-such-user-pinion\": no such user on this node");
    }
}
