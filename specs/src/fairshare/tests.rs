use super::*;

const W: Weights = DEFAULT_WEIGHTS;
const WEEK: i64 = 7 * 86_400;

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9 * b.abs().max(1.0)
}

#[test]
fn usage_halves_every_half_life_and_charges_add() {
    let u = Decayed { cpu_seconds: 800.0, at: 1000 };
    for (now, expected) in [(1000, 800.0), (1000 + WEEK, 400.0), (1000 + 3 * WEEK, 100.0), (0, 800.0)] {
        assert!(close(u.at(now, W.half_life_seconds), expected), "{now}: {}", u.at(now, W.half_life_seconds));
    }
    let charged = u.charge(100.0, 1000 + WEEK, W.half_life_seconds);
    assert_eq!(charged.at, 1000 + WEEK);
    assert!(close(charged.cpu_seconds, 500.0), "{charged:?}");
    // A charge dated before the record is counted at the record's time.
    let early = u.charge(10.0, 0, W.half_life_seconds);
    assert_eq!((early.at, early.cpu_seconds), (1000, 810.0));
    assert_eq!(Decayed::default().charge(-5.0, 7, 1).cpu_seconds, 0.0);
}

#[test]
fn the_share_factor_is_one_for_none_and_falls_with_use() {
    for (used, total, holders, expected) in [
        (0.0, 0.0, 0, 1.0),
        (0.0, 100.0, 2, 1.0),
        // Used exactly its share: one half.
        (50.0, 100.0, 2, 0.5),
        // All of it among two: a quarter.
        (100.0, 100.0, 2, 0.25),
        (25.0, 100.0, 4, 0.5),
        (100.0, 100.0, 1, 0.5),
    ] {
        let f = share_factor(used, total, holders);
        assert!(close(f, expected), "{used}/{total} among {holders}: {f}");
    }
}

fn record(name: &str, cpu_seconds: f64, at: i64) -> Usage {
    Usage {
        api_version: crate::pod::API_VERSION.into(),
        kind: "Usage".into(),
        metadata: ObjectMeta { name: name.into(), ..Default::default() },
        usage: Decayed { cpu_seconds, at },
    }
}

#[test]
fn the_ledger_judges_users_and_accounts_from_decayed_usage() {
    let records = [
        record("user.alice", 300.0, 0),
        record("user.bob", 100.0, 0),
        record("account.physics", 400.0, 0),
        record("account.bio", 0.0, 0),
        record("stray", 5.0, 0),
    ];
    let l = Ledger::new(&records, WEEK, &W);
    // alice 150 and bob 50 of 200 after a week: 2^(-0.75/0.5) and 2^(-0.25/0.5).
    assert!(close(l.factor("alice", None), 0.5f64.powf(1.5)), "{}", l.factor("alice", None));
    assert!(close(l.factor("bob", None), 0.5f64.sqrt()));
    // A newcomer has used nothing: 1.
    assert_eq!(l.factor("carol", None), 1.0);
    // The account's averaged in: physics used all of it among two (0.25).
    assert!(close(l.factor("bob", Some("physics")), (0.5f64.sqrt() + 0.25) / 2.0));
    assert!(close(l.factor("bob", Some("chem")), (0.5f64.sqrt() + 1.0) / 2.0));
    let shares = l.shares();
    let named: Vec<(&str, &str)> = shares.iter().map(|s| (s.kind.as_str(), s.name.as_str())).collect();
    assert_eq!(named, [("user", "alice"), ("user", "bob"), ("account", "bio"), ("account", "physics")]);
    assert!(close(shares[0].usage, 150.0) && close(shares[0].usage_share, 0.75), "{shares:?}");
    assert!(close(shares[0].fair_share, l.factor("alice", None)));
    assert_eq!(Holder::of("user.x"), Some(Holder::User("x")));
    assert_eq!(Holder::Account("p").record(), "account.p");
}

#[test]
fn priority_adds_the_weighted_factors() {
    // (site, age, cpus of 100, fair share) -> priority.
    for (site, age, cpus, fs, expected) in [
        (0, 0, 0.0, 1.0, 10_000),
        (0, 0, 0.0, 0.25, 2_500),
        (0, WEEK as u64, 0.0, 0.0, 1_000),
        (0, 2 * WEEK as u64, 0.0, 0.0, 1_000),
        (0, 86_400, 50.0, 0.5, 143 + 500 + 5_000),
        (100, 0, 100.0, 1.0, 100 + 1_000 + 10_000),
        (-50, 0, 500.0, 0.0, -50 + 1_000),
    ] {
        let f = Factors::new(age, cpus, 100.0, fs, &W);
        let p = priority(base_priority(site, &f, &W), age, &W);
        assert_eq!(p, expected, "site {site}, age {age}, {cpus} CPUs, fair share {fs}");
    }
}

#[test]
fn the_order_key_orders_as_priority_does_at_any_time() {
    // (base, eligible at): ordered by the key, and by priority at several times.
    let jobs = [(5_000, 0), (5_000, 3_600), (5_100, 86_400), (2_500, 100)];
    for now in [86_400, 2 * 86_400, 5 * 86_400] {
        let mut by_key: Vec<usize> = (0..jobs.len()).collect();
        by_key.sort_by_key(|i| std::cmp::Reverse(order_key(jobs[*i].0, jobs[*i].1, &W)));
        let mut by_priority: Vec<usize> = (0..jobs.len()).collect();
        let p = |i: usize| priority(jobs[i].0, (now - jobs[i].1) as u64, &W) * 1000;
        by_priority.sort_by_key(|i| std::cmp::Reverse(p(*i)));
        assert_eq!(by_key, by_priority, "at {now}");
    }
    // An earlier eligibility is worth its age: a day is 1000/7 points.
    assert_eq!(order_key(0, 0, &W) - order_key(0, 86_400, &W), 142_857);
}
