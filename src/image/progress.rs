//! Pull progress that clients can watch: layer and byte counters per running pull, kept for a
//! short while after it ends so a watcher that arrives late still sees the outcome.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a finished pull's progress stays visible.
const LINGER: Duration = Duration::from_secs(10);

#[derive(Debug, Default)]
pub struct Progress {
    pub layers_total: AtomicU64,
    pub layers_done: AtomicU64,
    pub bytes_total: AtomicU64,
    pub bytes_done: AtomicU64,
    done: AtomicBool,
    error: Mutex<Option<String>>,
    /// The pulls sharing this entry and not yet ended.
    pullers: AtomicUsize,
}

/// A consistent copy of the counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub layers_total: u64,
    pub layers_done: u64,
    pub bytes_total: u64,
    pub bytes_done: u64,
    pub done: bool,
    pub error: Option<String>,
}

impl Progress {
    pub fn add_bytes(&self, n: u64) {
        self.bytes_done.fetch_add(n, Ordering::Relaxed);
    }

    pub fn layer_done(&self) {
        self.layers_done.fetch_add(1, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            layers_total: self.layers_total.load(Ordering::Relaxed),
            layers_done: self.layers_done.load(Ordering::Relaxed),
            bytes_total: self.bytes_total.load(Ordering::Relaxed),
            bytes_done: self.bytes_done.load(Ordering::Relaxed),
            done: self.done.load(Ordering::Acquire),
            error: self.error.lock().map(|e| e.clone()).unwrap_or(None),
        }
    }
}

/// Running pulls by reference, with the time each one ended.
type Entries = HashMap<String, (Arc<Progress>, Option<Instant>)>;

#[derive(Default)]
pub struct Board {
    pulls: Mutex<Entries>,
}

impl Board {
    fn pulls(&self) -> std::sync::MutexGuard<'_, Entries> {
        self.pulls.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn start(&self, key: &str) -> Arc<Progress> {
        let mut pulls = self.pulls();
        pulls.retain(|_, (_, ended)| ended.is_none_or(|t| t.elapsed() < LINGER));
        match pulls.get(key) {
            // A concurrent pull of the same image shares the board entry.
            Some((p, None)) => {
                p.pullers.fetch_add(1, Ordering::Relaxed);
                p.clone()
            }
            _ => {
                let p = Arc::new(Progress::default());
                p.pullers.store(1, Ordering::Relaxed);
                pulls.insert(key.to_string(), (p.clone(), None));
                p
            }
        }
    }

    /// A pull of `p` that went away before its end (its client cancelled): the entry ends
    /// with the last of its pulls, so a watcher is not left waiting and the board not holding
    /// it for good.
    pub fn abandon(&self, key: &str, p: &Arc<Progress>) {
        if p.pullers.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.end(key, p, Some("the pull was cancelled".into()));
        }
    }

    pub fn finish(&self, key: &str, p: &Arc<Progress>, error: Option<String>) {
        p.pullers.fetch_sub(1, Ordering::AcqRel);
        self.end(key, p, error);
    }

    fn end(&self, key: &str, p: &Arc<Progress>, error: Option<String>) {
        if let Ok(mut e) = p.error.lock() {
            *e = error;
        }
        p.done.store(true, Ordering::Release);
        if let Some(entry) = self.pulls().get_mut(key)
            && Arc::ptr_eq(&entry.0, p)
        {
            entry.1 = Some(Instant::now());
        }
    }

    pub fn get(&self, key: &str) -> Option<Arc<Progress>> {
        self.pulls().get(key).map(|(p, _)| p.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cancelled_pull_ends_its_entry_with_its_last_puller() {
        let board = Board::default();
        let a = board.start("img");
        let b = board.start("img");
        assert!(Arc::ptr_eq(&a, &b));
        board.abandon("img", &a);
        // The other pull goes on.
        assert!(!b.snapshot().done);
        board.abandon("img", &b);
        let s = b.snapshot();
        assert!(s.done && s.error.is_some_and(|e| e.contains("cancelled")));
        // A pull after it starts afresh.
        let c = board.start("img");
        assert!(!Arc::ptr_eq(&c, &a) && !c.snapshot().done);
        board.finish("img", &c, None);
        assert_eq!(c.snapshot().error, None);
    }
}
