//! fault: named crash points for the crash-anywhere tests (`tests/chaos/`). In debug builds,
//! which are the builds tests run, a daemon started with `CRIUS_FAULT=<point>[:<n>]` kills
//! itself with SIGKILL the n-th time (1st by default) it reaches that point, as a crash there
//! would; release builds compile every point to nothing. Points sit right before and after each
//! state write, mount, CNI plugin call, cgroup write, helper spawn and snapshot commit. Only the
//! daemon arms them (helpers it spawns inherit the variable but never read it). Uses `std` and
//! `nix`.

/// Every point, for the chaos test to choose from; each name appears once in the code.
pub const POINTS: &[&str] = &[
    "state.write.before",
    "state.write.after",
    "state.remove.before",
    "snapshot.commit.before",
    "snapshot.commit.after",
    "rootfs.mount.after",
    "cgroup.create.after",
    "cgroup.write.before",
    "pause.spawn.after",
    "monitor.spawn.after",
    "cni.add.before",
    "cni.add.after",
    "cni.del.before",
    "cni.del.after",
];

/// Marks a crash point named in `POINTS`.
#[inline]
pub fn point(name: &'static str) {
    #[cfg(debug_assertions)]
    armed::reach(name);
    #[cfg(not(debug_assertions))]
    let _ = name;
}

/// Reads `CRIUS_FAULT` (the daemon calls this once, before serving).
pub fn arm() {
    #[cfg(debug_assertions)]
    armed::arm();
}

#[cfg(debug_assertions)]
mod armed {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, Ordering};

    struct Target {
        point: String,
        nth: u64,
        seen: AtomicU64,
    }

    static TARGET: OnceLock<Target> = OnceLock::new();

    pub fn arm() {
        let Ok(spec) = std::env::var("CRIUS_FAULT") else {
            return;
        };
        let (point, nth) = match spec.split_once(':') {
            Some((p, n)) => (p.to_string(), n.parse().unwrap_or(1)),
            None => (spec, 1),
        };
        if !super::POINTS.contains(&point.as_str()) {
            eprintln!("crius: CRIUS_FAULT names no fault point: {point:?}");
            return;
        }
        let _ = TARGET.set(Target {
            point,
            nth,
            seen: AtomicU64::new(0),
        });
    }

    pub fn reach(name: &str) {
        let Some(t) = TARGET.get() else {
            return;
        };
        if t.point != name {
            return;
        }
        let n = t.seen.fetch_add(1, Ordering::SeqCst) + 1;
        if n == t.nth {
            // The chaos test reads this line to count the points it covered.
            eprintln!("crius: fault point {name} reached (hit {n}): killing the daemon");
            let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::POINTS;

    /// Each listed point is marked exactly once in the sources, so a chaos run that names it
    /// can reach it.
    #[test]
    fn every_point_is_marked_once() {
        let mut sources = String::new();
        let mut dirs = vec![std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src")];
        while let Some(d) = dirs.pop() {
            for e in std::fs::read_dir(&d).expect("read src").flatten() {
                let p = e.path();
                if p.is_dir() {
                    dirs.push(p);
                } else if p.extension().is_some_and(|x| x == "rs") && !p.ends_with("fault.rs") {
                    sources.push_str(&std::fs::read_to_string(&p).expect("read source"));
                }
            }
        }
        for p in POINTS {
            let marks = sources.matches(&format!("fault::point(\"{p}\")")).count();
            assert_eq!(marks, 1, "{p} is marked {marks} times");
        }
    }
}
