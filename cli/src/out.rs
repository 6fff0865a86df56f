//! What a command prints on stdout. Rust ignores SIGPIPE (so that a peer's
//! closed socket is an error, not a death), and `outln!` then panics when
//! the reader went away (`pinion get pods -o yaml | head -1`). Here a closed
//! pipe ends the process at once and quietly, with the status a shell shows
//! for a process killed by SIGPIPE (141), as it ends Unix tools; any other
//! failure to write is one line on stderr and status 1.

use std::io::Write;

/// The status of a process that a closed pipe ended (128 + SIGPIPE).
pub const CLOSED_PIPE: i32 = 141;

/// `print!` to stdout, ending the process on a closed pipe.
macro_rules! out {
    ($($arg:tt)*) => { $crate::out::write(format_args!($($arg)*)) };
}

/// `outln!` to stdout, ending the process on a closed pipe.
macro_rules! outln {
    () => { $crate::out::write(format_args!("\n")) };
    ($($arg:tt)*) => { $crate::out::write(format_args!("{}\n", format_args!($($arg)*))) };
}

pub fn write(args: std::fmt::Arguments) {
    let mut stdout = std::io::stdout().lock();
    if let Err(e) = stdout.write_fmt(args) {
        end(&e);
    }
}

/// Whether the error, or one of its causes, is a reader that went away.
pub fn is_closed_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe))
}

fn end(e: &std::io::Error) -> ! {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        std::process::exit(CLOSED_PIPE);
    }
    eprintln!("error: writing to stdout: {e}");
    std::process::exit(1);
}
