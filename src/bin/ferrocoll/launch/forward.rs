//! A rank's output on ours, each line prefixed with its rank: bytes, not
//! text — whatever a rank prints passes through unchanged, in bounded
//! memory.
//!
//! A line longer than the buffer is passed on in pieces as it arrives
//! (the prefix only at its start), so a rank that prints gigabytes
//! without a newline costs one buffer. If our own output goes away (the
//! launcher piped into `head`), the forwarder keeps reading and drops the
//! bytes: a rank must never die of SIGPIPE because of the launcher.

use std::io::{self, Read, Write};
use std::thread::JoinHandle;

/// Bytes read at once, and so the most held per rank and stream.
const CHUNK: usize = 64 << 10;

/// Start a thread copying `stream` to our stdout (or stderr) until it
/// ends.
pub(super) fn forward(
    stream: impl Read + Send + 'static,
    rank: u32,
    err: bool,
) -> io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name(format!(
            "rank {rank} {}",
            if err { "stderr" } else { "stdout" }
        ))
        .spawn(move || {
            let prefix = format!("[rank {rank}] ");
            if err {
                copy(stream, &prefix, || io::stderr().lock());
            } else {
                copy(stream, &prefix, || io::stdout().lock());
            }
        })
}

/// Copy `from` to the writer `to` opens, prefixing every line.
fn copy<W: Write>(mut from: impl Read, prefix: &str, to: impl Fn() -> W) {
    let mut buf = vec![0u8; CHUNK];
    let mut out = Vec::with_capacity(CHUNK + CHUNK / 2);
    let mut at_line_start = true;
    let mut sink_open = true;
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return,
        };
        out.clear();
        at_line_start = prefixed(&buf[..n], prefix.as_bytes(), at_line_start, &mut out);
        // One write per chunk under the lock: lines of different ranks do
        // not interleave within a chunk.
        if sink_open {
            let mut w = to();
            sink_open = w.write_all(&out).and_then(|()| w.flush()).is_ok();
        }
    }
}

/// Append `bytes` to `out` with `prefix` before each line that starts in
/// them; returns whether the next byte starts a line.
fn prefixed(bytes: &[u8], prefix: &[u8], mut at_line_start: bool, out: &mut Vec<u8>) -> bool {
    for line in bytes.split_inclusive(|&b| b == b'\n') {
        if at_line_start {
            out.extend_from_slice(prefix);
        }
        out.extend_from_slice(line);
        at_line_start = line.ends_with(b"\n");
    }
    at_line_start
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_line_gets_the_prefix_once_whatever_its_bytes() {
        let mut out = Vec::new();
        let next = prefixed(b"a\n\xff\xfe\nhalf", b"[r] ", true, &mut out);
        assert_eq!(out, b"[r] a\n[r] \xff\xfe\n[r] half");
        assert!(!next);
        out.clear();
        assert!(prefixed(b" line\n", b"[r] ", next, &mut out));
        assert_eq!(out, b" line\n");
    }

    #[test]
    fn a_line_longer_than_a_chunk_is_passed_on_in_pieces() {
        let long = vec![b'a'; 3 * CHUNK + 5];
        let got = std::sync::Mutex::new(Vec::new());
        let largest = std::sync::atomic::AtomicUsize::new(0);
        struct Sink<'a>(
            &'a std::sync::Mutex<Vec<u8>>,
            &'a std::sync::atomic::AtomicUsize,
        );
        impl Write for Sink<'_> {
            fn write(&mut self, b: &[u8]) -> io::Result<usize> {
                self.1
                    .fetch_max(b.len(), std::sync::atomic::Ordering::Relaxed);
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        copy(&long[..], "[r] ", || Sink(&got, &largest));
        let got = got.into_inner().unwrap();
        assert_eq!(&got[..4], b"[r] ");
        assert_eq!(got.len(), long.len() + 4);
        assert!(largest.into_inner() <= CHUNK + 4, "held a whole line");
    }

    #[test]
    fn a_closed_sink_does_not_stop_the_reading() {
        struct Closed;
        impl Write for Closed {
            fn write(&mut self, _: &[u8]) -> io::Result<usize> {
                Err(io::ErrorKind::BrokenPipe.into())
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let mut input: &[u8] = &vec![b'x'; 5 * CHUNK];
        copy(&mut input, "", || Closed);
        assert!(input.is_empty(), "every byte was drained");
    }
}
