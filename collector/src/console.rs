//! The process's console, captured at the file-descriptor level: a pipe stands behind fd 1
//! and fd 2, so what C and C++ code writes (a framework's own warnings, NCCL/HCCL, a crashing
//! extension, a child process) is captured as well as Python's `print`. A reader thread per
//! stream passes every byte on to where the stream went before, unchanged and at once, then
//! cuts the bytes into lines for the run.
//!
//! A line ends at `\n`; a `\r` not followed by `\n` starts the line over, so a progress bar
//! that redraws itself (tqdm) becomes one line, its last state. A line longer than
//! [`LONGEST_LINE`] is cut into pieces of that size.

use crate::queue::{Command, Queue};
use crate::stats::Stats;
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use stepstream_protocol::{unix_now, Item, ItemBody, Stream};

/// Bytes of one console line, at most; longer lines are cut.
pub const LONGEST_LINE: usize = 16 * 1024;

/// How long [`Capture::stop`] waits for the readers to pass on what is still in the pipes
/// (a child process that inherited the pipe may hold it open for ever).
const DRAIN: Duration = Duration::from_secs(2);

/// Where captured lines go: the collector's queue, at the step `log` last saw.
#[derive(Clone)]
pub(crate) struct Sink {
    pub queue: Arc<Queue>,
    pub last_step: Arc<AtomicI64>,
    pub stats: Arc<Stats>,
}

impl Sink {
    fn line(&self, stream: Stream, bytes: &[u8]) {
        let item = Item {
            step: self.last_step.load(Ordering::Relaxed).max(0),
            wall_time: unix_now(),
            key: String::new(),
            body: ItemBody::Line {
                stream,
                // A NUL would be refused by the hub (PostgreSQL cannot store one).
                text: String::from_utf8_lossy(bytes).replace('\0', "\u{fffd}"),
            },
        };
        if self.queue.push(Command::Item(item)).is_err() {
            self.stats.items_dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Cuts a byte stream into console lines.
#[derive(Default)]
pub(crate) struct Lines {
    line: Vec<u8>,
    /// A `\r` was seen: unless a `\n` follows, the line starts over.
    carriage: bool,
}

impl Lines {
    /// Feeds `bytes`; calls `emit` for every line completed.
    pub(crate) fn feed(&mut self, bytes: &[u8], mut emit: impl FnMut(&[u8])) {
        for &b in bytes {
            match b {
                b'\n' => {
                    self.carriage = false;
                    emit(&self.line);
                    self.line.clear();
                }
                b'\r' => self.carriage = true,
                _ => {
                    if self.carriage {
                        self.carriage = false;
                        self.line.clear();
                    }
                    if self.line.len() >= LONGEST_LINE {
                        emit(&self.line);
                        self.line.clear();
                    }
                    self.line.push(b);
                }
            }
        }
    }

    /// What is left without a line end (the stream ended).
    pub(crate) fn finish(&mut self, mut emit: impl FnMut(&[u8])) {
        if !self.line.is_empty() {
            emit(&self.line);
            self.line.clear();
        }
    }
}

/// One captured stream.
struct Captured {
    stream: Stream,
    /// Where the stream went before, to put back at the end.
    saved: OwnedFd,
    reader: Option<std::thread::JoinHandle<()>>,
}

/// Stdout and stderr, captured until [`Capture::stop`] (or drop).
pub struct Capture {
    streams: Vec<Captured>,
}

/// One capture per process: a second run's would stand between the first's and the
/// terminal, and whichever ended first would leave the other's pipe behind fd 1.
static CAPTURING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

impl Capture {
    /// Puts a pipe behind fd 1 and fd 2. Either both are captured or, on an error, neither.
    /// Another run of this process capturing already is an `AlreadyExists` error.
    pub(crate) fn start(sink: Sink) -> std::io::Result<Capture> {
        if CAPTURING.swap(true, Ordering::AcqRel) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                "another run of this process captures the console",
            ));
        }
        let mut capture = Capture {
            streams: Vec::new(),
        };
        for stream in [Stream::Stdout, Stream::Stderr] {
            match capture_one(stream, sink.clone()) {
                Ok(c) => capture.streams.push(c),
                Err(e) => {
                    // The streams captured so far are put back.
                    drop(capture);
                    CAPTURING.store(false, Ordering::Release);
                    return Err(e);
                }
            }
        }
        Ok(capture)
    }

    /// Puts the streams back and waits (a little) for the readers to pass on and report
    /// what was still in the pipes.
    pub fn stop(mut self) {
        self.restore();
    }

    fn restore(&mut self) {
        let deadline = Instant::now() + DRAIN;
        for c in &self.streams {
            let _ = std::io::stdout().flush();
            let _ = std::io::stderr().flush();
            let put_back = match c.stream {
                Stream::Stdout => rustix::stdio::dup2_stdout(c.saved.as_fd()),
                Stream::Stderr => rustix::stdio::dup2_stderr(c.saved.as_fd()),
            };
            if let Err(e) = put_back {
                tracing::error!(error = %e, "stepstream: cannot put the console back");
            }
        }
        // The pipes' last writers are gone now (unless a child process holds one): each
        // reader reads to the end and stops.
        for c in &mut self.streams {
            let Some(reader) = c.reader.take() else {
                continue;
            };
            while !reader.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(2));
            }
            if reader.is_finished() {
                let _ = reader.join();
            }
        }
        if !self.streams.is_empty() {
            CAPTURING.store(false, Ordering::Release);
        }
        self.streams.clear();
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        self.restore();
    }
}

fn capture_one(stream: Stream, sink: Sink) -> std::io::Result<Captured> {
    let (saved, terminal) = match stream {
        Stream::Stdout => (
            rustix::io::fcntl_dupfd_cloexec(std::io::stdout().as_fd(), 3)?,
            rustix::io::fcntl_dupfd_cloexec(std::io::stdout().as_fd(), 3)?,
        ),
        Stream::Stderr => (
            rustix::io::fcntl_dupfd_cloexec(std::io::stderr().as_fd(), 3)?,
            rustix::io::fcntl_dupfd_cloexec(std::io::stderr().as_fd(), 3)?,
        ),
    };
    let (read, write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
    let mut terminal = std::fs::File::from(terminal);
    let mut read = std::fs::File::from(read);
    let reader = std::thread::Builder::new()
        .name(format!("stepstream-{}", stream.as_str()))
        .spawn(move || {
            let mut lines = Lines::default();
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let n = match read.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(_) => break,
                };
                // The terminal first, as if nothing stood between: a closed terminal must
                // not stop the capture (nor the training writing to it).
                let _ = terminal.write_all(&buf[..n]);
                lines.feed(&buf[..n], |l| sink.line(stream, l));
            }
            lines.finish(|l| sink.line(stream, l));
        })?;
    // From here the stream writes into the pipe (fd 1 or 2 no longer close-on-exec: a child
    // process's output is captured too).
    let installed = match stream {
        Stream::Stdout => rustix::stdio::dup2_stdout(&write),
        Stream::Stderr => rustix::stdio::dup2_stderr(&write),
    };
    drop(write);
    if let Err(e) = installed {
        // The reader sees the end of the pipe (its only writer is gone) and stops.
        return Err(e.into());
    }
    Ok(Captured {
        stream,
        saved,
        reader: Some(reader),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(chunks: &[&[u8]]) -> Vec<String> {
        let mut out = Vec::new();
        let mut l = Lines::default();
        for c in chunks {
            l.feed(c, |x| out.push(String::from_utf8_lossy(x).into_owned()));
        }
        l.finish(|x| out.push(String::from_utf8_lossy(x).into_owned()));
        out
    }

    #[test]
    fn progress_bars_become_their_last_state_and_lines_survive_any_chunking() {
        let text: &[u8] = b"epoch 1\r\n 10%|#\r 50%|#####\r100%|##########\nloss 0.5\npartial";
        let whole = lines(&[text]);
        assert_eq!(whole, ["epoch 1", "100%|##########", "loss 0.5", "partial"]);
        // Byte by byte: the same lines.
        let bytes: Vec<&[u8]> = text.chunks(1).collect();
        assert_eq!(lines(&bytes), whole);
        assert_eq!(lines(&[b"\n\n"]), ["", ""]);
    }

    #[test]
    fn a_line_longer_than_the_limit_is_cut() {
        let long = vec![b'x'; LONGEST_LINE * 2 + 5];
        let out = lines(&[&long, b"\n"]);
        assert_eq!(
            out.iter().map(String::len).collect::<Vec<_>>(),
            [LONGEST_LINE, LONGEST_LINE, 5]
        );
    }
}
