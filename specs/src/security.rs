//! Pod security: the profiles a person's pods are held to, with the meaning
//! Kubernetes' Pod Security Standards give them.

use serde::{Deserialize, Serialize};

/// How much of the host a person's pods may reach.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Profile {
    /// No host paths, no host network, not root, no added capability but
    /// `NET_BIND_SERVICE`.
    Restricted,
    /// Host paths under the prefixes an admin allows, host network and the
    /// capabilities beyond a short list only where granted, root only inside
    /// a user namespace of the pod's own.
    Baseline,
    /// Anything, as an admin's pods.
    Privileged,
}

impl Profile {
    pub fn as_str(self) -> &'static str {
        match self {
            Profile::Restricted => "restricted",
            Profile::Baseline => "baseline",
            Profile::Privileged => "privileged",
        }
    }
}

impl std::fmt::Display for Profile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Profile {
    type Err = String;
    fn from_str(s: &str) -> Result<Profile, String> {
        match s {
            "restricted" => Ok(Profile::Restricted),
            "baseline" => Ok(Profile::Baseline),
            "privileged" => Ok(Profile::Privileged),
            other => Err(format!("{other:?} is not a profile (restricted, baseline, privileged)")),
        }
    }
}

/// Capabilities a `baseline` pod may add whatever its identity: none of them
/// reaches past the process's own files and sockets.
const BASELINE_CAPABILITIES: &[&str] = &["AUDIT_WRITE", "KILL", "NET_BIND_SERVICE", "SYS_CHROOT"];

/// Capabilities a `baseline` pod may add inside a user namespace of its own
/// (`hostUsers: false`): Kubernetes' baseline list. On the host's users they
/// would let a process read or chown any file of the host rootfs, so there
/// only the list above applies.
const BASELINE_USERNS_CAPABILITIES: &[&str] = &[
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
];

/// The one capability a `restricted` pod may add.
const RESTRICTED_CAPABILITIES: &[&str] = &["NET_BIND_SERVICE"];

/// The Unix identity a person's pods run as on the nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnixUser {
    pub name: String,
    /// Unset: the node looks `name` up in its own databases.
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub groups: Vec<u32>,
}

/// What one person's pods are held to.
#[derive(Debug, Clone)]
pub struct Policy<'a> {
    /// How a refusal names them: `user alice`.
    pub who: &'a str,
    pub profile: Profile,
    /// Host folders (absolute, normalized) under which `baseline` pods may
    /// mount host paths.
    pub allowed_host_paths: &'a [String],
    /// Capabilities granted to this person beyond the profile's list.
    pub granted_capabilities: &'a [String],
    /// May use the host's network.
    pub host_network: bool,
    /// Whom their pods run as; `None` runs pods as they say (an admin's).
    pub unix: Option<&'a UnixUser>,
}

/// Fills in whom the pod runs as, where the pod left it open: the person's
/// uid, gid and groups, or their name for the node to look up. A pod in a
/// user namespace of its own keeps what it says (its ids are not the host's).
pub fn run_as(spec: &mut crate::pod::PodSpec, user: &UnixUser) {
    if spec.host_users == Some(false) {
        return;
    }
    let sc = spec.security_context.get_or_insert_with(Default::default);
    match user.uid {
        Some(uid) => {
            sc.run_as_user.get_or_insert(uid);
            if let Some(gid) = user.gid {
                sc.run_as_group.get_or_insert(gid);
            }
            if sc.supplemental_groups.is_empty() {
                sc.supplemental_groups = user.groups.clone();
            }
        }
        None => {
            if sc.run_as_user.is_none() {
                sc.run_as_user_name = Some(user.name.clone());
            }
        }
    }
}

/// Every way the pod spec (at `prefix`, `spec` or `spec.template.spec`)
/// reaches past what `policy` allows, each with its field path and the
/// profile's name. Call after `run_as`.
pub fn check(spec: &crate::pod::PodSpec, prefix: &str, policy: &Policy<'_>) -> Vec<crate::validate::FieldError> {
    let mut out = Vec::new();
    let profile = policy.profile;
    if profile == Profile::Privileged {
        return out;
    }
    let mut refuse = |field: String, what: String| {
        out.push(crate::validate::FieldError {
            field,
            message: format!("{what} is not allowed for {} (profile {profile})", policy.who),
        })
    };
    let userns = spec.host_users == Some(false);

    if spec.host_network && (profile == Profile::Restricted || !policy.host_network) {
        refuse(format!("{prefix}.hostNetwork"), "the host's network".into());
    }
    for (i, v) in spec.volumes.iter().enumerate() {
        let path = &v.host_path.path;
        let allowed = profile == Profile::Baseline && policy.allowed_host_paths.iter().any(|a| is_under(path, a));
        if !allowed {
            refuse(format!("{prefix}.volumes[{i}].hostPath.path"), format!("host path {path:?}"));
        }
    }

    // Whom each container runs as on the host: its own uid, else the pod's.
    let pod_sc = spec.security_context.clone().unwrap_or_default();
    let unix = policy.unix;
    let uid_ok = |uid: u32| match (profile, userns) {
        (Profile::Restricted, _) if uid == 0 => false,
        (_, true) => true,
        _ => unix.is_some_and(|u| u.uid == Some(uid)) || unix.is_none() && uid != 0,
    };
    let gid_ok = |gid: u32| userns || unix.is_none() && gid != 0 || unix.is_some_and(|u| u.gid == Some(gid));
    let group_ok = |gid: u32| userns || unix.is_none() && gid != 0 || unix.is_some_and(|u| u.groups.contains(&gid));
    let sc_prefix = format!("{prefix}.securityContext");
    if let Some(uid) = pod_sc.run_as_user {
        if !uid_ok(uid) {
            refuse(format!("{sc_prefix}.runAsUser"), format!("uid {uid}"));
        }
    }
    if let Some(gid) = pod_sc.run_as_group {
        if !gid_ok(gid) {
            refuse(format!("{sc_prefix}.runAsGroup"), format!("gid {gid}"));
        }
    }
    for (j, gid) in pod_sc.supplemental_groups.iter().enumerate() {
        if !group_ok(*gid) {
            refuse(format!("{sc_prefix}.supplementalGroups[{j}]"), format!("group {gid}"));
        }
    }
    if let Some(name) = &pod_sc.run_as_user_name {
        if !userns && unix.is_none_or(|u| u.uid.is_some() || &u.name != name) {
            refuse(format!("{sc_prefix}.runAsUserName"), format!("the user {name:?}"));
        }
    }
    let runs_as_root = |c_uid: Option<u32>| match c_uid.or(pod_sc.run_as_user) {
        Some(uid) => uid == 0,
        // Looked up by name on the node: a person's own account.
        None => pod_sc.run_as_user_name.is_none(),
    };

    let listed: &[&str] = match (profile, userns) {
        (Profile::Restricted, _) => RESTRICTED_CAPABILITIES,
        (_, true) => BASELINE_USERNS_CAPABILITIES,
        _ => BASELINE_CAPABILITIES,
    };
    for (i, c) in spec.containers.iter().enumerate() {
        let p = format!("{prefix}.containers[{i}].securityContext");
        let sc = c.security_context.clone().unwrap_or_default();
        if let Some(uid) = sc.run_as_user {
            if !uid_ok(uid) {
                refuse(format!("{p}.runAsUser"), format!("uid {uid}"));
            }
        }
        if let Some(gid) = sc.run_as_group {
            if !gid_ok(gid) {
                refuse(format!("{p}.runAsGroup"), format!("gid {gid}"));
            }
        }
        if profile == Profile::Restricted && runs_as_root(sc.run_as_user) {
            refuse(p.clone(), "running as root".into());
        }
        for (j, cap) in sc.capabilities.iter().flat_map(|c| c.add.iter()).enumerate() {
            let bare = crate::pod::capability_name(cap).map(|n| n.trim_start_matches("CAP_").to_string());
            let Some(bare) = bare else { continue };
            let granted = policy
                .granted_capabilities
                .iter()
                .filter_map(|g| crate::pod::capability_name(g))
                .any(|g| g.trim_start_matches("CAP_") == bare);
            let allowed = listed.contains(&bare.as_str()) || granted && profile == Profile::Baseline;
            if !allowed {
                refuse(format!("{p}.capabilities.add[{j}]"), bare);
            }
        }
    }
    out
}

/// Whether `path` is `prefix` or below it, component by component, after
/// `.` and `..` are resolved as text (a host path that climbs out with `..`
/// is not under anything).
pub fn is_under(path: &str, prefix: &str) -> bool {
    let (Some(path), Some(prefix)) = (normalize(path), normalize(prefix)) else { return false };
    prefix.is_empty() || path == prefix || path.starts_with(&prefix) && path[prefix.len()..].starts_with('/')
}

/// `/srv//a/./b/` -> `/srv/a/b`, `/` -> ``; `None` when relative or `..`
/// climbs above the root.
fn normalize(path: &str) -> Option<String> {
    if !path.starts_with('/') {
        return None;
    }
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            p => parts.push(p),
        }
    }
    Some(parts.iter().map(|p| format!("/{p}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod::{Capabilities, HostPathVolume, PodSpec, SecurityContext, Volume};

    fn alice() -> UnixUser {
        UnixUser { name: "alice".into(), uid: Some(1001), gid: Some(1001), groups: vec![1001, 2000] }
    }

    fn spec() -> PodSpec {
        crate::testing::pod("p").build().spec
    }

    fn with_cap(cap: &str) -> impl Fn(&mut PodSpec) + '_ {
        move |s: &mut PodSpec| {
            s.containers[0].security_context = Some(SecurityContext {
                capabilities: Some(Capabilities { add: vec![cap.into()], drop: vec![] }),
                ..Default::default()
            })
        }
    }

    fn host_path(path: &str) -> impl Fn(&mut PodSpec) + '_ {
        move |s: &mut PodSpec| {
            s.volumes.push(Volume { name: "v".into(), host_path: HostPathVolume { path: path.into() } })
        }
    }

    /// (what, profile, change to the pod, the fields refused)
    #[test]
    fn each_profile_refuses_what_it_names_at_its_field() {
        type Change = Box<dyn Fn(&mut PodSpec)>;
        let sc = "spec.containers[0].securityContext";
        let cases: Vec<(&str, Profile, Change, Vec<String>)> = vec![
            ("a plain pod", Profile::Baseline, Box::new(|_| {}), vec![]),
            ("a plain pod, restricted", Profile::Restricted, Box::new(|_| {}), vec![]),
            (
                "SYS_ADMIN",
                Profile::Baseline,
                Box::new(with_cap("SYS_ADMIN")),
                vec![format!("{sc}.capabilities.add[0]")],
            ),
            (
                "DAC_READ_SEARCH",
                Profile::Baseline,
                Box::new(with_cap("cap_dac_read_search")),
                vec![format!("{sc}.capabilities.add[0]")],
            ),
            (
                "DAC_OVERRIDE on the host's users",
                Profile::Baseline,
                Box::new(with_cap("DAC_OVERRIDE")),
                vec![format!("{sc}.capabilities.add[0]")],
            ),
            (
                "DAC_OVERRIDE in a user namespace",
                Profile::Baseline,
                Box::new(|s: &mut PodSpec| {
                    s.host_users = Some(false);
                    with_cap("DAC_OVERRIDE")(s)
                }),
                vec![],
            ),
            ("NET_BIND_SERVICE", Profile::Baseline, Box::new(with_cap("NET_BIND_SERVICE")), vec![]),
            ("NET_BIND_SERVICE, restricted", Profile::Restricted, Box::new(with_cap("NET_BIND_SERVICE")), vec![]),
            (
                "KILL, restricted",
                Profile::Restricted,
                Box::new(with_cap("KILL")),
                vec![format!("{sc}.capabilities.add[0]")],
            ),
            ("SYS_NICE granted", Profile::Baseline, Box::new(with_cap("SYS_NICE")), vec![]),
            (
                "IPC_LOCK not granted",
                Profile::Baseline,
                Box::new(with_cap("IPC_LOCK")),
                vec![format!("{sc}.capabilities.add[0]")],
            ),
            (
                "SYS_NICE granted, restricted",
                Profile::Restricted,
                Box::new(with_cap("SYS_NICE")),
                vec![format!("{sc}.capabilities.add[0]")],
            ),
            ("hostPath /", Profile::Baseline, Box::new(host_path("/")), vec!["spec.volumes[0].hostPath.path".into()]),
            ("hostPath /srv/data", Profile::Baseline, Box::new(host_path("/srv/data")), vec![]),
            ("hostPath /srv", Profile::Baseline, Box::new(host_path("/srv/")), vec![]),
            (
                "hostPath /srvx",
                Profile::Baseline,
                Box::new(host_path("/srvx")),
                vec!["spec.volumes[0].hostPath.path".into()],
            ),
            (
                "hostPath climbing out",
                Profile::Baseline,
                Box::new(host_path("/srv/../etc")),
                vec!["spec.volumes[0].hostPath.path".into()],
            ),
            (
                "hostPath /srv, restricted",
                Profile::Restricted,
                Box::new(host_path("/srv/data")),
                vec!["spec.volumes[0].hostPath.path".into()],
            ),
            (
                "host network",
                Profile::Baseline,
                Box::new(|s: &mut PodSpec| s.host_network = true),
                vec!["spec.hostNetwork".into()],
            ),
            (
                "uid 0",
                Profile::Baseline,
                Box::new(|s: &mut PodSpec| {
                    s.security_context.get_or_insert_with(Default::default).run_as_user = Some(0)
                }),
                vec!["spec.securityContext.runAsUser".into()],
            ),
            (
                "another's uid in a container",
                Profile::Baseline,
                Box::new(|s: &mut PodSpec| {
                    s.containers[0].security_context =
                        Some(SecurityContext { run_as_user: Some(1002), ..Default::default() })
                }),
                vec![format!("{sc}.runAsUser")],
            ),
            (
                "root in a user namespace",
                Profile::Baseline,
                Box::new(|s: &mut PodSpec| {
                    s.host_users = Some(false);
                    s.security_context.get_or_insert_with(Default::default).run_as_user = Some(0);
                }),
                vec![],
            ),
            (
                "root in a user namespace, restricted",
                Profile::Restricted,
                Box::new(|s: &mut PodSpec| {
                    s.host_users = Some(false);
                    s.security_context.get_or_insert_with(Default::default).run_as_user = Some(0);
                }),
                vec!["spec.securityContext.runAsUser".into(), format!("{sc}")],
            ),
            (
                "a group not theirs",
                Profile::Baseline,
                Box::new(|s: &mut PodSpec| {
                    s.security_context.get_or_insert_with(Default::default).supplemental_groups = vec![0]
                }),
                vec!["spec.securityContext.supplementalGroups[0]".into()],
            ),
            (
                "everything, privileged",
                Profile::Privileged,
                Box::new(|s: &mut PodSpec| {
                    s.host_network = true;
                    host_path("/")(s);
                    with_cap("SYS_ADMIN")(s);
                    s.security_context.get_or_insert_with(Default::default).run_as_user = Some(0);
                }),
                vec![],
            ),
        ];
        let user = alice();
        let (allowed, granted) = (vec!["/srv".to_string(), "/scratch".to_string()], vec!["SYS_NICE".to_string()]);
        for (what, profile, change, want) in cases {
            let mut s = spec();
            change(&mut s);
            if profile != Profile::Privileged {
                run_as(&mut s, &user);
            }
            let policy = Policy {
                who: "user alice",
                profile,
                allowed_host_paths: &allowed,
                granted_capabilities: &granted,
                host_network: false,
                unix: Some(&user),
            };
            let got: Vec<String> = check(&s, "spec", &policy).into_iter().map(|e| e.field).collect();
            assert_eq!(got, want, "{what}");
        }
    }

    #[test]
    fn a_refusal_names_the_field_the_capability_the_person_and_the_profile() {
        let user = alice();
        let mut s = spec();
        with_cap("SYS_ADMIN")(&mut s);
        run_as(&mut s, &user);
        let policy = Policy {
            who: "user alice",
            profile: Profile::Baseline,
            allowed_host_paths: &[],
            granted_capabilities: &[],
            host_network: false,
            unix: Some(&user),
        };
        let e = check(&s, "spec", &policy);
        assert_eq!(
            e.iter().map(ToString::to_string).collect::<Vec<_>>(),
            ["spec.containers[0].securityContext.capabilities.add[0]: SYS_ADMIN is not allowed for user alice (profile baseline)"]
        );
    }

    #[test]
    fn run_as_fills_in_the_persons_ids_or_their_name_and_keeps_a_user_namespace_alone() {
        let mut s = spec();
        run_as(&mut s, &alice());
        let sc = s.security_context.expect("filled in");
        assert_eq!(
            (sc.run_as_user, sc.run_as_group, sc.supplemental_groups),
            (Some(1001), Some(1001), vec![1001, 2000])
        );

        let by_name = UnixUser { name: "bob".into(), uid: None, gid: None, groups: vec![] };
        let mut s = spec();
        run_as(&mut s, &by_name);
        let sc = s.security_context.expect("filled in");
        assert_eq!((sc.run_as_user, sc.run_as_user_name.as_deref()), (None, Some("bob")));

        let mut s = spec();
        s.host_users = Some(false);
        run_as(&mut s, &alice());
        assert_eq!(s.security_context, None);
    }

    #[test]
    fn host_paths_compare_by_component() {
        for (path, prefix, under) in [
            ("/srv", "/srv", true),
            ("/srv/a", "/srv", true),
            ("/srv//a/./b", "/srv/", true),
            ("/srvx", "/srv", false),
            ("/srv/../etc", "/srv", false),
            ("/../srv", "/srv", false),
            ("srv/a", "/srv", false),
            ("/anything", "/", true),
        ] {
            assert_eq!(is_under(path, prefix), under, "{path} under {prefix}");
        }
    }
}
