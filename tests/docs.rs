//! Keeps the documents honest: every path ARCHITECTURE.md names in backticks exists, every
//! link of the README and the book (`docs/`) leads to a file and heading that exist, and
//! every flag they give a `stepstream` command is in that command's `--help`.

#[test]
fn architecture_paths_exist() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap();
    let mut missing = Vec::new();
    for (i, part) in doc.split('`').enumerate() {
        let looks_like_path = i % 2 == 1
            && part.contains('/')
            && !part.contains(' ')
            && !part.contains("::")
            && !part.starts_with("ws:")
            && !part.starts_with("wss:");
        if looks_like_path && !root.join(part).exists() {
            missing.push(part.to_string());
        }
    }
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md names missing paths: {missing:?}"
    );
}

/// Every `.rs` and `.py` file of the project (not the build output or a venv), with its text.
fn sources(root: &std::path::Path) -> Vec<(std::path::PathBuf, String)> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap().flatten() {
            let p = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            if p.is_dir() {
                if !name.starts_with('.') && name != "target" && name != "node_modules" {
                    stack.push(p);
                }
            } else if name.ends_with(".rs") || name.ends_with(".py") {
                out.push((p.clone(), std::fs::read_to_string(&p).unwrap_or_default()));
            }
        }
    }
    out
}

/// A test ARCHITECTURE.md cites as holding an invariant must exist: a renamed or deleted
/// test leaves the invariant unheld while the document still says it is.
#[test]
fn architecture_cites_only_tests_that_exist() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap();
    let files = sources(root);
    let mut missing = Vec::new();
    let mut cited = 0;
    for (i, part) in doc.split('`').enumerate() {
        // A test's name: four or more lowercase words joined by underscores.
        let looks_like_test = i % 2 == 1
            && part.split('_').count() >= 4
            && part
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        if !looks_like_test {
            continue;
        }
        cited += 1;
        let (rust, python) = (format!("fn {part}("), format!("def {part}("));
        if !files
            .iter()
            .any(|(_, text)| text.contains(&rust) || text.contains(&python))
        {
            missing.push(part.to_string());
        }
    }
    assert!(
        cited >= 10,
        "only {cited} tests cited: is the pattern right?"
    );
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md cites tests that do not exist: {missing:?}"
    );
}

/// "Only the engine files name `rusqlite` or `postgres`; the hub sees `Store`."
#[test]
fn only_the_engine_files_name_the_database_crates() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut found = Vec::new();
    for (path, text) in sources(&root.join("server/src")) {
        let rel = path
            .strip_prefix(root)
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let sqlite = rel.starts_with("server/src/store/sqlite/");
        let postgres = rel.starts_with("server/src/store/postgres/");
        if !sqlite && text.contains("rusqlite") {
            found.push(format!("{rel} names rusqlite"));
        }
        let names_postgres = [
            "use postgres",
            "::postgres::",
            " postgres::Error",
            "postgres::Client",
        ]
        .iter()
        .any(|p| text.contains(p));
        if !postgres && names_postgres {
            found.push(format!("{rel} names the postgres crate"));
        }
    }
    assert!(found.is_empty(), "{found:?}");
}

/// The README keeps the two commands a newcomer needs (it was once emptied by accident, and
/// nothing noticed).
#[test]
fn readme_names_the_two_commands() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    for command in ["./scripts/run", "./scripts/test"] {
        assert!(
            readme.contains(&format!("```sh\n{command}\n```")),
            "README.md lost `{command}`"
        );
        assert!(root.join(command).exists(), "{command} is gone");
    }
    assert!(readme.lines().count() > 50, "README.md is nearly empty");
}

/// The README and the book's pages.
fn documents(root: &std::path::Path) -> Vec<(std::path::PathBuf, String)> {
    let mut docs = vec![root.join("README.md")];
    for e in std::fs::read_dir(root.join("docs")).unwrap().flatten() {
        if e.path().extension().is_some_and(|x| x == "md") {
            docs.push(e.path());
        }
    }
    docs.into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            (p, text)
        })
        .collect()
}

/// A heading's anchor as GitHub makes it: lower case, spaces to `-`, punctuation dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

fn anchors(text: &str) -> Vec<String> {
    let mut fenced = false;
    text.lines()
        .filter(|l| {
            if l.starts_with("```") {
                fenced = !fenced;
            }
            !fenced && l.starts_with('#')
        })
        .map(|l| anchor(l.trim_start_matches('#')))
        .collect()
}

/// Every relative link (`[text](path#heading)`, images too) of the README and the book
/// leads to a file that exists, and to a heading of it that exists.
#[test]
fn the_docs_links_lead_somewhere() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut broken = Vec::new();
    let mut links = 0;
    for (path, text) in documents(root) {
        let dir = path.parent().unwrap();
        for (i, _) in text.match_indices("](") {
            let rest = &text[i + 2..];
            let Some(end) = rest.find(')') else { continue };
            let target = &rest[..end];
            if target.starts_with("http://")
                || target.starts_with("https://")
                || target.contains(' ')
            {
                continue;
            }
            links += 1;
            let (file, heading) = target.split_once('#').unwrap_or((target, ""));
            let file = if file.is_empty() {
                path.clone()
            } else {
                dir.join(file)
            };
            let name = path.strip_prefix(root).unwrap().display().to_string();
            if !file.exists() {
                broken.push(format!("{name}: {target} (no such file)"));
                continue;
            }
            if !heading.is_empty() {
                let text = std::fs::read_to_string(&file).unwrap_or_default();
                if !anchors(&text).iter().any(|a| a == heading) {
                    broken.push(format!("{name}: {target} (no such heading)"));
                }
            }
        }
    }
    assert!(links > 20, "only {links} links found: the scan is broken");
    assert!(broken.is_empty(), "broken links: {broken:#?}");
}

/// Every `--flag` the README and the book give a `stepstream SUBCOMMAND` (on its line, or
/// on the lines a trailing `\\` continues it to) is in that subcommand's `--help`.
#[test]
fn the_flags_the_docs_name_exist() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let bin = env!("CARGO_BIN_EXE_stepstream");
    let help = |sub: &str| -> Option<String> {
        let out = std::process::Command::new(bin)
            .args([sub, "--help"])
            .output()
            .unwrap();
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let top = String::from_utf8(
        std::process::Command::new(bin)
            .arg("--help")
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    let mut helps = std::collections::HashMap::new();
    let (mut checked, mut wrong) = (0, Vec::new());
    for (path, text) in documents(root) {
        let name = path.strip_prefix(root).unwrap().display().to_string();
        let lines: Vec<&str> = text.lines().collect();
        let mut i = 0;
        while i < lines.len() {
            let mut line = lines[i].to_string();
            while line.trim_end().ends_with('\\') && i + 1 < lines.len() {
                i += 1;
                line.push(' ');
                line.push_str(lines[i]);
            }
            i += 1;
            let Some(at) = line.find("stepstream ") else {
                continue;
            };
            let words: Vec<&str> = line[at + 11..].split_whitespace().collect();
            let Some(sub) = words
                .first()
                .map(|w| w.trim_matches(|c: char| !c.is_alphanumeric() && c != '-'))
            else {
                continue;
            };
            // `stepstream serve`, `watch`...: a subcommand the binary lists.
            let listed = top
                .lines()
                .any(|l| l.trim_start().starts_with(&format!("{sub} ")));
            if sub.is_empty() || sub.starts_with('-') || !listed {
                continue;
            }
            let help = helps
                .entry(sub.to_string())
                .or_insert_with(|| help(sub))
                .clone();
            let Some(help) = help else {
                wrong.push(format!("{name}: `stepstream {sub} --help` fails"));
                continue;
            };
            // The flags of this command: up to a `|`, `;` or `&&` (another command).
            let command = line[at..]
                .split(['|', ';', '#'])
                .next()
                .unwrap_or("")
                .split("&&")
                .next()
                .unwrap_or("");
            for word in command.split_whitespace() {
                let flag: String = word
                    .trim_start_matches(['[', '`', '('])
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '-')
                    .collect();
                if flag.starts_with("--") && flag.len() > 2 {
                    checked += 1;
                    if !help.contains(&format!("{flag} "))
                        && !help.contains(&format!("{flag}\n"))
                        && !help.contains(&format!("{flag}="))
                        && !help.contains(&format!("{flag} <"))
                    {
                        wrong.push(format!("{name}: `stepstream {sub}` has no {flag}"));
                    }
                }
            }
        }
    }
    assert!(
        checked > 20,
        "only {checked} flags found: the scan is broken"
    );
    assert!(wrong.is_empty(), "{wrong:#?}");
}
