//! End-to-end tests: each drives the real `stepstream` binary over real sockets.
//!
//! * `hub` — fan-out exactly once, SIGKILL durability, downsampling, status, tokens, bad input.
//! * `tail` — following a growing CSV with a torn last line.
//! * `util` — the harness: hub process, HTTP client, protocol-speaking viewer and collector.

mod hub;
mod tail;
mod util;
