//! The benchmarks' command lines: flags, each alone or followed by a number
//! or a path.

use std::path::PathBuf;

use anyhow::Context;

pub struct Args(std::iter::Skip<std::env::Args>);

impl Args {
    /// This process's arguments after its name.
    pub fn from_env() -> Args {
        Args(std::env::args().skip(1))
    }

    /// The next flag; `None` after the last.
    pub fn flag(&mut self) -> Option<String> {
        self.0.next()
    }

    /// The number that follows `flag`.
    pub fn num(&mut self, flag: &str) -> anyhow::Result<usize> {
        self.0.next().with_context(|| format!("{flag} N"))?.parse().with_context(|| flag.to_string())
    }

    /// The path that follows `flag`.
    pub fn path(&mut self, flag: &str) -> anyhow::Result<PathBuf> {
        Ok(PathBuf::from(self.0.next().with_context(|| format!("{flag} PATH"))?))
    }
}
