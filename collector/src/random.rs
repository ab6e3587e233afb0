//! Random numbers for ids (a run id's tail, a writer's id), without a dependency.

/// A random number: the time and the process mixed by std's randomly keyed hasher.
pub(crate) fn u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.write_u32(std::process::id());
    h.finish()
}
