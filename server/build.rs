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
    // (name, bytes, entity tag): the tag is a hash of the bytes, so a browser revalidating a
    // file it holds gets `304 Not Modified` until the next build changes it.
    let mut code = String::from("pub static ASSETS: &[(&str, &[u8], &str)] = &[\n");
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
            let tag = fnv1a(&std::fs::read(&path).unwrap());
            code.push_str(&format!(
                "    ({:?}, include_bytes!({:?}), \"\\\"{tag:016x}\\\"\"),\n",
                f.file_name().to_string_lossy(),
                path.display().to_string()
            ));
        }
    }
    code.push_str("];\n");
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap()).join("web_assets.rs");
    std::fs::write(out, code).unwrap();
}

/// FNV-1a, 64 bits: a change detector for entity tags, not a security hash.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}
