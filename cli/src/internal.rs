//! The two commands the agent starts for every container, read without
//! clap: `pinion shim --data-dir DIR --id ID` and `pinion init -- CMD...`.
//!
//! Clap's derive builds the parser of every verb before it reads one word;
//! in a process that lives a few milliseconds, as the shim and the
//! container's init do, that was about a quarter of the process's own CPU
//! time, on each pod's start path. Only the exact spelling the agent
//! writes is read here; anything else (`--help`, the shim's `exec` mode, a
//! flag in another place) goes to clap as before, so no command line means
//! something different on either path.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::ValueEnum;

use crate::common::{LogFormat, DEFAULT_LOG};

#[derive(Debug, PartialEq, Eq)]
pub enum Internal {
    Shim { data_dir: PathBuf, id: String, log: String, log_format: LogFormat },
    Init(Vec<String>),
}

/// The internal command `args` (the whole `argv`) spells exactly, with the
/// shim's log settings from the environment as clap would read them; `None`
/// for everything else, and for anything clap would refuse or read
/// differently (non-UTF-8 words, an unknown log format).
pub fn parse(args: &[OsString], env: impl Fn(&str) -> Option<OsString>) -> Option<Internal> {
    let word = |i: usize| args.get(i).and_then(|a| a.to_str());
    match word(1)? {
        "shim" if args.len() == 6 && word(2)? == "--data-dir" && word(4)? == "--id" => {
            let data_dir = PathBuf::from(args.get(3)?);
            let id = word(5)?.to_string();
            // Clap reads an empty value as given; the agent never writes one.
            if data_dir.as_os_str().is_empty() || id.is_empty() || id.starts_with('-') {
                return None;
            }
            let log = match env("PINION_LOG") {
                Some(v) => v.into_string().ok()?,
                None => DEFAULT_LOG.to_string(),
            };
            let log_format = match env("PINION_LOG_FORMAT") {
                Some(v) => LogFormat::from_str(v.to_str()?, false).ok()?,
                None => LogFormat::Text,
            };
            Some(Internal::Shim { data_dir, id, log, log_format })
        }
        "init" if args.len() >= 4 && word(2)? == "--" => {
            let command: Option<Vec<String>> = args[3..].iter().map(|a| a.to_str().map(str::to_string)).collect();
            Some(Internal::Init(command?))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(words: &[&str]) -> Vec<OsString> {
        words.iter().map(OsString::from).collect()
    }

    fn no_env(_: &str) -> Option<OsString> {
        None
    }

    #[test]
    fn the_agents_spellings_are_read_and_nothing_else() {
        let shim = Internal::Shim {
            data_dir: PathBuf::from("/var/lib/pinion/node"),
            id: "p_main_1".into(),
            log: DEFAULT_LOG.into(),
            log_format: LogFormat::Text,
        };
        let init = |c: &[&str]| Some(Internal::Init(c.iter().map(|s| s.to_string()).collect()));
        let cases: &[(&[&str], Option<Internal>)] = &[
            (&["pinion", "shim", "--data-dir", "/var/lib/pinion/node", "--id", "p_main_1"], Some(shim)),
            (&["/.pinion-init", "init", "--", "true"], init(&["true"])),
            // Everything after the first `--` is the command's, `--` included.
            (
                &["/.pinion-init", "init", "--", "sh", "-c", "x", "--", "--help"],
                init(&["sh", "-c", "x", "--", "--help"]),
            ),
            // What clap reads (help, other orders, the exec mode, globals) stays clap's.
            (&["pinion", "init", "--help"], None),
            (&["pinion", "init", "--"], None),
            (&["pinion", "init", "true"], None),
            (&["pinion", "shim", "--id", "x", "--data-dir", "/d"], None),
            (&["pinion", "shim", "--data-dir", "/d", "--id", "x", "exec", "--", "ls"], None),
            (&["pinion", "shim", "--data-dir", "/d", "--id", "--help"], None),
            (&["pinion", "shim", "--data-dir", "", "--id", "x"], None),
            (&["pinion", "--log", "debug", "shim", "--data-dir", "/d", "--id", "x"], None),
            (&["pinion", "run", "x", "--", "true"], None),
            (&["pinion"], None),
        ];
        for (words, expected) in cases {
            assert_eq!(&parse(&argv(words), no_env), expected, "{words:?}");
        }
    }

    #[test]
    fn the_shim_reads_its_log_settings_as_clap_would() {
        let args = argv(&["pinion", "shim", "--data-dir", "/d", "--id", "x"]);
        let env = |log: Option<&'static str>, format: Option<&'static str>| {
            move |k: &str| match k {
                "PINION_LOG" => log.map(OsString::from),
                "PINION_LOG_FORMAT" => format.map(OsString::from),
                _ => None,
            }
        };
        let Some(Internal::Shim { log, log_format, .. }) = parse(&args, env(Some("podstart=debug"), Some("json")))
        else {
            panic!("not read");
        };
        assert_eq!((log.as_str(), log_format), ("podstart=debug", LogFormat::Json));
        // A format clap would refuse is left to clap, which says why.
        assert_eq!(parse(&args, env(None, Some("yaml"))), None);
        // Clap's value names are case-sensitive.
        assert_eq!(parse(&args, env(None, Some("JSON"))), None);
    }
}
