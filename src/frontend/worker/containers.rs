//! Init containers one by one (sidecars started and kept running), then the app containers, each
//! (re)started by the restart policy with back-off: created and started through CRI, postStart
//! run, then its probes started.

use std::time::Duration;

use crate::cri::v1 as cri;
use k8s_openapi::api::core::v1::{Container, LifecycleHandler};

use super::probes::{ProbeKind, port_number};
use super::{Worker, pod_context};
use crate::frontend::convert::{self, ConfigError, PodContext};
use crate::frontend::probe::{self, Outcome};
use crate::frontend::status::{Phase, State, now};

/// Why a lifecycle hook failed.
#[derive(Debug, thiserror::Error)]
enum HookError {
    /// The action ran and failed: what its outcome said.
    #[error("{0}")]
    Failed(String),
    /// An httpGet hook names a port the container does not have.
    #[error("unknown port")]
    UnknownPort,
}

/// One run of a container about to be made: its number (the restart count) and the ID of the
/// run before, if any.
struct Attempt {
    number: u32,
    previous: Option<String>,
}

impl Worker {
    /// Init containers in order; true once every one has completed (sidecars: started).
    pub(super) async fn run_init(&mut self) -> bool {
        let spec = self.spec();
        for c in spec.init_containers.iter().flatten() {
            let Some(rec) = self.rec.all().find(|r| r.name == c.name).cloned() else {
                continue;
            };
            if rec.sidecar {
                match &rec.state {
                    State::Running { .. } if rec.id.is_some() => {
                        if !rec.started {
                            return false;
                        }
                        continue;
                    }
                    State::Terminated { finished_at, .. } => {
                        if !self.restart_later(&c.name, *finished_at) {
                            self.start(c, true).await;
                        }
                        return false;
                    }
                    _ => {
                        if rec.id.is_none() {
                            self.start(c, true).await;
                        }
                        return false;
                    }
                }
            }
            match &rec.state {
                State::Terminated { exit_code: 0, .. } if rec.id.is_some() => continue,
                State::Running { .. } if rec.id.is_some() => return false,
                State::Terminated {
                    exit_code,
                    finished_at,
                    ..
                } if rec.id.is_some() => {
                    if self.restart_policy() == "Never" {
                        self.rec.phase = Phase::Failed;
                        self.rec.reason = "Init:Error".into();
                        self.rec.message =
                            format!("init container {} exited with {exit_code}", c.name);
                        return false;
                    }
                    if !self.restart_later(&c.name, *finished_at) {
                        self.start(c, true).await;
                    }
                    return false;
                }
                _ => {
                    if self.restart_later_pull(&c.name) {
                        return false;
                    }
                    self.start(c, true).await;
                    return false;
                }
            }
        }
        self.rec.set_condition("Initialized", true);
        true
    }

    /// Whether a restart must wait for back-off; records CrashLoopBackOff if so.
    fn restart_later(&mut self, name: &str, finished: i64) -> bool {
        let t = now();
        let Some(rec) = self.rec.container(name) else {
            return true;
        };
        match rec.backoff.wait_until(finished, t) {
            Some(until) => {
                let msg = format!(
                    "back-off {}s restarting failed container={name} pod={}",
                    rec.backoff.delay,
                    self.loaded.object.key()
                );
                if !matches!(&rec.state, State::Waiting { reason, .. } if reason == "CrashLoopBackOff")
                {
                    if let State::Terminated { .. } = &rec.state {
                        rec.last_state = Some(rec.state.clone());
                    }
                    rec.state = State::waiting("CrashLoopBackOff", msg.clone());
                }
                self.rec.event(
                    "Warning",
                    "BackOff",
                    name,
                    format!("Back-off restarting failed container {name}"),
                );
                self.wake = Some(self.wake.map_or(until, |w| w.min(until)));
                true
            }
            None => false,
        }
    }

    /// Whether an image pull must wait for back-off.
    fn restart_later_pull(&mut self, name: &str) -> bool {
        let t = now();
        let Some(rec) = self.rec.container(name) else {
            return true;
        };
        if !matches!(&rec.state, State::Waiting { reason, .. } if reason == "ErrImagePull" || reason == "ImagePullBackOff")
        {
            return false;
        }
        match rec.pull_backoff.wait_until(rec.pull_backoff.updated, t) {
            Some(until) => {
                let image = rec.image.clone();
                rec.state = State::waiting(
                    "ImagePullBackOff",
                    format!("Back-off pulling image {image:?}"),
                );
                self.rec.event(
                    "Normal",
                    "BackOff",
                    name,
                    format!("Back-off pulling image {image:?}"),
                );
                self.wake = Some(self.wake.map_or(until, |w| w.min(until)));
                true
            }
            None => false,
        }
    }

    pub(super) async fn run_app(&mut self) {
        let spec = self.spec();
        let policy = self.restart_policy();
        for c in &spec.containers {
            let Some(rec) = self.rec.all().find(|r| r.name == c.name).cloned() else {
                continue;
            };
            match &rec.state {
                State::Running { .. } if rec.id.is_some() => {}
                State::Terminated {
                    exit_code,
                    finished_at,
                    ..
                } if rec.id.is_some() => {
                    let again = policy == "Always" || (policy == "OnFailure" && *exit_code != 0);
                    if again && !self.restart_later(&c.name, *finished_at) {
                        self.start(c, false).await;
                    }
                }
                State::Waiting { reason, .. } if reason == "CrashLoopBackOff" => {
                    let finished = match &rec.last_state {
                        Some(State::Terminated { finished_at, .. }) => *finished_at,
                        _ => 0,
                    };
                    if !self.restart_later(&c.name, finished) {
                        self.start(c, false).await;
                    }
                }
                _ => {
                    if !self.restart_later_pull(&c.name) {
                        self.start(c, false).await;
                    }
                }
            }
        }
    }

    /// Creates and starts a container (again), runs postStart, and starts its probes.
    async fn start(&mut self, c: &Container, init: bool) {
        let image = match self.ensure_image(c).await {
            Ok(i) => i,
            Err((reason, msg)) => {
                if let Some(rec) = self.rec.container(&c.name) {
                    rec.state = State::waiting(&reason, msg);
                }
                let _ = init;
                self.wake = Some(now() + 1);
                return;
            }
        };
        let Some(sandbox) = self.rec.sandbox.clone() else {
            return;
        };
        let Some(Attempt { number, previous }) = self.begin_attempt(&c.name) else {
            return;
        };
        let request = match self.create_request(c, number, &image, sandbox) {
            Ok(r) => r,
            Err(e) => {
                return self.create_failed(&c.name, "CreateContainerConfigError", e.0, previous);
            }
        };
        if let Err(e) = self.check_non_root(c, &image).await {
            let message = e.to_string();
            return self.create_failed(&c.name, "CreateContainerConfigError", message, previous);
        }
        let Some(id) = self.create(&c.name, request, previous).await else {
            return;
        };
        if self.start_created(&c.name, &id).await {
            self.post_start(c, &id).await;
        }
    }

    /// A new run of a container: one that ran before counts a restart (with back-off), its last
    /// run becoming its last state. None if the pod has no such container.
    fn begin_attempt(&mut self, name: &str) -> Option<Attempt> {
        let rec = self.rec.container(name)?;
        let ran = rec.id.is_some()
            || rec.last_state.is_some()
            || matches!(&rec.state, State::Terminated { .. });
        if let State::Terminated { .. } = &rec.state {
            rec.last_state = Some(rec.state.clone());
        }
        if ran {
            rec.restart_count += 1;
            rec.backoff.step(now());
        }
        Some(Attempt {
            number: rec.restart_count,
            previous: rec.id.take(),
        })
    }

    /// The CRI request creating run `attempt` of a container in `sandbox`, after making its log
    /// directory and an empty termination message file.
    fn create_request(
        &self,
        c: &Container,
        attempt: u32,
        image: &str,
        sandbox: String,
    ) -> Result<cri::CreateContainerRequest, ConfigError> {
        let spec = self.spec();
        let log_dir = self.log_dir();
        let _ = std::fs::create_dir_all(log_dir.join(&c.name));
        let term_dir = self.pod_dir().join("termination");
        let _ = std::fs::create_dir_all(&term_dir);
        let term_file = term_dir.join(&c.name);
        let _ = std::fs::write(&term_file, b"");
        let hosts = self.hosts_file();
        let (store, ip) = self.ctx_parts();
        let vols = self.volumes.clone().unwrap_or_default();
        let ctx = PodContext {
            log_dir: &log_dir,
            volumes: &vols,
            hosts_file: hosts.as_deref(),
            ..pod_context(&self.pod, &spec, &self.rec, &store, &self.sh.node, &ip)
        };
        let cfg = convert::container_config(&ctx, c, attempt, image, Some(&term_file))?;
        Ok(cri::CreateContainerRequest {
            pod_sandbox_id: sandbox,
            config: Some(cfg),
            sandbox_config: Some(self.sandbox_config_for(&ctx)),
        })
    }

    /// Creates the container through CRI: its ID, or None once the failure is recorded. The
    /// run before last goes; the last one stays for its logs.
    async fn create(
        &mut self,
        name: &str,
        request: cri::CreateContainerRequest,
        previous: Option<String>,
    ) -> Option<String> {
        let id = match self.sh.rt.create_container(request).await {
            Ok(r) => r.into_inner().container_id,
            Err(s) => {
                let message = s.message().to_string();
                self.create_failed(name, "CreateContainerError", message, previous);
                return None;
            }
        };
        if let Some(old) = previous {
            self.remove_container(&old).await;
        }
        self.rec.event(
            "Normal",
            "Created",
            name,
            format!("Created container {name}"),
        );
        Some(id)
    }

    /// Starts a created container through CRI and records it running (not yet started or
    /// ready, no probe results); false, with a StartError recorded, if it did not start.
    async fn start_created(&mut self, name: &str, id: &str) -> bool {
        if let Err(s) = self
            .sh
            .rt
            .start_container(cri::StartContainerRequest {
                container_id: id.to_string(),
            })
            .await
        {
            self.rec
                .event("Warning", "Failed", name, format!("Error: {}", s.message()));
            if let Some(rec) = self.rec.container(name) {
                rec.id = Some(id.to_string());
                rec.state = State::Terminated {
                    exit_code: 128,
                    reason: "StartError".into(),
                    message: s.message().to_string(),
                    started_at: 0,
                    finished_at: now(),
                };
            }
            return false;
        }
        self.rec.event(
            "Normal",
            "Started",
            name,
            format!("Started container {name}"),
        );
        if let Some(rec) = self.rec.container(name) {
            rec.id = Some(id.to_string());
            rec.state = State::Running { started_at: now() };
            rec.started = false;
            rec.ready = false;
            rec.probes.clear();
        }
        self.save();
        let _ = self.sh.poke.send(());
        true
    }

    /// postStart, which runs before the container counts as started (a failure kills it),
    /// then the probes: startup first if there is one.
    async fn post_start(&mut self, c: &Container, id: &str) {
        let has_startup = c.startup_probe.is_some();
        let has_readiness = c.readiness_probe.is_some();
        if let Some(h) = c.lifecycle.as_ref().and_then(|l| l.post_start.as_ref())
            && let Err(e) = self.run_hook(c, id, h, Duration::from_secs(120)).await
        {
            self.rec.event(
                "Warning",
                "FailedPostStartHook",
                &c.name,
                format!("PostStartHook failed: {e}"),
            );
            self.stop_container(&c.name, id, self.grace()).await;
            return;
        }
        if let Some(rec) = self.rec.container(&c.name) {
            rec.started = !has_startup;
            rec.ready = !has_startup && !has_readiness;
        }
        if has_startup {
            self.spawn_probe(c, id, ProbeKind::Startup);
        } else {
            self.spawn_probe(c, id, ProbeKind::Liveness);
            self.spawn_probe(c, id, ProbeKind::Readiness);
        }
    }

    /// A container that could not be made: a warning event, waiting for `reason`, its last
    /// run kept for its logs, another try in 2 s.
    fn create_failed(
        &mut self,
        name: &str,
        reason: &str,
        message: String,
        previous: Option<String>,
    ) {
        self.rec
            .event("Warning", "Failed", name, format!("Error: {message}"));
        if let Some(rec) = self.rec.container(name) {
            rec.state = State::waiting(reason, message);
            rec.id = previous;
        }
        self.wake = Some(now() + 2);
    }

    async fn remove_container(&mut self, id: &str) {
        let _ = self
            .sh
            .rt
            .remove_container(cri::RemoveContainerRequest {
                container_id: id.to_string(),
            })
            .await;
    }

    /// Runs a lifecycle hook in (or against) the container.
    async fn run_hook(
        &mut self,
        c: &Container,
        id: &str,
        h: &LifecycleHandler,
        timeout: Duration,
    ) -> Result<(), HookError> {
        if let Some(e) = &h.exec {
            let cmd = e.command.clone().unwrap_or_default();
            return match probe::exec(&mut self.sh.rt.clone(), id, &cmd, timeout).await {
                Outcome::Success(_) => Ok(()),
                o => Err(HookError::Failed(o.message().to_string())),
            };
        }
        if let Some(g) = &h.http_get {
            let port = port_number(&g.port, c).ok_or(HookError::UnknownPort)?;
            return match probe::http(&self.target, g, port, timeout).await {
                Outcome::Success(_) => Ok(()),
                o => Err(HookError::Failed(o.message().to_string())),
            };
        }
        if let Some(s) = &h.sleep {
            tokio::time::sleep(Duration::from_secs(s.seconds.max(0) as u64).min(timeout)).await;
        }
        Ok(())
    }
}
