//! The memory rows: every runtime with N pods of one container each, its daemon's RSS, the
//! daemon's and its per-pod helpers' (monitors or shims, pause holders) RSS and PSS, and, at the
//! largest N, the CPU they spend idle over `--idle-seconds`.

use std::time::Duration;

use anyhow::Result;

use super::report::Results;
use super::{Options, Rt, peers};

pub async fn rows(o: &Options, rts: &mut [Rt], busybox: &str, res: &mut Results) -> Result<()> {
    for &n in &o.memory_pods {
        for rt in rts.iter_mut() {
            rt.concurrent_pods(n, busybox).await?;
            tokio::time::sleep(Duration::from_secs(2)).await;
            let daemon = peers::rss_kib(rt.peer.pid) as f64 / 1024.0;
            let (helpers, pauses) = peers::helper_pids(&rt.peer);
            let helper_kib: u64 = helpers.iter().map(|p| peers::rss_kib(*p)).sum();
            let pause_kib: u64 = pauses.iter().map(|p| peers::rss_kib(*p)).sum();
            let total = daemon + (helper_kib + pause_kib) as f64 / 1024.0;
            // RSS counts the pages helpers share (the same binary) once per process; PSS divides
            // them among their users, so it sums to what the runtime really holds.
            let pss: u64 = std::iter::once(rt.peer.pid)
                .chain(helpers.iter().copied())
                .chain(pauses.iter().copied())
                .map(peers::pss_kib)
                .sum();
            res.add(
                &format!("daemon+helpers PSS with {n} pods (MiB)"),
                "MiB",
                rt.name(),
                pss as f64 / 1024.0,
            );
            res.add(
                &format!("daemon RSS with {n} pods (MiB)"),
                "MiB",
                rt.name(),
                daemon,
            );
            res.add(
                &format!("daemon+helpers RSS with {n} pods (MiB)"),
                "MiB",
                rt.name(),
                total,
            );
            if !helpers.is_empty() {
                res.add(
                    "monitor/shim RSS each (MiB)",
                    "MiB",
                    rt.name(),
                    helper_kib as f64 / 1024.0 / helpers.len() as f64,
                );
                let pss: u64 = helpers.iter().map(|p| peers::pss_kib(*p)).sum();
                res.add(
                    "monitor/shim PSS each (MiB)",
                    "MiB",
                    rt.name(),
                    pss as f64 / 1024.0 / helpers.len() as f64,
                );
            }
            if o.idle_seconds > 0 && n == *o.memory_pods.iter().max().unwrap_or(&0) {
                let before = peers::cpu_ticks(rt.peer.pid);
                let hb: u64 = helpers.iter().map(|p| peers::cpu_ticks(*p)).sum();
                tokio::time::sleep(Duration::from_secs(o.idle_seconds)).await;
                let after = peers::cpu_ticks(rt.peer.pid);
                let ha: u64 = helpers.iter().map(|p| peers::cpu_ticks(*p)).sum();
                let tick = 100.0; // USER_HZ
                res.add(
                    &format!("idle CPU over {} s with {n} pods (s)", o.idle_seconds),
                    "s",
                    rt.name(),
                    ((after - before) + (ha - hb)) as f64 / tick,
                );
            }
            rt.remove_all_pods().await?;
        }
    }
    Ok(())
}
