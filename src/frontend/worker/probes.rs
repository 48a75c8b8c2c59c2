//! Startup, liveness and readiness probes: a task per probe and container that reports each
//! result, with the verdict when the thresholds flip it, and the worker acting on those reports
//! (started, ready, or killed to be restarted).

use std::time::Duration;

use crate::cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_openapi::api::core::v1::{Container, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use tokio::sync::mpsc;
use tonic::transport::Channel;

use super::Worker;
use crate::frontend::probe::{self, Outcome, Target};
use crate::frontend::status::{self, now};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ProbeKind {
    Startup,
    Liveness,
    Readiness,
}

impl ProbeKind {
    fn name(self) -> &'static str {
        match self {
            ProbeKind::Startup => "Startup",
            ProbeKind::Liveness => "Liveness",
            ProbeKind::Readiness => "Readiness",
        }
    }
}

/// A probe's report to its worker.
pub(super) struct ProbeReport {
    container: String,
    id: String,
    kind: ProbeKind,
    outcome: Outcome,
    /// The verdict after thresholds, when it changed.
    verdict: Option<bool>,
}

impl Worker {
    pub(super) fn spawn_probe(&mut self, c: &Container, id: &str, kind: ProbeKind) {
        let p = match kind {
            ProbeKind::Startup => c.startup_probe.clone(),
            ProbeKind::Liveness => c.liveness_probe.clone(),
            ProbeKind::Readiness => c.readiness_probe.clone(),
        };
        let Some(p) = p else {
            return;
        };
        let task = tokio::spawn(probe_loop(
            kind,
            p,
            c.clone(),
            id.to_string(),
            self.target.clone(),
            self.sh.rt.clone(),
            self.probe_tx.clone(),
        ));
        self.probes
            .entry(c.name.clone())
            .or_default()
            .push(task.abort_handle());
    }

    pub(super) fn stop_all_probes(&mut self) {
        for (_, hs) in self.probes.drain() {
            for h in hs {
                h.abort();
            }
        }
    }

    pub(super) fn stop_probes(&mut self, name: &str) {
        for h in self.probes.remove(name).unwrap_or_default() {
            h.abort();
        }
    }

    /// Records a probe result and acts on its verdict; says whether the pod needs a sync pass
    /// (a container to start or restart).
    pub(super) async fn on_probe(&mut self, p: ProbeReport) -> bool {
        let spec = self.spec();
        let Some(c) = spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
            .find(|c| c.name == p.container)
            .cloned()
        else {
            return false;
        };
        let Some(rec) = self.rec.container(&p.container) else {
            return false;
        };
        if rec.id.as_deref() != Some(p.id.as_str()) {
            return false;
        }
        let result = match &p.outcome {
            Outcome::Success(_) => "Success",
            Outcome::Failure(_) => "Failure",
            Outcome::Unknown(_) => "Unknown",
        };
        let message = p.outcome.message();
        let same = rec
            .probes
            .get(p.kind.name())
            .is_some_and(|s| s.result == result && s.message == message);
        if !same {
            rec.probes.insert(
                p.kind.name().to_string(),
                status::ProbeState {
                    result: result.into(),
                    message: message.to_string(),
                    at: now(),
                },
            );
        }
        if let Outcome::Failure(m) = &p.outcome {
            let msg = format!("{} probe failed: {m}", p.kind.name());
            self.rec.event("Warning", "Unhealthy", &p.container, msg);
        }
        let Some(verdict) = p.verdict else {
            return false;
        };
        let mut acted = false;
        match (p.kind, verdict) {
            (ProbeKind::Startup, true) => {
                if let Some(rec) = self.rec.container(&p.container) {
                    rec.started = true;
                    rec.ready = c.readiness_probe.is_none();
                }
                self.stop_probes(&p.container);
                self.spawn_probe(&c, &p.id, ProbeKind::Liveness);
                self.spawn_probe(&c, &p.id, ProbeKind::Readiness);
                acted = true;
            }
            (ProbeKind::Readiness, r) => {
                if let Some(rec) = self.rec.container(&p.container) {
                    rec.ready = r;
                }
            }
            (ProbeKind::Startup | ProbeKind::Liveness, false) => {
                let what = if p.kind == ProbeKind::Startup {
                    "failed startup probe"
                } else {
                    "failed liveness probe"
                };
                self.rec.event(
                    "Normal",
                    "Killing",
                    &p.container,
                    format!("Container {} {what}, will be restarted", p.container),
                );
                self.stop_probes(&p.container);
                let probe = if p.kind == ProbeKind::Startup {
                    c.startup_probe.as_ref()
                } else {
                    c.liveness_probe.as_ref()
                };
                let grace = probe
                    .and_then(|x| x.termination_grace_period_seconds)
                    .unwrap_or_else(|| self.grace());
                self.save();
                self.stop_container(&p.container, &p.id, grace).await;
                acted = true;
            }
            (ProbeKind::Liveness, true) => {}
        }
        self.update_phase();
        self.save();
        acted
    }
}

/// A probe or hook port: a number, or the name of one of the container's ports.
pub(super) fn port_number(port: &IntOrString, c: &Container) -> Option<u16> {
    match port {
        IntOrString::Int(i) => u16::try_from(*i).ok(),
        IntOrString::String(name) => c
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(name.as_str()))
            .and_then(|p| u16::try_from(p.container_port).ok()),
    }
}

/// One probe of one container: runs every period after the initial delay and reports each
/// result, with the verdict when the thresholds flip it. A startup probe ends once it succeeds.
async fn probe_loop(
    kind: ProbeKind,
    p: Probe,
    c: Container,
    id: String,
    target: Target,
    mut rt: RuntimeServiceClient<Channel>,
    tx: mpsc::UnboundedSender<ProbeReport>,
) {
    let delay = p.initial_delay_seconds.unwrap_or(0).max(0) as u64;
    let period = Duration::from_secs(p.period_seconds.unwrap_or(10).max(1) as u64);
    let timeout = Duration::from_secs(p.timeout_seconds.unwrap_or(1).max(1) as u64);
    let success_needed = p.success_threshold.unwrap_or(1).max(1) as u32;
    let failure_needed = p.failure_threshold.unwrap_or(3).max(1) as u32;
    tokio::time::sleep(Duration::from_secs(delay)).await;
    let mut ticker = tokio::time::interval(period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (mut successes, mut failures) = (0u32, 0u32);
    let mut verdict: Option<bool> = None;
    loop {
        ticker.tick().await;
        let outcome = run_probe(&p, &c, &id, &target, &mut rt, timeout).await;
        let mut flip = None;
        match &outcome {
            Outcome::Success(_) => {
                successes += 1;
                failures = 0;
                if successes >= success_needed && verdict != Some(true) {
                    verdict = Some(true);
                    flip = Some(true);
                }
            }
            Outcome::Failure(_) => {
                failures += 1;
                successes = 0;
                if failures >= failure_needed && verdict != Some(false) {
                    verdict = Some(false);
                    flip = Some(false);
                }
            }
            Outcome::Unknown(_) => {}
        }
        let done = kind == ProbeKind::Startup && flip == Some(true);
        let failed_out = kind != ProbeKind::Readiness && flip == Some(false);
        if tx
            .send(ProbeReport {
                container: c.name.clone(),
                id: id.clone(),
                kind,
                outcome,
                verdict: flip,
            })
            .is_err()
            || done
            || failed_out
        {
            return;
        }
    }
}

async fn run_probe(
    p: &Probe,
    c: &Container,
    id: &str,
    target: &Target,
    rt: &mut RuntimeServiceClient<Channel>,
    timeout: Duration,
) -> Outcome {
    if let Some(e) = &p.exec {
        return probe::exec(rt, id, e.command.as_deref().unwrap_or_default(), timeout).await;
    }
    if let Some(h) = &p.http_get {
        let Some(port) = port_number(&h.port, c) else {
            return Outcome::Unknown("unknown port".into());
        };
        return probe::http(target, h, port, timeout).await;
    }
    if let Some(t) = &p.tcp_socket {
        let Some(port) = port_number(&t.port, c) else {
            return Outcome::Unknown("unknown port".into());
        };
        return probe::tcp(target, t.host.as_deref().unwrap_or(""), port, timeout).await;
    }
    if let Some(g) = &p.grpc {
        let Ok(port) = u16::try_from(g.port) else {
            return Outcome::Unknown("bad port".into());
        };
        return probe::grpc(target, port, g.service.as_deref().unwrap_or(""), timeout).await;
    }
    Outcome::Unknown("no handler".into())
}
