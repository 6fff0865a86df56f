use super::*;

fn q(s: &str) -> Quantity {
    Quantity::parse(s).expect(s)
}

/// `script`'s directives as `expected`, or its error.
fn check(script: &str, expected: Result<BatchOptions, BatchError>) {
    assert_eq!(parse_script(script), expected, "{script}");
}

fn line(n: usize) -> At {
    At::Line(n)
}

#[test]
fn directives_in_the_leading_comment_block() {
    check(
        "#!/bin/bash\n#SBATCH -J sweep\n#SBATCH --nodes=2 --ntasks-per-node 4\n\n# a comment\n#PINION -c 2\n#SBATCH --mem=4G\nsrun hostname\n#SBATCH --time=5\n",
        Ok(BatchOptions {
            job_name: Some("sweep".into()),
            nodes: Some(2),
            ntasks_per_node: Some(4),
            cpus_per_task: Some(2),
            mem: Some(q("4Gi")),
            ..Default::default()
        }),
    );
    // The first command ends them, even after blanks; a shebang is needed.
    check(
        "#!/bin/sh\n#SBATCH -n 3\n\necho hi\n#SBATCH -n 5\n",
        Ok(BatchOptions { ntasks: Some(3), ..Default::default() }),
    );
    check("#SBATCH -n 3\necho hi\n", Err(BatchError::NoShebang));
    // `#SBATCHX` and `# SBATCH` are comments, as to sbatch.
    check("#!/bin/sh\n#SBATCHX -n 3\n# SBATCH -n 4\n#SBATCH\n", Ok(BatchOptions::default()));
    // A comment after the options; quoted values.
    check(
        "#!/bin/sh\n#SBATCH -o 'out-%j.txt' # where it goes\n#SBATCH --error=\"err.txt\"\n",
        Ok(BatchOptions { output: Some("out-%j.txt".into()), error: Some("err.txt".into()), ..Default::default() }),
    );
    check(
        "#!/bin/sh\n#SBATCH --exclusive -A physics -p gpu --gres=gpu:2 -d afterok:prep --array=1-4%2 -t 1-0\n",
        Ok(BatchOptions {
            exclusive: true,
            account: Some("physics".into()),
            partition: Some("gpu".into()),
            gpus: Some(2),
            dependency: Some(crate::dependency::parse("afterok:prep").expect("dep")),
            array: Some("1-4%2".into()),
            time: Some(Some(86_400)),
            ..Default::default()
        }),
    );
    check(
        "#!/bin/sh\n#SBATCH --gpus=a100:3 --mem-per-cpu=500\n",
        Ok(BatchOptions { gpus: Some(3), mem_per_cpu: Some(q("500Mi")), ..Default::default() }),
    );
    check("#!/bin/sh\n#SBATCH -t UNLIMITED\n", Ok(BatchOptions { time: Some(None), ..Default::default() }));
}

#[test]
fn each_error_names_its_line() {
    let e = |at, option: &str, value: &str, why: &str| {
        Err(BatchError::BadValue { at, option: option.into(), value: value.into(), why: why.into() })
    };
    check("#!/bin/sh\n#SBATCH --qos=high\n", Err(BatchError::Unknown { at: line(2), option: "--qos".into() }));
    check(
        "#!/bin/sh\n#SBATCH -n 1\n\n#SBATCH -w node1\n",
        Err(BatchError::Unknown { at: line(4), option: "-w".into() }),
    );
    check("#!/bin/sh\n#SBATCH hello\n", Err(BatchError::Unknown { at: line(2), option: "hello".into() }));
    check("#!/bin/sh\n#SBATCH -J\n", Err(BatchError::MissingValue { at: line(2), option: "--job-name".into() }));
    check(
        "#!/bin/sh\n#SBATCH --exclusive=user\n",
        Err(BatchError::UnexpectedValue { at: line(2), option: "--exclusive".into(), value: "user".into() }),
    );
    check("#!/bin/sh\n#SBATCH -N 0\n", e(line(2), "--nodes", "0", "at least 1"));
    check("#!/bin/sh\n#SBATCH -n x\n", e(line(2), "--ntasks", "x", "a whole number"));
    check(
        "#!/bin/sh\n\n#SBATCH -t 1:2:3:4\n",
        e(line(3), "--time", "1:2:3:4", "expected M, M:S, H:M:S, D-H, D-H:M or D-H:M:S"),
    );
    check(
        "#!/bin/sh\n#SBATCH --mem=4X\n",
        e(line(2), "--mem", "4X", "a whole number with an optional unit K, M, G or T (megabytes without one)"),
    );
    check(
        "#!/bin/sh\n#SBATCH -o out-%N\n",
        e(line(2), "--output", "out-%N", "%N: only %j, %x, %a, %A and %% are known"),
    );
    check(
        "#!/bin/sh\n#SBATCH -J Big_Name\n",
        e(
            line(2),
            "--job-name",
            "Big_Name",
            "a job name is a DNS-1123 label (1-63 of a-z 0-9 -, alphanumeric at both ends)",
        ),
    );
    check("#!/bin/sh\n#SBATCH --gres=fpga:1\n", e(line(2), "--gres", "fpga:1", "only gpu:N (or gpu:TYPE:N) is known"));
    check(
        "#!/bin/sh\n#SBATCH -d afterok\n",
        e(line(2), "--dependency", "afterok", "afterok: names no job (write afterok:JOB)"),
    );
    check("", Err(BatchError::Empty));
    let big = format!("#!/bin/sh\n{}", "x".repeat(MAX_SCRIPT_BYTES));
    assert_eq!(parse_script(&big), Err(BatchError::TooLarge { size: big.len() }));
    let msg = parse_script("#!/bin/sh\n#SBATCH --qos=high\n").expect_err("unknown").to_string();
    assert!(msg.starts_with("line 2: unknown option \"--qos\""), "{msg}");
}

#[test]
fn the_command_line_wins() {
    let script = parse_script("#!/bin/sh\n#SBATCH -J a -n 4 -t 10 --exclusive -o x.out\n").expect("script");
    let args: Vec<String> = ["-n", "2", "--time=1:00:00", "-Jb"].iter().map(|s| s.to_string()).collect();
    let cli = parse_args(&args).expect("args");
    assert_eq!(
        cli.over(script),
        BatchOptions {
            job_name: Some("b".into()),
            ntasks: Some(2),
            time: Some(Some(3600)),
            exclusive: true,
            output: Some("x.out".into()),
            ..Default::default()
        }
    );
    let bad: Vec<String> = ["--nodes"].iter().map(|s| s.to_string()).collect();
    assert_eq!(parse_args(&bad), Err(BatchError::MissingValue { at: At::CommandLine, option: "--nodes".into() }));
}

#[test]
fn slurms_time_formats() {
    let cases: &[(&str, Result<Option<u64>, &str>)] = &[
        ("5", Ok(Some(300))),
        ("5:30", Ok(Some(330))),
        ("1:02:03", Ok(Some(3723))),
        ("2-3", Ok(Some(2 * 86_400 + 3 * 3600))),
        ("2-3:04", Ok(Some(2 * 86_400 + 3 * 3600 + 240))),
        ("2-3:04:05", Ok(Some(2 * 86_400 + 3 * 3600 + 245))),
        ("0:1", Ok(Some(1))),
        ("infinite", Ok(None)),
        ("0", Err("a time limit of 0 would end the job at once")),
        ("", Err("expected M, M:S, H:M:S, D-H, D-H:M or D-H:M:S")),
        ("1-", Err("expected M, M:S, H:M:S, D-H, D-H:M or D-H:M:S")),
        ("1-2:3:4:5", Err("expected M, M:S, H:M:S, D-H, D-H:M or D-H:M:S")),
        ("-5", Err("expected M, M:S, H:M:S, D-H, D-H:M or D-H:M:S")),
        ("1h", Err("expected M, M:S, H:M:S, D-H, D-H:M or D-H:M:S")),
        ("400-0", Err("at most 31536000 seconds (a year)")),
    ];
    for (s, want) in cases {
        assert_eq!(parse_time(s), want.map_err(str::to_string), "{s}");
    }
}

#[test]
fn output_patterns() {
    let plain = Names { job_id: "sim", job_name: "sim", task: None, array: None };
    let task = Names { job_id: "sweep-3", job_name: "sweep", task: Some(3), array: Some("sweep") };
    let cases: &[(&str, &Names<'_>, Result<&str, &str>)] = &[
        ("pinion-%j.out", &plain, Ok("pinion-sim.out")),
        ("%x-%A_%a.log", &task, Ok("sweep-sweep_3.log")),
        ("%j", &task, Ok("sweep-3")),
        ("100%%-%a", &plain, Ok("100%-4294967294")),
        ("%A", &plain, Ok("sim")),
        ("a%", &plain, Err("a lone % at the end (write %% for a percent sign)")),
        ("%u", &plain, Err("%u: only %j, %x, %a, %A and %% are known")),
    ];
    for (p, names, want) in cases {
        assert_eq!(expand(p, names), want.map(str::to_string).map_err(str::to_string), "{p}");
    }
}

#[test]
fn slurms_memory_units() {
    let cases: &[(&str, Result<&str, ()>)] = &[
        ("100", Ok("100Mi")),
        ("100M", Ok("100Mi")),
        ("2G", Ok("2Gi")),
        ("2g", Ok("2Gi")),
        ("512K", Ok("512Ki")),
        ("1T", Ok("1Ti")),
        ("4GB", Ok("4Gi")),
        ("0", Err(())),
        ("1.5G", Err(())),
        ("G", Err(())),
    ];
    for (s, want) in cases {
        assert_eq!(parse_memory(s).map(|q| q.to_string()).map_err(|_| ()), want.map(str::to_string), "{s}");
    }
}

#[test]
fn options_go_before_or_after_the_script_and_its_arguments_after_two_dashes() {
    let w = |s: &str| -> Vec<String> { s.split_whitespace().map(str::to_string).collect() };
    let ok = |opts: &str, script: &str, args: &str| -> Result<Invocation, BatchError> {
        Ok(Invocation { options: w(opts), script: script.into(), args: w(args) })
    };
    let cases: Vec<(&str, Result<Invocation, BatchError>)> = vec![
        ("s.sh", ok("", "s.sh", "")),
        ("-J x s.sh", ok("-J x", "s.sh", "")),
        ("s.sh -n 2 --time=5", ok("-n 2 --time=5", "s.sh", "")),
        ("-J x s.sh -t 5 -- a -b --", ok("-J x -t 5", "s.sh", "a -b --")),
        ("--exclusive s.sh", ok("--exclusive", "s.sh", "")),
        ("-Jx s.sh", ok("-Jx", "s.sh", "")),
        ("-o out s.sh -- a", ok("-o out", "s.sh", "a")),
        ("-J x", Err(BatchError::NoScript)),
        ("-- s.sh", Err(BatchError::NoScript)),
        ("s.sh a b", Err(BatchError::AfterScript { word: "a".into() })),
    ];
    for (line, want) in cases {
        assert_eq!(split_invocation(&w(line)), want, "{line}");
    }
}
