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
