//! Embeds the built web app (`frontend/dist`, or `$STEPSTREAM_WEB_DIST`) into the hub, so
//! `stepstream serve` and a browser are all a user needs. Without a build, the hub serves a
//! page that says how to make one.

use std::path::PathBuf;

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let dist = std::env::var("STEPSTREAM_WEB_DIST")
        .map(PathBuf::from)
        .unwrap_or_else(|_| manifest.join("../frontend/dist"));
    println!("cargo:rerun-if-env-changed=STEPSTREAM_WEB_DIST");
    println!("cargo:rerun-if-changed={}", dist.display());
    let mut code = String::from("pub static ASSETS: &[(&str, &[u8])] = &[\n");
    if dist.join("index.html").exists() {
        let mut files: Vec<_> = std::fs::read_dir(&dist)
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_type().map(|t| t.is_file()).unwrap_or(false))
            .collect();
        files.sort_by_key(|e| e.file_name());
        for f in files {
            let path = f.path().canonicalize().unwrap();
            println!("cargo:rerun-if-changed={}", path.display());
            code.push_str(&format!(
                "    ({:?}, include_bytes!({:?})),\n",
                f.file_name().to_string_lossy(),
                path.display().to_string()
            ));
        }
    }
    code.push_str("];\n");
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap()).join("web_assets.rs");
    std::fs::write(out, code).unwrap();
}
