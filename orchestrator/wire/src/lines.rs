//! The line splitter under every ndjson stream reader (watches, attach): it
//! holds at most `max` bytes of an unfinished line, so a peer that never sends
//! a newline cannot grow the reader's memory without bound.

use bytes::{Bytes, BytesMut};

/// A line longer than the cap: the stream is broken (or hostile) and is dropped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a stream line is longer than {max} bytes")]
pub struct LineTooLong {
    pub max: usize,
}

#[derive(Debug)]
pub(crate) struct Lines {
    buf: BytesMut,
    max: usize,
    /// Bytes at the front of `buf` already searched for a newline.
    searched: usize,
}

impl Lines {
    pub(crate) fn new(max: usize) -> Lines {
        Lines { buf: BytesMut::new(), max, searched: 0 }
    }

    /// The next whole line (newline included), if one has arrived.
    pub(crate) fn next_line(&mut self) -> Result<Option<Bytes>, LineTooLong> {
        match self.buf[self.searched..].iter().position(|b| *b == b'\n') {
            Some(pos) => {
                let end = self.searched + pos + 1;
                self.searched = 0;
                if end > self.max + 1 {
                    return Err(LineTooLong { max: self.max });
                }
                Ok(Some(self.buf.split_to(end).freeze()))
            }
            None => {
                self.searched = self.buf.len();
                if self.buf.len() > self.max {
                    return Err(LineTooLong { max: self.max });
                }
                Ok(None)
            }
        }
    }

    /// Takes bytes from the stream; call `next_line` until it has none first.
    pub(crate) fn extend(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `chunks` to a splitter capped at `max`; the lines it gives, or the
    /// error it stops at.
    fn check(max: usize, chunks: &[&str], expected: Result<&[&str], LineTooLong>) {
        let mut lines = Lines::new(max);
        let mut got = Vec::new();
        let outcome = (|| -> Result<(), LineTooLong> {
            for c in chunks {
                lines.extend(c.as_bytes());
                while let Some(l) = lines.next_line()? {
                    got.push(String::from_utf8_lossy(&l).into_owned());
                }
            }
            Ok(())
        })();
        match (outcome, expected) {
            (Ok(()), Ok(want)) => assert_eq!(got, want, "{chunks:?}"),
            (Err(e), Err(want)) => assert_eq!(e, want, "{chunks:?}"),
            (o, e) => panic!("{chunks:?}: got {o:?} with lines {got:?}, expected {e:?}"),
        }
    }

    #[test]
    fn lines_are_split_and_capped() {
        check(8, &["a\nb", "c\n"], Ok(&["a\n", "bc\n"]));
        check(8, &["", "\n\n"], Ok(&["\n", "\n"]));
        check(4, &["abcd\n"], Ok(&["abcd\n"]));
        // A whole line one byte over the cap.
        check(4, &["abcde\n"], Err(LineTooLong { max: 4 }));
        // No newline ever: refused once the buffer passes the cap, not at the end.
        check(4, &["ab", "cd", "e", "fghijkl"], Err(LineTooLong { max: 4 }));
        // A partial line within the cap waits for its rest.
        check(4, &["ab", "cd"], Ok(&[]));
    }
}
