//! End-to-end tests: each drives the real `stepstream` binary over real sockets.
//!
//! * `backup` — `stepstream backup` while a run streams, and `restore`.
//! * `bench_web` — browser benchmarks (ignored; numbers printed).
//! * `cluster` — three hubs on PostgreSQL and NATS behind nginx: one dies, nothing is lost.
//! * `commands` — stop, checkpoint and note for a running training: delivered once,
//!   answered, refused to the wrong token.
//! * `console` — console lines and samples: stored, capped, searched, resent, refused.
//! * `charts` — the web app's charts for long runs, its run panel and list, in Chromium.
//! * `demo` — `stepstream demo` trains real models and streams them.
//! * `docs` — ARCHITECTURE.md names only paths that exist.
//! * `hardening` — never stuck, never lost: wide records, resumes, a second writer, a hub
//!   that lost data, a damaged spool, slow readers, limits, a full disk.
//! * `hub` — fan-out exactly once, SIGKILL durability, downsampling, status, tokens, bad input.
//! * `manage` — deleting runs (API, CLI, page) and per-project retention.
//! * `proxy` — the hub behind Debian's nginx, as `docs/reverse-proxy.nginx.conf` shows.
//! * `range` — range reads for zooming: exact edges, non-finite values, while written.
//! * `rules` — alert rules made in the page: previewed, tested, in force within a second.
//! * `security` — who may connect: `Host` and `Origin` checks.
//! * `tls` — HTTPS and `wss://` with a private CA, certificates renewed while serving.
//! * `tail` — following a growing CSV with a torn last line.
//! * `web` — the web app in headless Chromium (`browser` drives it over DevTools).
//! * `trust` — what the hub claims is true: a write token stays in its project, a revoked
//!   token's sockets close, names with control characters are refused.
//! * `watch` — `stepstream watch` in tmux: it follows a live run, zooms, resizes, quits.
//! * `views` — the views runs are compared with: any metric as the x axis.
//! * `util` — the harness: hub process, HTTP client, protocol-speaking viewer and collector.

mod backup;
mod bench_web;
mod browser;
mod charts;
mod cluster;
mod commands;
mod console;
mod demo;
mod docs;
mod embed;
mod hardening;
mod hub;
mod import;
mod manage;
mod metrics;
mod proxy;
mod range;
mod rules;
mod security;
mod tail;
mod tls;
mod trust;
mod util;
mod views;
mod watch;
mod web;
