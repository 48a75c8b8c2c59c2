//! Step times of one create or start, logged at debug level as one line (`container created`,
//! `container started`): the per-step profile README's Performance section quotes. An
//! `Instant` per step; nothing is kept once logged.

use std::fmt;
use std::time::{Duration, Instant};

pub(super) struct Steps {
    last: Instant,
    done: Vec<(&'static str, Duration)>,
}

impl Steps {
    pub(super) fn new() -> Steps {
        Steps {
            last: Instant::now(),
            done: Vec::with_capacity(16),
        }
    }

    /// Ends `step`: the time since the previous mark is its own.
    pub(super) fn mark(&mut self, step: &'static str) {
        let now = Instant::now();
        self.done.push((step, now - self.last));
        self.last = now;
    }

    /// Splits the last step: `parts` (µs) were measured inside it by another process; the
    /// rest stays under its own name.
    pub(super) fn split(&mut self, step: &'static str, parts: &[(&'static str, u64)]) {
        let Some(pos) = self.done.iter().rposition(|(s, _)| *s == step) else {
            return;
        };
        let mut rest = self.done[pos].1;
        let mut inner = Vec::with_capacity(parts.len());
        for (name, us) in parts {
            let d = Duration::from_micros(*us).min(rest);
            rest -= d;
            inner.push((*name, d));
        }
        self.done[pos].1 = rest;
        let at = pos + 1;
        self.done.splice(at..at, inner);
    }

    pub(super) fn log(&self, what: &'static str, id: &str) {
        tracing::debug!(container = id, steps = %self, "{what}");
    }
}

impl fmt::Display for Steps {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let total: Duration = self.done.iter().map(|(_, d)| *d).sum();
        write!(f, "total={}µs", total.as_micros())?;
        for (step, d) in &self.done {
            write!(f, " {step}={}µs", d.as_micros())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_each_step_after_the_total() {
        let mut s = Steps::new();
        s.mark("a");
        s.mark("b");
        let line = s.to_string();
        assert!(line.starts_with("total="), "{line}");
        assert!(line.contains(" a=") && line.contains(" b="), "{line}");
    }

    #[test]
    fn a_split_step_keeps_its_total() {
        let mut s = Steps::new();
        std::thread::sleep(Duration::from_millis(3));
        s.mark("report");
        let before: Duration = s.done.iter().map(|(_, d)| *d).sum();
        s.split("report", &[("setup", 1000), ("init", 1_000_000)]);
        let names: Vec<&str> = s.done.iter().map(|(n, _)| *n).collect();
        assert_eq!(names, ["report", "setup", "init"]);
        assert_eq!(s.done.iter().map(|(_, d)| *d).sum::<Duration>(), before);
        assert_eq!(s.done[1].1, Duration::from_millis(1));
    }
}
