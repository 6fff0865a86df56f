//! Job scripts (`pinion batch`, Slurm's `sbatch`): the `#SBATCH` and
//! `#PINION` directives of a script's leading comment block, the same options
//! given on the command line, and what they mean in Slurm's words. Pure: the
//! CLI reads the script and the clock; this module turns text into
//! [`BatchOptions`] or an error that names the line.
//!
//! Slurm's rule for where directives end is kept: after an optional shebang,
//! directives are read from the comment and blank lines at the top, and the
//! first other line (a command) ends them; a `#SBATCH` further down is a
//! comment, as it is to `sbatch`. An option this module does not know is an
//! error naming its line, never a silent skip: a lab moving its scripts
//! learns at submission what Pinion does not do.

use std::fmt;

use crate::quantity::Quantity;

/// The largest script `pinion batch` carries to the node: the script travels
/// as one argument of the job's command, which validation bounds at this.
pub use crate::limits::MAX_STRING_LEN as MAX_SCRIPT_BYTES;

/// Label on a batch job: its account (`-A`), for accounting.
pub const ACCOUNT_LABEL: &str = "pinion.io/account";
/// Annotation on a batch job: it asked for whole nodes (`--exclusive`),
/// recorded only (each task's CPUs are exclusive anyway).
pub const EXCLUSIVE_ANNOTATION: &str = "pinion.io/exclusive";
/// Annotation on a member pod: the host path its stdout (and its stderr,
/// unless [`ERROR_ANNOTATION`] says otherwise) is appended to on the node,
/// opened as the pod's user.
pub const OUTPUT_ANNOTATION: &str = "pinion.io/output";
/// Annotation on a member pod: the host path its stderr is appended to.
pub const ERROR_ANNOTATION: &str = "pinion.io/error";
/// Annotation on a batch job: the script's file name, as submitted.
pub const SCRIPT_ANNOTATION: &str = "pinion.io/batch-script";
/// Label on a batch job: its name as `-J` gave it (or the script's), which
/// `%x` stands for; the job's id (its object name, `%j`) may differ.
pub const NAME_LABEL: &str = "pinion.io/batch-name";
/// The default output file, in the submission's working directory.
pub const DEFAULT_OUTPUT: &str = "pinion-%j.out";

/// What a script and its command line ask for; `None` and `false`: not said.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BatchOptions {
    pub job_name: Option<String>,
    pub nodes: Option<u32>,
    pub ntasks: Option<u32>,
    pub ntasks_per_node: Option<u32>,
    pub cpus_per_task: Option<u32>,
    /// Memory per node (Slurm's `--mem`).
    pub mem: Option<Quantity>,
    pub mem_per_cpu: Option<Quantity>,
    /// The time limit in seconds (`-t`); `Some(None)`: `UNLIMITED`.
    pub time: Option<Option<u64>>,
    pub output: Option<String>,
    pub error: Option<String>,
    pub array: Option<String>,
    pub dependency: Option<crate::dependency::Dependency>,
    pub gpus: Option<u32>,
    pub exclusive: bool,
    pub account: Option<String>,
    pub partition: Option<String>,
    pub priority: Option<i32>,
    pub chdir: Option<String>,
}

impl BatchOptions {
    /// `self` (the command line) over `under` (the script's directives):
    /// what the command line says wins, option by option.
    pub fn over(self, under: BatchOptions) -> BatchOptions {
        BatchOptions {
            job_name: self.job_name.or(under.job_name),
            nodes: self.nodes.or(under.nodes),
            ntasks: self.ntasks.or(under.ntasks),
            ntasks_per_node: self.ntasks_per_node.or(under.ntasks_per_node),
            cpus_per_task: self.cpus_per_task.or(under.cpus_per_task),
            mem: self.mem.or(under.mem),
            mem_per_cpu: self.mem_per_cpu.or(under.mem_per_cpu),
            time: self.time.or(under.time),
            output: self.output.or(under.output),
            error: self.error.or(under.error),
            array: self.array.or(under.array),
            dependency: self.dependency.or(under.dependency),
            gpus: self.gpus.or(under.gpus),
            exclusive: self.exclusive || under.exclusive,
            account: self.account.or(under.account),
            partition: self.partition.or(under.partition),
            priority: self.priority.or(under.priority),
            chdir: self.chdir.or(under.chdir),
        }
    }
}

/// Where a bad option was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum At {
    /// A directive on this line of the script (1-based).
    Line(usize),
    CommandLine,
}

impl fmt::Display for At {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            At::Line(n) => write!(f, "line {n}"),
            At::CommandLine => f.write_str("command line"),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BatchError {
    #[error("{at}: unknown option {option:?} (pinion batch does not know it; see `pinion batch --help`)")]
    Unknown { at: At, option: String },
    #[error("{at}: {option} needs a value")]
    MissingValue { at: At, option: String },
    #[error("{at}: {option} takes no value, got {value:?}")]
    UnexpectedValue { at: At, option: String, value: String },
    #[error("{at}: {option} {value:?}: {why}")]
    BadValue { at: At, option: String, value: String, why: String },
    #[error("the script is {size} bytes; at most {MAX_SCRIPT_BYTES}")]
    TooLarge { size: usize },
    #[error("the script is empty")]
    Empty,
    #[error("{word:?} after the script: the script's arguments go after -- (pinion batch SCRIPT -- ARGS)")]
    AfterScript { word: String },
    #[error("no script given (pinion batch [OPTIONS] SCRIPT [OPTIONS] [-- ARGS])")]
    NoScript,
    #[error("line 1: a batch script starts with #! and its interpreter (e.g. #!/bin/bash), as sbatch asks")]
    NoShebang,
}

/// The options the script's leading comment block gives (`#SBATCH` and
/// `#PINION` lines).
pub fn parse_script(script: &str) -> Result<BatchOptions, BatchError> {
    if script.len() > MAX_SCRIPT_BYTES {
        return Err(BatchError::TooLarge { size: script.len() });
    }
    if script.trim().is_empty() {
        return Err(BatchError::Empty);
    }
    if !script.starts_with("#!") {
        return Err(BatchError::NoShebang);
    }
    let mut out = BatchOptions::default();
    for (i, line) in script.lines().enumerate() {
        let n = i + 1;
        let t = line.trim_start();
        if n == 1 {
            continue;
        }
        if t.is_empty() {
            continue;
        }
        if !t.starts_with('#') {
            // The first command ends the directives (Slurm's rule).
            break;
        }
        let Some(rest) = t.strip_prefix("#SBATCH").or_else(|| t.strip_prefix("#PINION")) else { continue };
        // `#SBATCHX` is a comment; a directive is the word and then space.
        if !(rest.is_empty() || rest.starts_with(char::is_whitespace)) {
            continue;
        }
        // A `#` after the options starts a comment, as Slurm reads it.
        let rest = match rest.find(" #") {
            Some(i) => &rest[..i],
            None => rest,
        };
        let words: Vec<String> = rest.split_whitespace().map(unquote).collect();
        apply(&mut out, &words, At::Line(n))?;
    }
    Ok(out)
}

/// The options given on the command line (`pinion batch SCRIPT FLAGS`).
pub fn parse_args(args: &[String]) -> Result<BatchOptions, BatchError> {
    let mut out = BatchOptions::default();
    apply(&mut out, args, At::CommandLine)?;
    Ok(out)
}

/// A `pinion batch` command line: options, then the script, then options
/// again, then `--` and the script's arguments (sbatch's `[options] script`
/// and Pinion's `SCRIPT [options] [-- args]` alike). Returns the options,
/// the script and its arguments; the options are checked by [`parse_args`].
pub fn split_invocation(words: &[String]) -> Result<Invocation, BatchError> {
    let mut options = Vec::new();
    let mut script = None;
    let mut i = 0;
    while i < words.len() {
        let w = &words[i];
        i += 1;
        if w == "--" {
            break;
        }
        if !w.starts_with('-') || w == "-" {
            if script.is_some() {
                return Err(BatchError::AfterScript { word: w.clone() });
            }
            script = Some(w.clone());
            continue;
        }
        options.push(w.clone());
        // An option's value is the next word unless given inline.
        let takes_value = if let Some(long) = w.strip_prefix("--") {
            !long.contains('=') && OPTIONS.iter().any(|s| s.long == long && s.value)
        } else {
            let rest = &w[1..];
            rest.len() == 1 && OPTIONS.iter().any(|s| s.short.map(String::from).as_deref() == Some(rest) && s.value)
        };
        if takes_value {
            if let Some(v) = words.get(i) {
                options.push(v.clone());
                i += 1;
            }
        }
    }
    let script = script.ok_or(BatchError::NoScript)?;
    Ok(Invocation { options, script, args: words[i.min(words.len())..].to_vec() })
}

/// A `pinion batch` command line, split ([`split_invocation`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invocation {
    pub options: Vec<String>,
    pub script: String,
    /// The script's own arguments (after `--`).
    pub args: Vec<String>,
}

fn unquote(w: &str) -> String {
    for q in ['"', '\''] {
        if let Some(inner) = w.strip_prefix(q).and_then(|s| s.strip_suffix(q)) {
            return inner.to_string();
        }
        // `--job-name="a b"` split on its space is not supported; `--x="v"` is.
        if let Some((k, v)) = w.split_once('=') {
            if let Some(inner) = v.strip_prefix(q).and_then(|s| s.strip_suffix(q)) {
                return format!("{k}={inner}");
            }
        }
    }
    w.to_string()
}

/// One option: its long name, short letter, and whether it takes a value.
struct Spec {
    long: &'static str,
    short: Option<char>,
    value: bool,
}

const OPTIONS: &[Spec] = &[
    Spec { long: "job-name", short: Some('J'), value: true },
    Spec { long: "nodes", short: Some('N'), value: true },
    Spec { long: "ntasks", short: Some('n'), value: true },
    Spec { long: "ntasks-per-node", short: None, value: true },
    Spec { long: "cpus-per-task", short: Some('c'), value: true },
    Spec { long: "mem", short: None, value: true },
    Spec { long: "mem-per-cpu", short: None, value: true },
    Spec { long: "time", short: Some('t'), value: true },
    Spec { long: "output", short: Some('o'), value: true },
    Spec { long: "error", short: Some('e'), value: true },
    Spec { long: "array", short: Some('a'), value: true },
    Spec { long: "dependency", short: Some('d'), value: true },
    Spec { long: "gres", short: None, value: true },
    Spec { long: "gpus", short: Some('G'), value: true },
    Spec { long: "exclusive", short: None, value: false },
    Spec { long: "account", short: Some('A'), value: true },
    Spec { long: "partition", short: Some('p'), value: true },
    Spec { long: "priority", short: None, value: true },
    Spec { long: "chdir", short: Some('D'), value: true },
];

fn apply(out: &mut BatchOptions, words: &[String], at: At) -> Result<(), BatchError> {
    let mut i = 0;
    while i < words.len() {
        let w = &words[i];
        i += 1;
        let (spec, inline) = if let Some(long) = w.strip_prefix("--") {
            let (name, inline) = match long.split_once('=') {
                Some((n, v)) => (n, Some(v.to_string())),
                None => (long, None),
            };
            let spec = OPTIONS
                .iter()
                .find(|s| s.long == name)
                .ok_or_else(|| BatchError::Unknown { at, option: format!("--{name}") })?;
            (spec, inline)
        } else if let Some(short) = w.strip_prefix('-').filter(|s| !s.is_empty()) {
            let mut chars = short.chars();
            let letter = chars.next().unwrap_or_default();
            let spec = OPTIONS
                .iter()
                .find(|s| s.short == Some(letter))
                .ok_or_else(|| BatchError::Unknown { at, option: format!("-{letter}") })?;
            let rest: String = chars.collect();
            (spec, (!rest.is_empty()).then_some(rest))
        } else {
            return Err(BatchError::Unknown { at, option: w.clone() });
        };
        let option = format!("--{}", spec.long);
        let value = if spec.value {
            match inline {
                Some(v) => v,
                None => {
                    let v =
                        words.get(i).cloned().ok_or_else(|| BatchError::MissingValue { at, option: option.clone() })?;
                    i += 1;
                    v
                }
            }
        } else {
            if let Some(value) = inline {
                return Err(BatchError::UnexpectedValue { at, option, value });
            }
            String::new()
        };
        set(out, spec.long, &value).map_err(|why| BatchError::BadValue { at, option, value, why })?;
    }
    Ok(())
}

fn set(out: &mut BatchOptions, long: &str, v: &str) -> Result<(), String> {
    match long {
        "job-name" => {
            if !crate::validate::is_dns1123_label(v) {
                return Err("a job name is a DNS-1123 label (1-63 of a-z 0-9 -, alphanumeric at both ends)".into());
            }
            out.job_name = Some(v.into());
        }
        "nodes" => out.nodes = Some(count(v)?),
        "ntasks" => out.ntasks = Some(count(v)?),
        "ntasks-per-node" => out.ntasks_per_node = Some(count(v)?),
        "cpus-per-task" => out.cpus_per_task = Some(count(v)?),
        "mem" => out.mem = Some(parse_memory(v)?),
        "mem-per-cpu" => out.mem_per_cpu = Some(parse_memory(v)?),
        "time" => out.time = Some(parse_time(v)?),
        "output" => {
            check_pattern(v)?;
            out.output = Some(v.into());
        }
        "error" => {
            check_pattern(v)?;
            out.error = Some(v.into());
        }
        "array" => {
            if v.is_empty() {
                return Err("expected e.g. 1-100, 0-15%4 or 1,3,5-7".into());
            }
            out.array = Some(v.into());
        }
        "dependency" => out.dependency = Some(crate::dependency::parse(v).map_err(|e| e.to_string())?),
        "gres" => out.gpus = Some(parse_gres(v)?),
        "gpus" => {
            // Slurm's `--gpus [type:]N`.
            let n = v.rsplit(':').next().unwrap_or(v);
            out.gpus = Some(count(n)?);
        }
        "exclusive" => out.exclusive = true,
        "account" => {
            if !crate::validate::is_label_value(v) || v.is_empty() {
                return Err("an account is a label value (1-63 of A-Z a-z 0-9 - _ .)".into());
            }
            out.account = Some(v.into());
        }
        "partition" => {
            if v.is_empty() || v.len() > crate::limits::MAX_NAME_LEN {
                return Err("a partition name is 1 to 253 characters".into());
            }
            out.partition = Some(v.into());
        }
        "priority" => out.priority = Some(v.parse().map_err(|_| "a whole number".to_string())?),
        "chdir" => out.chdir = Some(v.into()),
        _ => return Err("not handled".into()),
    }
    Ok(())
}

fn count(v: &str) -> Result<u32, String> {
    match v.parse::<u32>() {
        Ok(0) => Err("at least 1".into()),
        Ok(n) if n > crate::limits::MAX_JOB_MEMBERS => Err(format!("at most {}", crate::limits::MAX_JOB_MEMBERS)),
        Ok(n) => Ok(n),
        Err(_) => Err("a whole number".into()),
    }
}

/// `--gres=gpu:N` (or `gpu:TYPE:N`, or `gpu` for one).
fn parse_gres(v: &str) -> Result<u32, String> {
    let parts: Vec<&str> = v.split(':').collect();
    match parts.as_slice() {
        ["gpu"] => Ok(1),
        ["gpu", n] | ["gpu", _, n] => count(n),
        _ => Err("only gpu:N (or gpu:TYPE:N) is known".into()),
    }
}

/// Slurm's memory: a whole number with an optional unit K, M, G or T
/// (binary; megabytes without one), as a Kubernetes quantity.
pub fn parse_memory(v: &str) -> Result<Quantity, String> {
    let (digits, unit) = match v.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => (&v[..i], &v[i..]),
        None => (v, ""),
    };
    let unit = match unit.to_ascii_uppercase().trim_end_matches('B') {
        "" | "M" => "Mi",
        "K" => "Ki",
        "G" => "Gi",
        "T" => "Ti",
        _ => return Err("a whole number with an optional unit K, M, G or T (megabytes without one)".into()),
    };
    let n: u64 = digits.parse().map_err(|_| "a whole number with an optional unit K, M, G or T".to_string())?;
    if n == 0 {
        return Err("at least 1".into());
    }
    let q = Quantity::parse(&format!("{n}{unit}")).map_err(|e| e.to_string())?;
    if q.units_ceil() > i128::from(crate::limits::MAX_POD_MEMORY_BYTES) {
        return Err("more memory than any pod may ask for".into());
    }
    Ok(q)
}

/// Slurm's time formats: `M`, `M:S`, `H:M:S`, `D-H`, `D-H:M`, `D-H:M:S`;
/// `UNLIMITED` or `INFINITE` is no limit (`None`). Seconds.
pub fn parse_time(v: &str) -> Result<Option<u64>, String> {
    let bad = || "expected M, M:S, H:M:S, D-H, D-H:M or D-H:M:S".to_string();
    if v.eq_ignore_ascii_case("unlimited") || v.eq_ignore_ascii_case("infinite") {
        return Ok(None);
    }
    let num = |s: &str| -> Result<u64, String> {
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) || s.len() > 9 {
            return Err(bad());
        }
        s.parse::<u64>().map_err(|_| bad())
    };
    let (days, clock) = match v.split_once('-') {
        Some((d, rest)) => (Some(num(d)?), rest),
        None => (None, v),
    };
    let parts = clock.split(':').map(num).collect::<Result<Vec<u64>, String>>()?;
    let seconds = match (days, parts.as_slice()) {
        (None, [m]) => m * 60,
        (None, [m, s]) => m * 60 + s,
        (None, [h, m, s]) => h * 3600 + m * 60 + s,
        (Some(d), [h]) => d * 86_400 + h * 3600,
        (Some(d), [h, m]) => d * 86_400 + h * 3600 + m * 60,
        (Some(d), [h, m, s]) => d * 86_400 + h * 3600 + m * 60 + s,
        _ => return Err(bad()),
    };
    if seconds == 0 {
        return Err("a time limit of 0 would end the job at once".into());
    }
    if seconds > crate::limits::MAX_TTL_SECONDS {
        return Err(format!("at most {} seconds (a year)", crate::limits::MAX_TTL_SECONDS));
    }
    Ok(Some(seconds))
}

/// What an output pattern's `%` letters stand for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Names<'a> {
    /// `%j`: the job's id (Pinion's job id is its name; an array task's is
    /// `NAME-i`).
    pub job_id: &'a str,
    /// `%x`: the job's name as given.
    pub job_name: &'a str,
    /// `%a`: the array task's index.
    pub task: Option<u32>,
    /// `%A`: the array's own id (its name).
    pub array: Option<&'a str>,
}

fn check_pattern(v: &str) -> Result<(), String> {
    if v.is_empty() {
        return Err("a file name".into());
    }
    if v.contains('\0') {
        return Err("no NUL".into());
    }
    expand(v, &Names { job_id: "j", job_name: "x", task: Some(0), array: Some("a") }).map(|_| ())
}

/// `pattern` with `%j`, `%x`, `%a`, `%A` and `%%` replaced (Slurm's
/// filename patterns); any other `%` letter is an error. Outside an array,
/// `%a` is `4294967294` as Slurm writes it, and `%A` the job's id.
pub fn expand(pattern: &str, names: &Names<'_>) -> Result<String, String> {
    let mut out = String::new();
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('%') => out.push('%'),
            Some('j') => out.push_str(names.job_id),
            Some('x') => out.push_str(names.job_name),
            Some('a') => out.push_str(&names.task.unwrap_or(u32::MAX - 1).to_string()),
            Some('A') => out.push_str(names.array.unwrap_or(names.job_id)),
            Some(other) => return Err(format!("%{other}: only %j, %x, %a, %A and %% are known")),
            None => return Err("a lone % at the end (write %% for a percent sign)".into()),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
