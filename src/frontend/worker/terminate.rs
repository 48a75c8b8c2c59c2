//! Stopping: one container, all of them, or the whole pod (preStop hooks within the grace
//! period, app containers first, sidecars last in reverse order, then the sandbox); the pod
//! failed by its active deadline or evicted; and its sandbox and files removed at the end.

use std::time::Duration;

use crate::cri::v1 as cri;
use crate::cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_openapi::api::core::v1::Container;
use tonic::transport::Channel;

use super::Worker;
use super::probes::port_number;
use crate::frontend::probe::{self, Outcome, Target};
use crate::frontend::status::Phase;
use crate::frontend::volumes;

impl Worker {
    pub(super) async fn stop_container(&mut self, name: &str, id: &str, grace: i64) {
        self.stop_probes(name);
        let _ = self
            .sh
            .rt
            .stop_container(cri::StopContainerRequest {
                container_id: id.to_string(),
                timeout: grace,
            })
            .await;
        let _ = self.sh.poke.send(());
    }

    pub(super) async fn kill_all_containers(&mut self, grace: i64) {
        let running: Vec<(String, String)> = self
            .rec
            .all()
            .filter(|c| c.state.is_running())
            .filter_map(|c| c.id.clone().map(|id| (c.name.clone(), id)))
            .collect();
        for (name, id) in running {
            self.stop_container(&name, &id, grace).await;
        }
        self.observe_stopped().await;
    }

    /// Stops the pod: preStop hooks and stop signals within the grace period, app containers
    /// first and together, then sidecars one by one in reverse order; then the sandbox.
    pub(super) async fn terminate(&mut self, reason: &str) {
        let spec = self.spec();
        let grace = self.grace();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(grace.max(0) as u64);
        let running = |w: &Worker, name: &str| {
            w.rec
                .all()
                .find(|c| c.name == name && c.state.is_running())
                .and_then(|c| c.id.clone())
        };
        let mut apps = Vec::new();
        for c in &spec.containers {
            if let Some(id) = running(self, &c.name) {
                self.begin_stop(&c.name, reason);
                apps.push((c.clone(), id));
            }
        }
        self.save();
        let stops = apps.into_iter().map(|(c, id)| {
            let mut rt = self.sh.rt.clone();
            let target = self.target.clone();
            async move { stop_with_hook(&mut rt, &target, &c, &id, deadline).await }
        });
        for failed in futures_util::future::join_all(stops)
            .await
            .into_iter()
            .flatten()
        {
            self.rec
                .event("Warning", "FailedPreStopHook", &failed.0, failed.1);
        }
        for c in spec.init_containers.iter().flatten().rev() {
            if c.restart_policy.as_deref() != Some("Always") {
                continue;
            }
            if let Some(id) = running(self, &c.name) {
                self.begin_stop(&c.name, reason);
                let mut rt = self.sh.rt.clone();
                if let Some((n, m)) = stop_with_hook(&mut rt, &self.target, c, &id, deadline).await
                {
                    self.rec.event("Warning", "FailedPreStopHook", &n, m);
                }
            }
        }
        let _ = self.sh.poke.send(());
        self.observe_stopped().await;
        if let Some(id) = &self.rec.sandbox {
            let _ = self
                .sh
                .rt
                .stop_pod_sandbox(cri::StopPodSandboxRequest {
                    pod_sandbox_id: id.clone(),
                })
                .await;
        }
        self.rec.set_condition("PodReadyToStartContainers", false);
        for c in self
            .rec
            .init_containers
            .iter_mut()
            .chain(self.rec.containers.iter_mut())
        {
            c.ready = false;
        }
        self.update_phase();
        self.save();
    }

    /// The pod outlived `activeDeadlineSeconds`: it is killed, whatever it was doing, and fails.
    /// A running container about to be stopped for `reason`: its probes end, and a kill
    /// (`Killing`) is told as kubelet tells it.
    fn begin_stop(&mut self, name: &str, reason: &str) {
        self.stop_probes(name);
        if reason == "Killing" {
            self.rec.event(
                "Normal",
                "Killing",
                name,
                format!("Stopping container {name}"),
            );
        }
    }

    pub(super) async fn deadline_exceeded(&mut self) {
        const MESSAGE: &str = "Pod was active on the node longer than the specified deadline";
        self.rec.event("Warning", "DeadlineExceeded", "", MESSAGE);
        self.terminate("Killing").await;
        self.rec.phase = Phase::Failed;
        self.rec.reason = "DeadlineExceeded".into();
        self.rec.message = MESSAGE.into();
        self.save();
    }

    /// The pod used more than it may of the node: it is killed and fails, as kubelet evicts.
    pub(super) async fn evict(&mut self, message: String) {
        self.rec.event("Warning", "Evicted", "", message.clone());
        self.terminate("Killing").await;
        self.rec.phase = Phase::Failed;
        self.rec.reason = "Evicted".into();
        self.rec.message = message;
        self.save();
    }

    /// Removes the pod's sandbox, containers and files.
    pub(super) async fn cleanup(&mut self) {
        self.stop_all_probes();
        if let Some(id) = self.rec.sandbox.take() {
            // Removing the sandbox removes its containers.
            let _ = self
                .sh
                .rt
                .remove_pod_sandbox(cri::RemovePodSandboxRequest { pod_sandbox_id: id })
                .await;
        }
        if let Err(e) = volumes::cleanup(&self.pod_dir()) {
            tracing::warn!(pod = %self.rec.key(), error = %e, "removing the pod's volumes");
        }
    }
}

/// preStop (bounded by the deadline; a hook still running then gets the documented 2 s more),
/// then stop with what is left of the grace period. A failed hook comes back as an event.
async fn stop_with_hook(
    rt: &mut RuntimeServiceClient<Channel>,
    target: &Target,
    c: &Container,
    id: &str,
    deadline: tokio::time::Instant,
) -> Option<(String, String)> {
    let mut failed = None;
    if let Some(h) = c.lifecycle.as_ref().and_then(|l| l.pre_stop.as_ref()) {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let hook = async {
            if let Some(e) = &h.exec {
                let cmd = e.command.clone().unwrap_or_default();
                let mut rt2 = rt.clone();
                return match probe::exec(&mut rt2, id, &cmd, left.max(Duration::from_secs(1))).await
                {
                    Outcome::Success(_) => Ok(()),
                    o => Err(o.message().to_string()),
                };
            }
            if let Some(g) = &h.http_get {
                let Some(port) = port_number(&g.port, c) else {
                    return Err("unknown port".to_string());
                };
                return match probe::http(target, g, port, left.max(Duration::from_secs(1))).await {
                    Outcome::Success(_) => Ok(()),
                    o => Err(o.message().to_string()),
                };
            }
            if let Some(s) = &h.sleep {
                tokio::time::sleep(Duration::from_secs(s.seconds.max(0) as u64)).await;
            }
            Ok(())
        };
        match tokio::time::timeout(left + Duration::from_secs(2), hook).await {
            Ok(Ok(())) => {}
            Ok(Err(m)) => failed = Some((c.name.clone(), format!("PreStopHook failed: {m}"))),
            Err(_) => {}
        }
    }
    let left = deadline
        .saturating_duration_since(tokio::time::Instant::now())
        .as_secs_f64()
        .ceil() as i64;
    let _ = rt
        .stop_container(cri::StopContainerRequest {
            container_id: id.to_string(),
            timeout: left,
        })
        .await;
    failed
}
