//! The harness, by concern: the real `stepstream` binary in a temp dir (`hub`), HTTP to it
//! (`http`: `ureq`, the client the project already uses, except where a test must forge a
//! request), a viewer and a raw collector that speak the protocol over a real WebSocket
//! (`viewer`, `collector`), nginx in front (`nginx`), and small helpers here.

mod collector;
mod http;
mod hub;
mod nginx;
mod viewer;

pub use collector::*;
pub use http::*;
pub use hub::*;
pub use nginx::*;
pub use viewer::*;

use std::io::Write;
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};
use stepstream_protocol::*;

pub const BIN: &str = env!("CARGO_BIN_EXE_stepstream");

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Polls `f` until it returns `Some`, or panics with `what` after `limit`.
pub fn wait_for<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Writes `text` to `path` and flushes it to the OS.
pub fn append(path: &Path, text: &str) {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap();
    f.write_all(text.as_bytes()).unwrap();
    f.flush().unwrap();
}

/// Runs a command to its end; fails the test with its stderr unless it succeeded.
pub fn succeed(cmd: &mut Command) -> std::process::Output {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Stops a child process with `signal` (`"-INT"`, `"-TERM"`), as a user would; fails the
/// test unless it then exits cleanly; returns what it wrote to stderr.
pub fn stop(child: Child, signal: &str) -> String {
    Command::new("kill")
        .args([signal, &child.id().to_string()])
        .status()
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    stderr
}
