//! Which test binaries of the suite run beside which (`ci_suite`, the runner
//! `.ci/run` uses). `cargo test` runs its test binaries one after another, and
//! four of them spend minutes waiting: on a QEMU guest, on etcd elections, on
//! clock jumps, on Schemathesis. They touch nothing of the host's but loopback
//! ports they bind at 0 and folders of their own, so they run in lanes of their
//! own beside the rest, which keep cargo's order and run one at a time as before:
//! the tests that use real containers, cgroups, CNI networks and leak checks over
//! the whole host never meet each other.

/// One test binary as cargo built it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TestBinary {
    pub package: String,
    /// `lib`, `bin` or `test` (cargo's target kind).
    pub kind: String,
    pub name: String,
}

impl TestBinary {
    /// The arguments that make `cargo test` run this binary alone, as cargo's own
    /// "N targets failed" list names them.
    pub fn cargo_args(&self) -> String {
        match self.kind.as_str() {
            "lib" => format!("-p {} --lib", self.package),
            kind => format!("-p {} --{kind} {}", self.package, self.name),
        }
    }
}

/// The side lanes: integration tests of the `e2e` package, each lane run in
/// order. In the suite on a 2-core host (BENCHMARKS.md): qemu_numa about
/// 370 s (two guests, one after the other), schemathesis 83 s, clock_jump
/// 38 s, failover 34 s, against 372 s for the serial rest.
pub const SIDE_LANES: &[&[&str]] = &[&["qemu_numa"], &["failover", "clock_jump", "schemathesis"]];

/// `binaries` in lanes: lane 0 holds every binary no side lane names, in the
/// order given; then the side lanes, each with those of its names that were
/// built. With `parallel` false, one lane holds everything in the order given.
pub fn lanes(binaries: &[TestBinary], parallel: bool) -> Vec<Vec<TestBinary>> {
    let beside = |b: &TestBinary| {
        b.package == "e2e" && b.kind == "test" && SIDE_LANES.iter().any(|lane| lane.contains(&b.name.as_str()))
    };
    if !parallel {
        return vec![binaries.to_vec()];
    }
    let mut out = vec![binaries.iter().filter(|b| !beside(b)).cloned().collect::<Vec<_>>()];
    for lane in SIDE_LANES {
        let side: Vec<TestBinary> =
            lane.iter().filter_map(|name| binaries.iter().find(|b| beside(b) && b.name == *name)).cloned().collect();
        if !side.is_empty() {
            out.push(side);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bin(package: &str, kind: &str, name: &str) -> TestBinary {
        TestBinary { package: package.into(), kind: kind.into(), name: name.into() }
    }

    fn names(lanes: &[Vec<TestBinary>]) -> Vec<Vec<&str>> {
        lanes.iter().map(|l| l.iter().map(|b| b.name.as_str()).collect()).collect()
    }

    #[test]
    fn the_waiting_e2e_binaries_run_beside_the_rest_which_keep_their_order() {
        let built = [
            bin("cli", "test", "up_real"),
            bin("e2e", "test", "clock_jump"),
            bin("e2e", "test", "failover"),
            bin("e2e", "test", "qemu_numa"),
            bin("e2e", "test", "scenarios"),
            bin("e2e", "test", "schemathesis"),
            bin("nodelet", "lib", "nodelet"),
            // Same name, another package: not the e2e test, stays in lane 0.
            bin("nodelet", "test", "failover"),
        ];
        let cases: &[(bool, Vec<Vec<&str>>)] = &[
            (
                true,
                vec![
                    vec!["up_real", "scenarios", "nodelet", "failover"],
                    vec!["qemu_numa"],
                    vec!["failover", "clock_jump", "schemathesis"],
                ],
            ),
            (
                false,
                vec![vec![
                    "up_real",
                    "clock_jump",
                    "failover",
                    "qemu_numa",
                    "scenarios",
                    "schemathesis",
                    "nodelet",
                    "failover",
                ]],
            ),
        ];
        for (parallel, want) in cases {
            assert_eq!(names(&lanes(&built, *parallel)), *want, "parallel: {parallel}");
        }
    }

    #[test]
    fn a_side_lane_with_nothing_built_is_left_out() {
        let built = [bin("e2e", "test", "failover"), bin("specs", "lib", "specs")];
        assert_eq!(names(&lanes(&built, true)), vec![vec!["specs"], vec!["failover"]]);
        assert_eq!(names(&lanes(&[], true)), vec![Vec::<&str>::new()]);
    }

    #[test]
    fn cargo_args_name_the_target_as_cargo_does() {
        assert_eq!(bin("nodelet", "lib", "nodelet").cargo_args(), "-p nodelet --lib");
        assert_eq!(bin("e2e", "test", "qemu_numa").cargo_args(), "-p e2e --test qemu_numa");
        assert_eq!(bin("cli", "bin", "pinion").cargo_args(), "-p cli --bin pinion");
    }
}
