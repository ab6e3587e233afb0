//! Keeps ARCHITECTURE.md honest: every path it names in backticks must exist.

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
