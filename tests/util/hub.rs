//! A `stepstream serve` process on a free port, in its own temporary folder.

use super::*;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::Stdio;

/// A `stepstream serve` process.
pub struct Hub {
    pub port: u16,
    pub db: PathBuf,
    pub args: Vec<String>,
    /// Environment variables the process gets besides the test's own.
    pub env: Vec<(String, String)>,
    child: Option<Child>,
    pub dir: tempfile::TempDir,
    /// Where its stderr (its log, at `info`) goes, when a test reads it.
    pub log: Option<PathBuf>,
}

impl Hub {
    /// Like [`Hub::start`], its log (at `info`) kept in a file for the test to read.
    pub fn start_logged(extra: &[&str]) -> Hub {
        let dir = tempfile::tempdir().unwrap();
        let mut hub = Hub {
            port: free_port(),
            db: dir.path().join("hub.db"),
            args: extra.iter().map(|s| s.to_string()).collect(),
            env: Vec::new(),
            child: None,
            log: Some(dir.path().join("hub.log")),
            dir,
        };
        hub.spawn();
        hub
    }

    /// What the hub logged so far (see [`Hub::start_logged`]).
    pub fn logged(&self) -> String {
        self.log
            .as_ref()
            .map(|p| std::fs::read_to_string(p).unwrap_or_default())
            .unwrap_or_default()
    }

    pub fn start(extra: &[&str]) -> Hub {
        Hub::start_on(free_port(), extra)
    }

    /// A hub guarding writes and reads (tokens `w` and `r`) whose tokens file
    /// ([`Hub::tokens_file`]) holds `scoped`.
    pub fn start_with_tokens(scoped: &str, extra: &[&str]) -> Hub {
        let dir = tempfile::tempdir().unwrap();
        let tokens = dir.path().join("tokens.toml");
        std::fs::write(&tokens, scoped).unwrap();
        let tokens = tokens.to_str().unwrap().to_string();
        let mut args = vec![
            "--write-token",
            "w",
            "--read-token",
            "r",
            "--tokens",
            &tokens,
        ];
        args.extend_from_slice(extra);
        let db = dir.path().join("hub.db");
        Hub::start_with(free_port(), db, dir, &args)
    }

    /// The tokens file of [`Hub::start_with_tokens`].
    pub fn tokens_file(&self) -> PathBuf {
        self.dir.path().join("tokens.toml")
    }

    /// With these environment variables (say, libfaketime's, for a clock that is wrong).
    pub fn start_with_env(env: &[(&str, &str)], extra: &[&str]) -> Hub {
        let dir = tempfile::tempdir().unwrap();
        let mut hub = Hub {
            port: free_port(),
            db: dir.path().join("hub.db"),
            args: extra.iter().map(|s| s.to_string()).collect(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            child: None,
            dir,
            log: None,
        };
        hub.spawn();
        hub
    }

    /// On a given port (one a collector was already told to use).
    pub fn start_on(port: u16, extra: &[&str]) -> Hub {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("hub.db");
        Hub::start_with(port, db, dir, extra)
    }

    /// With its database at `db` (on a filesystem a test made).
    pub fn start_with(port: u16, db: PathBuf, dir: tempfile::TempDir, extra: &[&str]) -> Hub {
        let mut hub = Hub {
            port,
            db,
            args: extra.iter().map(|s| s.to_string()).collect(),
            env: Vec::new(),
            child: None,
            dir,
            log: None,
        };
        hub.spawn();
        hub
    }

    fn spawn(&mut self) {
        let mut child = Command::new(BIN)
            .args(["serve", "--bind", &format!("127.0.0.1:{}", self.port)])
            .arg("--db")
            .arg(&self.db)
            .args(&self.args)
            .env("RUST_LOG", if self.log.is_some() { "info" } else { "warn" })
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::piped())
            .stderr(match &self.log {
                Some(path) => Stdio::from(
                    std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(path)
                        .unwrap(),
                ),
                None => Stdio::inherit(),
            })
            .spawn()
            .expect("start stepstream serve");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert!(line.contains("listening on"), "hub said {line:?}");
        self.child = Some(child);
    }

    /// The hub process's id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    pub fn ws(&self) -> String {
        format!("ws://127.0.0.1:{}", self.port)
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// SIGKILL: no chance to flush or say goodbye.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill().unwrap();
            c.wait().unwrap();
        }
    }

    pub fn restart(&mut self) {
        self.kill9();
        self.spawn();
    }

    pub fn get(&self, path: &str) -> Response {
        http_get(&self.addr(), path, None)
    }

    pub fn json(&self, path: &str) -> serde_json::Value {
        let r = self.get(path);
        assert_eq!(r.status, 200, "GET {path}: {}", r.text());
        serde_json::from_slice(&r.body).unwrap()
    }

    pub fn run_json(&self, run_id: &str) -> Option<serde_json::Value> {
        let r = self.get(&format!("/api/runs/{run_id}"));
        (r.status == 200).then(|| serde_json::from_slice(&r.body).unwrap())
    }
}

impl Drop for Hub {
    fn drop(&mut self) {
        self.kill9();
    }
}
