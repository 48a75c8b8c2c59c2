//! What the pod agent itself costs: the CPU `crius agent` uses while it keeps many pods under
//! probes. Each pod runs busybox `httpd` with a TCP readiness probe every second, the cheapest
//! probe there is, so what is measured is the agent's scheduling and bookkeeping rather than
//! the probes' own work. Runs on crius only (a TCP probe needs the pod's network namespace or
//! a routable pod IP, which the benchmark's containerd set-up does not give).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use crius::frontend::status::{self, Phase};

use super::peers;

pub struct ProbeCost {
    /// CPU of the agent over the window, in percent of one core.
    pub agent_pct: f64,
    /// CPU of the runtime daemon over the same window, in percent of one core.
    pub daemon_pct: f64,
    /// Agent CPU per probe run, in microseconds.
    pub per_probe_us: f64,
}

fn manifest(i: usize, image: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: probed-{i}}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: web\n    image: {image}\n    command: [httpd, -f, -p, '8080']\n    readinessProbe: {{tcpSocket: {{port: 8080}}, periodSeconds: 1}}\n"
    )
}

pub async fn probe_cost(
    bin: &Path,
    socket: &Path,
    daemon_pid: i32,
    dir: &Path,
    image: &str,
    pods: usize,
    seconds: u64,
) -> Result<ProbeCost> {
    let (manifests, state, logs) = (dir.join("manifests"), dir.join("state"), dir.join("logs"));
    for d in [&manifests, &state, &logs] {
        std::fs::create_dir_all(d)?;
    }
    let cfg = dir.join("agent.toml");
    std::fs::write(&cfg, "")?;
    let log = dir.join("agent.log");
    let mut agent = Command::new(bin)
        .arg("agent")
        .arg("--config")
        .arg(&cfg)
        .arg("--socket")
        .arg(socket)
        .arg("--manifests")
        .arg(&manifests)
        .arg("--state")
        .arg(&state)
        .arg("--log-dir")
        .arg(&logs)
        .args(["--log-level", "warn"])
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&log)?)
        .stderr(std::fs::File::options().append(true).open(&log)?)
        .spawn()
        .context("starting crius agent")?;
    let result = async {
        for i in 0..pods {
            std::fs::write(
                manifests.join(format!("probed-{i}.yaml")),
                manifest(i, image),
            )?;
        }
        let start = Instant::now();
        loop {
            let recs = status::load_all(&state);
            let ready = recs
                .iter()
                .filter(|r| r.phase == Phase::Running && r.condition("Ready"))
                .count();
            if ready == pods {
                break;
            }
            if start.elapsed() > Duration::from_secs(60 + pods as u64 * 2) {
                bail!(
                    "only {ready} of {pods} probed pods became ready; see {}",
                    log.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        // Let start-up work settle, then measure a quiet window.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let pid = agent.id() as i32;
        let (a0, d0) = (peers::cpu_ticks(pid), peers::cpu_ticks(daemon_pid));
        let t0 = Instant::now();
        tokio::time::sleep(Duration::from_secs(seconds)).await;
        let wall = t0.elapsed().as_secs_f64();
        let (a1, d1) = (peers::cpu_ticks(pid), peers::cpu_ticks(daemon_pid));
        let tick = 100.0; // USER_HZ
        let agent_s = (a1 - a0) as f64 / tick;
        Ok(ProbeCost {
            agent_pct: agent_s / wall * 100.0,
            daemon_pct: (d1 - d0) as f64 / tick / wall * 100.0,
            per_probe_us: agent_s / (pods as f64 * wall) * 1e6,
        })
    }
    .await;
    // The pods go with their manifests; wait for the agent to take them down.
    for i in 0..pods {
        let _ = std::fs::remove_file(manifests.join(format!("probed-{i}.yaml")));
    }
    let start = Instant::now();
    while !status::load_all(&state).is_empty() && start.elapsed() < Duration::from_secs(120) {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let _ = agent.kill();
    let _ = agent.wait();
    result
}
