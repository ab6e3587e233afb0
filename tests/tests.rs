//! End-to-end tests: each drives the real `stepstream` binary over real sockets.
//!
//! * `docs` — ARCHITECTURE.md names only paths that exist.
//! * `hub` — fan-out exactly once, SIGKILL durability, downsampling, status, tokens, bad input.
//! * `tail` — following a growing CSV with a torn last line.
//! * `util` — the harness: hub process, HTTP client, protocol-speaking viewer and collector.

mod docs;
mod hub;
mod tail;
mod util;
