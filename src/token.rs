//! `stepstream token`: issues a scoped token into the tokens file a hub serves with
//! (`serve --tokens FILE`), which the hub re-reads within a second.

use anyhow::{Context, Result};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct TokenArgs {
    /// The tokens file the hub was started with (created if missing, mode 0600).
    #[arg(long)]
    tokens: PathBuf,
    /// A write token (collectors of the given projects) instead of a read token.
    #[arg(long)]
    write: bool,
    /// A project the token covers (repeat for several).
    #[arg(long = "project")]
    projects: Vec<String>,
    /// A run the token covers (read tokens; repeat for several).
    #[arg(long = "run")]
    runs: Vec<String>,
    /// Every project: an unscoped token.
    #[arg(long, conflicts_with_all = ["projects", "runs"])]
    all: bool,
    /// Who or what holds it (a comment in the file), e.g. `team wiki`.
    #[arg(long)]
    label: Option<String>,
}

/// `stepstream token`: appends a new scoped token to the tokens file, checking that the
/// file still parses with it, and prints the token.
pub fn issue_token(args: TokenArgs) -> Result<()> {
    use std::io::Write;
    use stepstream_server::auth::{new_token, TokensFile};
    if !args.all && args.projects.is_empty() && args.runs.is_empty() {
        anyhow::bail!("say what the token covers: --project P, --run R (read tokens), or --all");
    }
    let token = new_token().context("no randomness from the operating system")?;
    let quote = |v: &[String]| {
        v.iter()
            .map(|s| serde_json::Value::String(s.clone()).to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut entry = String::from("\n[[tokens]]\n");
    if let Some(label) = &args.label {
        entry.push_str(&format!("# {}\n", label.replace(['\n', '\r'], " ")));
    }
    entry.push_str(&format!(
        "# issued {}\ntoken = \"{token}\"\naccess = \"{}\"\n",
        stepstream_protocol::utc_stamp(stepstream_protocol::unix_now()),
        if args.write { "write" } else { "read" }
    ));
    if !args.projects.is_empty() {
        entry.push_str(&format!("projects = [{}]\n", quote(&args.projects)));
    }
    if !args.runs.is_empty() {
        entry.push_str(&format!("runs = [{}]\n", quote(&args.runs)));
    }
    let old = match std::fs::read_to_string(&args.tokens) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", args.tokens.display())),
    };
    TokensFile::parse(&format!("{old}{entry}"))
        .map_err(|e| anyhow::anyhow!("{} would not parse: {e}", args.tokens.display()))?;
    let mut file = std::fs::OpenOptions::new();
    file.create(true).append(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut file, 0o600);
    file.open(&args.tokens)
        .and_then(|mut f| {
            // `mode` applies only when the file is created: a file made by hand (or by an
            // editor with the default umask) is readable by others until this.
            #[cfg(unix)]
            f.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
            f.write_all(entry.as_bytes())
        })
        .with_context(|| format!("cannot write {}", args.tokens.display()))?;
    eprintln!(
        "issued a {} token into {}; a hub serving it picks it up within a second",
        if args.write { "write" } else { "read" },
        args.tokens.display()
    );
    println!("{token}");
    Ok(())
}
