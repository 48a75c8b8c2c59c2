//! `cargo xtask bench --load N`: N busy loops beside the runtimes for the whole run, the same
//! for every runtime, so the bench shows how each holds up on a node that is doing other work.

use anyhow::{Context, Result};

/// The busy loops, ended when dropped.
pub struct Load(Vec<std::process::Child>);

impl Load {
    /// `n` shell loops that never sleep (each takes a core when it can get one). Each ends by
    /// itself once the bench is gone, so a bench killed by a signal leaves none behind.
    pub fn start(n: usize) -> Result<Load> {
        let mut loops = Vec::with_capacity(n);
        for _ in 0..n {
            let child = std::process::Command::new("sh")
                .args([
                    "-c",
                    "p=$PPID; while kill -0 \"$p\" 2>/dev/null; do :; done",
                ])
                .stdin(std::process::Stdio::null())
                .spawn()
                .context("starting a busy loop for --load")?;
            loops.push(child);
        }
        if n > 0 {
            eprintln!("bench: {n} busy loop(s) run beside the runtimes");
        }
        Ok(Load(loops))
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
