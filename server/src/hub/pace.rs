//! The linger the hub asks of collectors (`Pace`): none while it has room, so each record
//! reaches viewers at once, rising with the records it receives a second, so a busy hub gets
//! batches of several records (most of its work is per frame: a 100-run fleet at 100 steps/s
//! costs it about 10% of a core at 40 ms and several times that at none). The load is
//! counted in records, which a collector's linger does not change, so the pace does not
//! feed back on itself.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Records a second below which collectors linger not at all.
pub const ROOM: f64 = 2_000.0;
/// Records a second from which they linger the most.
pub const FULL: f64 = 8_000.0;
/// The most the hub asks for: the collector's default linger.
pub const MOST_MS: u32 = 40;
/// Records since the last measurement after which a rise is looked for at once.
const RISE_RECORDS: u64 = 200;
/// The pace moves in steps of this, so a load that wavers does not resend it every tick.
const STEP_MS: u32 = 5;

/// The linger for a load of `records_per_s`.
pub fn linger_for(records_per_s: f64) -> u32 {
    let share = ((records_per_s - ROOM) / (FULL - ROOM)).clamp(0.0, 1.0);
    let ms = (share * f64::from(MOST_MS) / f64::from(STEP_MS)).ceil() as u32 * STEP_MS;
    ms.min(MOST_MS)
}

/// The records received, and the linger that follows from them.
pub struct Pace {
    records: AtomicU64,
    /// Set by `--linger MS`: the linger is that, whatever the load.
    fixed: std::sync::atomic::AtomicBool,
    /// `records` when last measured (read without the lock, to decide whether to measure).
    seen: AtomicU64,
    /// When the rate was last measured, and the count then.
    measured: Mutex<(Instant, u64)>,
    linger: watch::Sender<u32>,
}

impl Default for Pace {
    fn default() -> Pace {
        Pace {
            records: AtomicU64::new(0),
            seen: AtomicU64::new(0),
            fixed: std::sync::atomic::AtomicBool::new(false),
            measured: Mutex::new((Instant::now(), 0)),
            linger: watch::channel(0).0,
        }
    }
}

impl Pace {
    /// Counts records a collector sent. A load that rises is followed within a tenth of a
    /// second (a fleet starting must not send a second of one-record frames first).
    pub fn count(&self, records: usize) {
        let total = self.records.fetch_add(records as u64, Ordering::Relaxed) + records as u64;
        if total.saturating_sub(self.seen.load(Ordering::Relaxed)) >= RISE_RECORDS {
            if let Ok(mut m) = self.measured.try_lock() {
                self.measure(&mut m, total, Duration::from_millis(100), true);
            }
        }
    }

    /// Measures the rate over the last second or so and sets the linger it calls for;
    /// called by the hub's clock.
    pub fn update(&self) {
        let total = self.records.load(Ordering::Relaxed);
        let mut m = self.measured.lock().unwrap_or_else(|e| e.into_inner());
        self.measure(&mut m, total, Duration::from_secs(1), false);
    }

    /// The rate since the last measurement, if at least `window` ago, and the linger it
    /// calls for (only a longer one when `rise_only`): followed at once both ways, so a
    /// burst (an import) ends with it and a fleet that pauses gets its linger back as soon
    /// as it resumes.
    fn measure(&self, m: &mut (Instant, u64), total: u64, window: Duration, rise_only: bool) {
        if self.fixed.load(Ordering::Relaxed) {
            self.seen.store(u64::MAX, Ordering::Relaxed);
            return;
        }
        let now = Instant::now();
        let elapsed = now.duration_since(m.0);
        if elapsed < window {
            return;
        }
        let rate = (total - m.1) as f64 / elapsed.as_secs_f64();
        let linger = linger_for(rate);
        if rise_only && linger <= *self.linger.borrow() {
            return;
        }
        *m = (now, total);
        self.seen.store(total, Ordering::Relaxed);
        self.linger.send_if_modified(|current| {
            let changed = *current != linger;
            if changed {
                tracing::debug!(
                    records_per_s = rate as u64,
                    linger_ms = linger,
                    "collectors' pace"
                );
            }
            *current = linger;
            changed
        });
    }

    /// Asks for `ms` from now on, whatever the load (`--linger MS`).
    pub fn fix(&self, ms: u32) {
        self.fixed.store(true, Ordering::Relaxed);
        self.linger.send_replace(ms);
    }

    /// The linger now, and its changes.
    pub fn watch(&self) -> watch::Receiver<u32> {
        self.linger.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_linger_while_there_is_room_and_the_most_when_full() {
        assert_eq!(linger_for(0.0), 0);
        assert_eq!(linger_for(100.0), 0);
        assert_eq!(linger_for(ROOM), 0);
        assert_eq!(linger_for(ROOM + 1.0), STEP_MS);
        assert_eq!(linger_for((ROOM + FULL) / 2.0), 20);
        assert_eq!(linger_for(FULL), MOST_MS);
        assert_eq!(linger_for(1e9), MOST_MS);
        assert_eq!(linger_for(f64::NAN), 0);
        let mut last = 0;
        for r in (0..10_000).step_by(50) {
            let l = linger_for(r as f64);
            assert!(l >= last && l % STEP_MS == 0, "{r}: {l}");
            last = l;
        }
    }
}
