//! Load: many pods through the agent, each with HTTP, TCP and exec probes, kept for a while
//! with churn (pods removed and added every few seconds), and the daemon's and monitors'
//! memory, descriptors and threads compared between the start and the end. Bounded in CI (40
//! pods for a minute); `cargo xtask soak --pods 250 --minutes 10` is kubelet's large node
//! (`maxPods` 250) for ten minutes. `CRIUS_SOAK_PODS`, `CRIUS_SOAK_SECONDS` and
//! `CRIUS_SOAK_CHURN` (pods replaced a minute, 10 by default) set the run.

#![allow(clippy::unwrap_used)] // tests may panic on what they did not expect

mod common;

use std::collections::VecDeque;
use std::path::Path;
use std::time::{Duration, Instant};

use common::agent::*;
use common::*;
use crius::frontend::status::{Phase, PodRecord};

fn setting(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn manifest(name: &str, image: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: {name}}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: web
    image: {image}
    command: [sh, -c, 'mkdir -p /www && echo ok > /www/index.html && exec httpd -f -p 8080 -h /www']
    readinessProbe: {{httpGet: {{port: 8080, path: /index.html}}, periodSeconds: 10}}
    livenessProbe: {{tcpSocket: {{port: 8080}}, periodSeconds: 10}}
  - name: side
    image: {image}
    command: [sleep, '1000000']
    readinessProbe: {{exec: {{command: ['true']}}, periodSeconds: 10}}
"#
    )
}

/// One process's resident memory (KiB), open descriptors and threads.
#[derive(Debug, Clone, Copy, Default)]
struct Usage {
    rss_kib: i64,
    fds: i64,
    threads: i64,
}

fn usage(pid: u32) -> Usage {
    let threads = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count() as i64)
        .unwrap_or(0);
    Usage {
        rss_kib: rss_kib(pid),
        fds,
        threads,
    }
}

/// The monitors of this daemon's containers by pid.
fn monitor_pids(state: &Path) -> Vec<u32> {
    let bundles = format!("crius monitor {}", state.join("containers").display());
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmd)
            .replace('\0', " ")
            .starts_with(&bundles)
        {
            out.push(pid);
        }
    }
    out
}

/// The monitors: how many, and their mean usage at rest. A monitor gives back what an exec'd
/// command (an exec probe) made it touch 5 s after the command; so each is sampled every
/// second through more than a probe period (12 s) and its lowest figures count.
async fn monitors(state: &Path) -> (usize, Usage) {
    let mut low: std::collections::BTreeMap<u32, Usage> = Default::default();
    for i in 0..12 {
        if i > 0 {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        for pid in monitor_pids(state) {
            let u = usage(pid);
            if u.rss_kib == 0 {
                continue;
            }
            let e = low.entry(pid).or_insert(u);
            e.rss_kib = e.rss_kib.min(u.rss_kib);
            e.fds = e.fds.min(u.fds);
            e.threads = e.threads.min(u.threads);
        }
    }
    let all: Vec<Usage> = low.into_values().collect();
    let n = all.len().max(1) as i64;
    let sum = all.iter().fold(Usage::default(), |a, u| Usage {
        rss_kib: a.rss_kib + u.rss_kib,
        fds: a.fds + u.fds,
        threads: a.threads + u.threads,
    });
    (
        all.len(),
        Usage {
            rss_kib: sum.rss_kib / n,
            fds: sum.fds / n,
            threads: sum.threads / n,
        },
    )
}

fn ready(r: &PodRecord) -> bool {
    r.phase == Phase::Running && r.condition("Ready")
}

/// Waits until every pod in `names` is ready; panics naming the first that is not.
fn wait_ready(a: &Agent, names: &VecDeque<String>, secs: u64) {
    let start = Instant::now();
    loop {
        let records = crius::frontend::status::load_all(&a.state);
        let missing: Vec<&String> = names
            .iter()
            .filter(|n| !records.iter().any(|r| &r.name == *n && ready(r)))
            .collect();
        if missing.is_empty() {
            return;
        }
        if start.elapsed() > Duration::from_secs(secs) {
            let first = missing[0];
            panic!(
                "{} of {} pods not ready within {secs}s, {first} among them: {:#?}",
                missing.len(),
                names.len(),
                a.record(first)
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn many_probed_pods_with_churn_hold_memory_flat() {
    let pods = setting("CRIUS_SOAK_PODS", 40);
    let seconds = setting("CRIUS_SOAK_SECONDS", 60);
    let churn = setting("CRIUS_SOAK_CHURN", 10);
    let env = PodEnv::start().await;
    let a = Agent::start(&env.d);
    let daemon = env.d.pid().unwrap();
    let started = Instant::now();
    let mut live: VecDeque<String> = VecDeque::new();
    for n in 0..pods {
        let name = format!("soak-{n}");
        a.put(&format!("{name}.yaml"), &manifest(&name, &env.image));
        live.push_back(name);
    }
    wait_ready(&a, &live, 120 + pods);
    let up = started.elapsed();
    // Settled: the first figures.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let d0 = usage(daemon);
    let (m_count0, m0) = monitors(&env.d.state).await;
    let log_at_start = env.d.log_text().len();
    println!(
        "soak: {pods} pods ready in {:.1} s; daemon {d0:?}; {m_count0} monitors, mean {m0:?}",
        up.as_secs_f64()
    );
    // The run: a pod replaced every 60/churn seconds, the probes going on.
    let every = Duration::from_secs_f64(60.0 / churn.max(1) as f64);
    let mut next = pods;
    let mut replaced = 0;
    let mut gone: Vec<String> = Vec::new();
    let end = Instant::now() + Duration::from_secs(seconds);
    while Instant::now() < end {
        tokio::time::sleep(every.min(end.saturating_duration_since(Instant::now()))).await;
        if let Some(old) = live.pop_front() {
            a.remove(&format!("{old}.yaml"));
            gone.push(old);
        }
        let name = format!("soak-{next}");
        next += 1;
        a.put(&format!("{name}.yaml"), &manifest(&name, &env.image));
        live.push_back(name);
        replaced += 1;
    }
    wait_ready(&a, &live, 60);
    // Removed pods are gone, and no container of any pod was restarted (no liveness failure).
    let start = Instant::now();
    while gone.iter().any(|n| a.record(n).is_some()) {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "removed pods still there: {:?}",
            gone.iter()
                .filter(|n| a.record(n).is_some())
                .collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    for r in crius::frontend::status::load_all(&a.state) {
        assert!(
            r.all().all(|c| c.restart_count == 0),
            "pod {} restarted a container: {r:#?}",
            r.name
        );
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    let d1 = usage(daemon);
    let (m_count1, m1) = monitors(&env.d.state).await;
    println!(
        "soak: after {seconds} s and {replaced} pods replaced: daemon {d1:?}; {m_count1} monitors, \
         mean {m1:?}"
    );
    // No call failed while the pods ran (the agent's own lookups of what it removed aside).
    let log = env.d.log_text();
    let failed: Vec<&str> = log[log_at_start..]
        .lines()
        .filter(|l| l.contains("rpc failed") && !l.contains("code=NotFound"))
        .collect();
    assert!(failed.is_empty(), "calls failed:\n{}", failed.join("\n"));
    assert!(
        !a.log_text().contains(" ERROR "),
        "the agent logged errors:\n{}",
        a.log_text()
    );
    // Flat: what a pod costs does not accumulate.
    assert_eq!(m_count1, m_count0, "monitors: one per container");
    assert!(
        d1.rss_kib - d0.rss_kib < 16 * 1024,
        "daemon memory grew from {} to {} KiB",
        d0.rss_kib,
        d1.rss_kib
    );
    assert!(
        d1.fds <= d0.fds + 8,
        "daemon descriptors grew: {d0:?} -> {d1:?}"
    );
    assert!(
        d1.threads <= d0.threads + 16,
        "daemon threads grew: {d0:?} -> {d1:?}"
    );
    assert!(
        m1.rss_kib <= m0.rss_kib + 256 && m1.fds <= m0.fds && m1.threads <= m0.threads,
        "a monitor grew: {m0:?} -> {m1:?}"
    );
    // Everything goes with the manifests.
    for n in &live {
        a.remove(&format!("{n}.yaml"));
    }
    let start = Instant::now();
    while !crius::frontend::status::load_all(&a.state).is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "pods left after their manifests went"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}
