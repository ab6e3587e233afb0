//! Tokens: who may write which runs, and read which.
//!
//! A global write token (collectors) and read token (viewers, the API), and any number of
//! scoped tokens (`--tokens FILE`): a write token for some projects, a read token for some
//! projects or some runs (what an embedding page should hold). A write token also reads what
//! it may write. With no token of a kind configured, that kind is open, which `start`
//! allows only on loopback.
//!
//! `stepstream token` issues a scoped token into that file; the hub re-reads the file when its
//! content changes ([`LiveAuth`]), so issuing or revoking a token needs no restart, and the
//! sockets a revoked token opened close within a second (each socket watches the tokens and
//! checks its own again).
//!
//! Tokens travel in the collector's hello, or for HTTP and the viewer socket as
//! `Authorization: Bearer TOKEN` or `?token=TOKEN`, percent-encoded (browsers cannot set
//! headers on a WebSocket). Comparisons take the same time however much of a token matches.

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use std::sync::Arc;

/// What a token may see or write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scope {
    All,
    /// Runs of these projects, and these runs.
    Only {
        projects: Vec<String>,
        runs: Vec<String>,
    },
}

impl Scope {
    pub fn allows(&self, project: &str, run_id: &str) -> bool {
        match self {
            Scope::All => true,
            Scope::Only { projects, runs } => {
                projects.iter().any(|p| p == project) || runs.iter().any(|r| r == run_id)
            }
        }
    }
}

/// Read or write.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Access {
    Read,
    Write,
}

/// One token of a `--tokens` file.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScopedToken {
    pub token: String,
    pub access: Access,
    /// Projects it covers; with neither `projects` nor `runs`, every project.
    #[serde(default)]
    pub projects: Vec<String>,
    /// Runs it covers (read tokens).
    #[serde(default)]
    pub runs: Vec<String>,
}

impl ScopedToken {
    fn scope(&self) -> Scope {
        if self.projects.is_empty() && self.runs.is_empty() {
            Scope::All
        } else {
            Scope::Only {
                projects: self.projects.clone(),
                runs: self.runs.clone(),
            }
        }
    }
}

/// The `--tokens` file: `[[tokens]]` tables.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokensFile {
    #[serde(default)]
    pub tokens: Vec<ScopedToken>,
}

impl TokensFile {
    pub fn parse(text: &str) -> Result<Vec<ScopedToken>, String> {
        let file: TokensFile = toml::from_str(text).map_err(|e| e.to_string())?;
        for t in &file.tokens {
            if t.token.trim().is_empty() {
                return Err("a token in the tokens file is empty".into());
            }
            if t.access == Access::Write && !t.runs.is_empty() {
                return Err("write tokens are scoped by `projects`, not `runs`".into());
            }
        }
        Ok(file.tokens)
    }
}

#[derive(Clone, Debug, Default)]
pub struct Auth {
    pub write: Option<String>,
    pub read: Option<String>,
    pub scoped: Vec<ScopedToken>,
    /// Writes, or reads, stay guarded even when no token of that kind is left (a tokens file
    /// emptied or deleted): set by [`LiveAuth::new`] from the tokens the hub started with.
    pub guard_write: bool,
    pub guard_read: bool,
}

/// The tokens in force, replaced whole when the tokens file changes. Every socket watches
/// [`LiveAuth::changes`] and checks its token again, so a revoked token's sockets close.
#[derive(Debug)]
pub struct LiveAuth {
    current: std::sync::RwLock<std::sync::Arc<Auth>>,
    changed: tokio::sync::watch::Sender<u64>,
}

impl Default for LiveAuth {
    fn default() -> LiveAuth {
        LiveAuth::new(Auth::default())
    }
}

impl LiveAuth {
    /// The tokens a hub starts with: what they guard stays guarded for the hub's life.
    pub fn new(mut auth: Auth) -> LiveAuth {
        auth.guard_write = auth.has(Access::Write);
        auth.guard_read = auth.has(Access::Read);
        LiveAuth {
            current: std::sync::RwLock::new(std::sync::Arc::new(auth)),
            changed: tokio::sync::watch::channel(0).0,
        }
    }

    pub fn current(&self) -> std::sync::Arc<Auth> {
        // A poisoned lock still holds a whole `Arc`: replacing it is one store.
        self.current
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Ticks each time the tokens change: a socket then checks its token again.
    pub fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// Puts `scoped` in force, the old scoped tokens gone at once (their sockets are told to
    /// check again). What the hub guards stays guarded: an emptied file leaves only the
    /// global tokens, it never opens reads or writes.
    pub fn replace_scoped(&self, scoped: Vec<ScopedToken>) -> usize {
        let old = self.current();
        let new = Auth {
            scoped,
            ..(*old).clone()
        };
        let n = new.scoped.len();
        *self
            .current
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = std::sync::Arc::new(new);
        self.changed.send_modify(|g| *g += 1);
        n
    }
}

/// How often the tokens file is read again: a revoked token's sockets close within this.
pub const TOKENS_CHECK: std::time::Duration = std::time::Duration::from_millis(500);

/// Re-reads the tokens file when its content changes (not its mtime and size, which an edit
/// within a second of the same length keeps). A file that does not parse keeps the old
/// tokens; a deleted or unreadable one leaves none of its tokens in force.
pub async fn reload_on_change(auth: std::sync::Arc<LiveAuth>, path: std::path::PathBuf) {
    let mut seen: Option<Result<Vec<u8>, std::io::ErrorKind>> = None;
    let mut every = tokio::time::interval(TOKENS_CHECK);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        every.tick().await;
        let read = tokio::fs::read(&path).await.map_err(|e| e.kind());
        if seen.as_ref() == Some(&read) {
            continue;
        }
        seen = Some(read.clone());
        let scoped = match read {
            Ok(bytes) => match std::str::from_utf8(&bytes)
                .map_err(|e| e.to_string())
                .and_then(TokensFile::parse)
            {
                Ok(scoped) => scoped,
                Err(e) => {
                    tracing::error!(file = %path.display(), error = %e, "tokens file not reloaded: it does not parse; the tokens in force stay");
                    continue;
                }
            },
            Err(kind) => {
                tracing::error!(file = %path.display(), error = ?kind, "tokens file gone or unreadable: none of its tokens is in force");
                Vec::new()
            }
        };
        let n = auth.replace_scoped(scoped);
        tracing::info!(file = %path.display(), tokens = n, "tokens file reloaded");
    }
}

/// A new token: 32 random bytes, URL-safe base64 (no padding), safe in `?token=`.
pub fn new_token() -> Result<String, getrandom::Error> {
    use base64::Engine;
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)?;
    Ok(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes))
}

/// Compares without an early exit, so timing does not reveal a token's prefix.
fn same(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

impl Auth {
    fn has(&self, access: Access) -> bool {
        let (global, guarded) = match access {
            Access::Write => (self.write.is_some(), self.guard_write),
            Access::Read => (self.read.is_some(), self.guard_read),
        };
        guarded || global || self.scoped.iter().any(|t| t.access == access)
    }

    pub fn guards_reads_and_writes(&self) -> bool {
        self.has(Access::Write) && self.has(Access::Read)
    }

    /// What `token` may write; `None` when it may write nothing.
    pub fn write_scope(&self, token: Option<&str>) -> Option<Scope> {
        if !self.has(Access::Write) {
            return Some(Scope::All);
        }
        let token = token?;
        if self.write.as_deref().is_some_and(|w| same(w, token)) {
            return Some(Scope::All);
        }
        self.scoped
            .iter()
            .find(|t| t.access == Access::Write && same(&t.token, token))
            .map(ScopedToken::scope)
    }

    /// What `token` may read; `None` when it may read nothing.
    pub fn read_scope(&self, token: Option<&str>) -> Option<Scope> {
        if !self.has(Access::Read) {
            return Some(Scope::All);
        }
        let token = token?;
        if [&self.read, &self.write]
            .into_iter()
            .flatten()
            .any(|t| same(t, token))
        {
            return Some(Scope::All);
        }
        self.scoped
            .iter()
            .find(|t| same(&t.token, token))
            .map(ScopedToken::scope)
    }

    pub fn may_write(&self, token: Option<&str>, project: &str) -> bool {
        self.write_scope(token)
            .is_some_and(|s| s.allows(project, ""))
    }
}

fn token_of(req: &Request) -> Option<String> {
    if let Some(v) = req.headers().get(header::AUTHORIZATION) {
        if let Some(t) = v.to_str().ok().and_then(|s| s.strip_prefix("Bearer ")) {
            return Some(t.trim().to_string());
        }
    }
    // Percent-decoded: base64 tokens hold `+`, `/` and `=`, which a URL carries encoded.
    req.uri().query().and_then(|q| {
        form_urlencoded::parse(q.as_bytes())
            .find(|(k, _)| k == "token")
            .map(|(_, v)| v.into_owned())
    })
}

/// The token a request presented, for a socket to check again when the tokens change.
#[derive(Clone, Debug, Default)]
pub struct Presented(pub Option<String>);

/// Lets a request through with its read [`Scope`] (and the token, [`Presented`]) in its
/// extensions, or answers 401.
pub async fn require_read(
    State(auth): State<Arc<LiveAuth>>,
    mut req: Request,
    next: Next,
) -> Response {
    let token = token_of(&req);
    match auth.current().read_scope(token.as_deref()) {
        Some(scope) => {
            req.extensions_mut().insert(scope);
            req.extensions_mut().insert(Presented(token));
            next.run(req).await
        }
        None => (
            StatusCode::UNAUTHORIZED,
            axum::Json(serde_json::json!({"error": "missing or wrong read token"})),
        )
            .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reloaded_tokens_file_may_not_open_a_guarded_hub() {
        let scoped = |text: &str| TokensFile::parse(text).unwrap();
        let only_scoped = LiveAuth::new(Auth {
            write: Some("w".into()),
            read: None,
            scoped: scoped("[[tokens]]\ntoken = \"a\"\naccess = \"read\"\nprojects = [\"p\"]\n"),
            ..Auth::default()
        });
        assert!(only_scoped.current().read_scope(None).is_none());
        // Emptied: the old token is gone, and reads stay guarded (nobody may read).
        let changes = only_scoped.changes();
        assert_eq!(only_scoped.replace_scoped(Vec::new()), 0);
        assert!(changes.has_changed().unwrap(), "sockets are told");
        assert!(only_scoped.current().read_scope(Some("a")).is_none());
        assert!(only_scoped.current().read_scope(None).is_none());
        // Another token instead: in force at once, the old one gone.
        let n = only_scoped.replace_scoped(scoped(
            "[[tokens]]\ntoken = \"b\"\naccess = \"read\"\nruns = [\"r\"]\n",
        ));
        assert_eq!(n, 1);
        assert!(only_scoped.current().read_scope(Some("a")).is_none());
        assert!(only_scoped
            .current()
            .read_scope(Some("b"))
            .unwrap()
            .allows("x", "r"));
    }

    #[test]
    fn new_tokens_are_long_random_and_url_safe() {
        let (a, b) = (new_token().unwrap(), new_token().unwrap());
        assert_ne!(a, b);
        assert_eq!(a.len(), 43);
        assert!(a
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_'));
    }

    #[test]
    fn tokens() {
        let open = Auth::default();
        assert!(open.may_write(None, "p") && open.read_scope(None) == Some(Scope::All));
        let locked = Auth {
            write: Some("w".into()),
            read: Some("r".into()),
            scoped: TokensFile::parse(
                "[[tokens]]\ntoken = \"pw\"\naccess = \"write\"\nprojects = [\"a\"]\n\
                 [[tokens]]\ntoken = \"rr\"\naccess = \"read\"\nruns = [\"run-1\"]\n",
            )
            .unwrap(),
            ..Auth::default()
        };
        assert!(!locked.may_write(None, "a") && !locked.may_write(Some("r"), "a"));
        assert!(locked.may_write(Some("w"), "a") && locked.may_write(Some("w"), "b"));
        assert!(locked.may_write(Some("pw"), "a") && !locked.may_write(Some("pw"), "b"));
        assert!(!locked.may_write(Some("rr"), "a"));
        assert_eq!(locked.read_scope(Some("r")), Some(Scope::All));
        assert_eq!(locked.read_scope(Some("x")), None);
        let pw = locked.read_scope(Some("pw")).unwrap();
        assert!(pw.allows("a", "any") && !pw.allows("b", "any"));
        let rr = locked.read_scope(Some("rr")).unwrap();
        assert!(rr.allows("b", "run-1") && !rr.allows("b", "run-2"));
        assert!(TokensFile::parse("[[tokens]]\ntoken = \"\"\naccess = \"read\"\n").is_err());
        assert!(TokensFile::parse(
            "[[tokens]]\ntoken = \"x\"\naccess = \"write\"\nruns = [\"r\"]\n"
        )
        .is_err());
        assert!(TokensFile::parse("[[tokens]]\ntoken = \"x\"\naccess = \"admin\"\n").is_err());
    }
}
