//! The server flags that `pinion server` and `pinion up` both take, declared
//! once so that their names, defaults and help cannot drift apart between the
//! two, and copied into [`ServerOptions`] in one place. Several groups rather
//! than one because each command lists them at a different place in its help.

use std::time::Duration;

use orchestrator::server::ServerOptions;

/// How long finished pods are kept.
#[derive(clap::Args, Debug)]
pub struct Retention {
    /// Seconds a finished pod (with its status and events) is kept when its
    /// spec sets no ttlSecondsAfterFinished; 0 keeps finished pods until deleted.
    #[arg(long, value_name = "SECONDS", default_value_t = 3600,
          value_parser = clap::value_parser!(u64).range(0..=specs::validate::MAX_TTL_SECONDS))]
    pub finished_pod_ttl: u64,
    /// Days the accounting records of finished jobs and pods (`pinion
    /// acct`) are kept after their end; 0 keeps them until deleted.
    #[arg(long, value_name = "DAYS", default_value_t = specs::acct::DEFAULT_RETENTION_DAYS,
          value_parser = clap::value_parser!(u64).range(0..=36_500))]
    pub acct_retention: u64,
}

impl Retention {
    pub fn apply(&self, opts: &mut ServerOptions) {
        opts.controller.finished_pod_ttl =
            (self.finished_pod_ttl > 0).then(|| Duration::from_secs(self.finished_pod_ttl));
        opts.controller.acct_retention =
            (self.acct_retention > 0).then(|| Duration::from_secs(self.acct_retention * 86_400));
    }
}

/// What becomes of a Deployment's pods on a node gone silent.
#[derive(clap::Args, Debug)]
pub struct NodeLoss {
    /// Seconds a Deployment's pod on a NotReady node is waited for before a
    /// replacement is made on another node, when its template sets no
    /// nodeLostReplaceAfterSeconds; `never` waits for the node.
    #[arg(long, value_name = "SECONDS|never", default_value = "300", value_parser = parse_replace_after)]
    pub node_lost_replace_after: specs::node_lost::ReplaceAfter,
}

impl NodeLoss {
    pub fn apply(&self, opts: &mut ServerOptions) {
        opts.controller.node_lost_replace_after = self.node_lost_replace_after;
    }
}

/// `SECONDS` (up to a year, the bound a template's own setting has) or `never`.
fn parse_replace_after(s: &str) -> Result<specs::node_lost::ReplaceAfter, String> {
    use specs::node_lost::ReplaceAfter;
    if s == "never" {
        return Ok(ReplaceAfter::Never);
    }
    let max = specs::validate::MAX_TTL_SECONDS;
    match s.parse::<u64>() {
        Ok(n) if n <= max => Ok(ReplaceAfter::Seconds(n)),
        Ok(_) => Err(format!("at most {max} seconds (a year), or never")),
        Err(_) => Err(format!("{s:?}: want a whole number of seconds or never")),
    }
}

/// What a person's pods may reach on a host, and how long certificates and
/// the first join token live.
#[derive(clap::Args, Debug)]
pub struct Access {
    /// Host folders under which a `baseline` person's pods may mount host
    /// paths (comma-separated absolute paths: `/srv,/scratch`); none by
    /// default. Admins' pods and `privileged` people are not limited.
    #[arg(long, value_name = "PATHS", value_delimiter = ',', value_parser = parse_host_path)]
    pub allowed_host_paths: Vec<String>,
    /// How long a node's certificate lives (`30d`, `12h`, `90s`); nodes
    /// renew theirs two thirds into its life.
    #[arg(long, value_name = "DURATION", default_value = "30d", value_parser = crate::common::parse_duration)]
    pub node_cert_ttl: Duration,
    /// How long a person's certificate (`pinion user add`) lives; the CLI
    /// renews its file two thirds into its life.
    #[arg(long, value_name = "DURATION", default_value = "30d", value_parser = crate::common::parse_duration)]
    pub user_cert_ttl: Duration,
    /// How long the join token made at the first start admits nodes, from
    /// that start (`0`: until `pinion token revoke bootstrap`); later starts
    /// never renew it (make others with `pinion token create`).
    #[arg(long, value_name = "DURATION", default_value = "24h", value_parser = crate::common::parse_duration)]
    pub join_token_ttl: Duration,
}

impl Access {
    pub fn apply(&self, opts: &mut ServerOptions) -> anyhow::Result<()> {
        opts.allowed_host_paths = self.allowed_host_paths.clone();
        opts.lifetimes = lifetimes(self.node_cert_ttl, self.user_cert_ttl)?;
        opts.join_token_ttl = (!self.join_token_ttl.is_zero()).then_some(self.join_token_ttl);
        Ok(())
    }
}

/// The cluster range that each node's pod range is cut from.
#[derive(clap::Args, Debug)]
pub struct PodNetwork {
    /// The cluster range each node's pod range comes from (IPv4
    /// `A.B.C.D/N`); every server of a cluster must give the same.
    #[arg(long, value_name = "CIDR", default_value = specs::net::DEFAULT_CLUSTER_RANGE)]
    pub pod_cidr: String,
    /// The prefix length of each node's pod range: 24 is 254 pods per node,
    /// and 256 nodes in a /16.
    #[arg(long, value_name = "BITS", default_value_t = specs::net::DEFAULT_NODE_PREFIX)]
    pub node_cidr_mask_size: u8,
}

impl PodNetwork {
    pub fn apply(&self, opts: &mut ServerOptions) -> anyhow::Result<()> {
        use specs::net::{PodRanges, PodRangesError};
        opts.pod_ranges = PodRanges::parse(&self.pod_cidr, self.node_cidr_mask_size).map_err(|e| match e {
            PodRangesError::Cluster { given, reason } => anyhow::anyhow!("--pod-cidr {given}: {reason}"),
            PodRangesError::NodePrefix { prefix, reason } => {
                anyhow::anyhow!("--node-cidr-mask-size {prefix}: {reason}")
            }
        })?;
        Ok(())
    }
}

/// The certificate lifetimes from the flags; a zero one would issue
/// certificates already expired.
fn lifetimes(node: Duration, user: Duration) -> anyhow::Result<orchestrator::tls::Lifetimes> {
    if node.is_zero() || user.is_zero() {
        anyhow::bail!("--node-cert-ttl and --user-cert-ttl: a certificate must live at least a second");
    }
    Ok(orchestrator::tls::Lifetimes { node, user, ..Default::default() })
}

/// An absolute path without `..`: a prefix that climbs out would allow more
/// than it names.
fn parse_host_path(s: &str) -> Result<String, String> {
    if !s.starts_with('/') || s.split('/').any(|p| p == "..") || s.contains('\0') {
        return Err(format!("{s:?}: want an absolute path without \"..\""));
    }
    Ok(s.to_string())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::{Cli, Command};

    /// What the shared flags set, as `pinion server` or `pinion up` parses them.
    type Set = (
        (Option<Duration>, Option<Duration>),
        Vec<String>,
        orchestrator::tls::Lifetimes,
        Option<Duration>,
        specs::net::PodRanges,
    );

    fn check(args: &[&str]) -> Result<Set, String> {
        let cli = Cli::try_parse_from(args).map_err(|e| e.to_string())?;
        let (retention, access, pod_network) = match cli.command {
            Command::Server(a) => (a.retention, a.access, a.pod_network),
            Command::Up(a) => (a.retention, a.access, a.pod_network),
            other => panic!("not a server command: {other:?}"),
        };
        let mut opts = ServerOptions::new("/nonexistent", "127.0.0.1:0");
        retention.apply(&mut opts);
        access.apply(&mut opts).map_err(|e| e.to_string())?;
        pod_network.apply(&mut opts).map_err(|e| e.to_string())?;
        Ok((
            (opts.controller.finished_pod_ttl, opts.controller.acct_retention),
            opts.allowed_host_paths,
            opts.lifetimes,
            opts.join_token_ttl,
            opts.pod_ranges,
        ))
    }

    #[test]
    fn server_and_up_set_the_same_options_from_the_same_flags() {
        let flags = [
            "--finished-pod-ttl=0",
            "--acct-retention=7",
            "--allowed-host-paths=/srv,/scratch",
            "--node-cert-ttl=12h",
            "--user-cert-ttl=90s",
            "--join-token-ttl=0",
            "--pod-cidr=10.8.0.0/14",
            "--node-cidr-mask-size=26",
        ];
        let lifetimes = orchestrator::tls::Lifetimes {
            node: Duration::from_secs(12 * 3600),
            user: Duration::from_secs(90),
            ..Default::default()
        };
        let ranges = specs::net::PodRanges::parse("10.8.0.0/14", 26).expect("ranges");
        let expected = (
            (None, Some(Duration::from_secs(7 * 86_400))),
            vec!["/srv".to_string(), "/scratch".to_string()],
            lifetimes,
            None,
            ranges,
        );
        for verb in ["server", "up"] {
            let args: Vec<&str> = ["pinion", verb].into_iter().chain(flags).collect();
            assert_eq!(check(&args), Ok(expected.clone()), "pinion {verb}");
        }
        let defaults = check(&["pinion", "server"]).expect("defaults");
        let month = Some(Duration::from_secs(30 * 86_400));
        assert_eq!(
            (defaults.0, defaults.3),
            ((Some(Duration::from_secs(3600)), month), Some(Duration::from_secs(24 * 3600)))
        );
        assert_eq!(defaults.4, specs::net::PodRanges::parse("10.213.0.0/16", 24).expect("ranges"));
        assert_eq!(check(&["pinion", "up"]), Ok(defaults));
    }

    #[test]
    fn a_zero_certificate_life_or_a_climbing_host_path_is_refused() {
        assert_eq!(
            check(&["pinion", "up", "--user-cert-ttl=0"]),
            Err("--node-cert-ttl and --user-cert-ttl: a certificate must live at least a second".into())
        );
        for path in ["srv", "/srv/../etc"] {
            let arg = format!("--allowed-host-paths={path}");
            let err = check(&["pinion", "server", &arg]).expect_err(path);
            assert!(err.contains(&format!("{path:?}: want an absolute path without \"..\"")), "{err}");
        }
    }

    #[test]
    fn a_pod_range_that_cannot_be_cut_is_refused_naming_its_flag() {
        for (verb, flags, want) in [
            (
                "server",
                ["--pod-cidr=10.213.0.1/16", "--node-cidr-mask-size=24"],
                "--pod-cidr 10.213.0.1/16: has host bits set: the range is 10.213.0.0/16",
            ),
            (
                "up",
                ["--pod-cidr=fd00::/48", "--node-cidr-mask-size=64"],
                "--pod-cidr fd00::/48: IPv6 pod ranges are not supported; give an IPv4 range",
            ),
            (
                "server",
                ["--pod-cidr=10.213.0.0/16", "--node-cidr-mask-size=12"],
                "--node-cidr-mask-size 12: is larger than the cluster range 10.213.0.0/16",
            ),
            (
                "up",
                ["--pod-cidr=10.213.0.0/16", "--node-cidr-mask-size=32"],
                "--node-cidr-mask-size 32: leaves no address for a pod (at most /30)",
            ),
        ] {
            let args: Vec<&str> = ["pinion", verb].into_iter().chain(flags).collect();
            assert_eq!(check(&args).map(|_| ()), Err(want.to_string()), "{args:?}");
        }
    }
}
