//! The mutation runner: seeds, mutations, crash files.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

/// A small, fast, seeded generator (xorshift64*), so a run can be repeated.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
}

const INTERESTING: [u64; 10] = [
    0,
    1,
    0x7f,
    0xff,
    0xfb,
    0xfc,
    0xfd,
    0xffff,
    u32::MAX as u64,
    u64::MAX,
];

fn mutate(rng: &mut Rng, input: &mut Vec<u8>, seeds: &[Vec<u8>], max_len: usize) {
    for _ in 0..1 + rng.below(4) {
        let len = input.len();
        match rng.below(8) {
            0 if len > 0 => {
                let i = rng.below(len);
                input[i] ^= 1 << rng.below(8);
            }
            1 if len > 0 => {
                let i = rng.below(len);
                input[i] = rng.next() as u8;
            }
            2 => {
                let i = rng.below(len + 1);
                let n = 1 + rng.below(16);
                let bytes: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
                input.splice(i..i, bytes);
            }
            3 if len > 0 => {
                let i = rng.below(len);
                let n = 1 + rng.below((len - i).min(32));
                input.drain(i..i + n);
            }
            4 if len > 0 => {
                // An interesting integer, little endian, at a random place.
                let v = INTERESTING[rng.below(INTERESTING.len())].to_le_bytes();
                let i = rng.below(len);
                let n = [1, 2, 4, 8][rng.below(4)].min(len - i);
                input[i..i + n].copy_from_slice(&v[..n]);
            }
            5 if !seeds.is_empty() => {
                // Splice: our head, another seed's tail.
                let other = &seeds[rng.below(seeds.len())];
                let cut = rng.below(len + 1);
                let from = rng.below(other.len() + 1);
                input.truncate(cut);
                input.extend_from_slice(&other[from..]);
            }
            6 if len > 0 => {
                // Duplicate a run of bytes (repeated fields, repeated messages).
                let i = rng.below(len);
                let n = 1 + rng.below((len - i).min(64));
                let copy = input[i..i + n].to_vec();
                input.splice(i..i, copy);
            }
            _ => {
                let i = rng.below(len + 1);
                input.truncate(i);
            }
        }
    }
    input.truncate(max_len);
}

/// What a run did.
#[derive(Debug, Default)]
pub struct Outcome {
    pub executed: u64,
    pub crashes: Vec<PathBuf>,
}

/// Runs `target` on `count` inputs mutated from `seeds` (with the generator seeded by
/// `seed`), writing each panicking input to `crash_dir`.
pub fn run(
    target: crate::Target,
    seeds: &[Vec<u8>],
    count: u64,
    seed: u64,
    max_len: usize,
    crash_dir: &Path,
) -> Outcome {
    let mut rng = Rng(seed | 1);
    let mut outcome = Outcome::default();
    let seeds: Vec<Vec<u8>> = if seeds.is_empty() {
        vec![Vec::new()]
    } else {
        seeds.to_vec()
    };
    // Panics are expected findings: keep their messages off the output.
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let mut input = Vec::with_capacity(max_len);
    for i in 0..count {
        input.clear();
        input.extend_from_slice(&seeds[rng.below(seeds.len())]);
        if i >= seeds.len() as u64 {
            mutate(&mut rng, &mut input, &seeds, max_len);
        }
        outcome.executed += 1;
        if catch_unwind(AssertUnwindSafe(|| target(&input))).is_err() {
            let _ = std::fs::create_dir_all(crash_dir);
            let name = format!("crash-{:016x}", fnv(&input));
            let path = crash_dir.join(name);
            let _ = std::fs::write(&path, &input);
            outcome.crashes.push(path);
        }
    }
    std::panic::set_hook(hook);
    outcome
}

fn fnv(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}
