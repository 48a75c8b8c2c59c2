//! One pod's lifecycle, driven through CRI by a task of its own, the way kubelet's pod workers
//! do it: volumes, then the sandbox (re-made if it dies), then image pulls, init containers one
//! by one (sidecars started and kept running), then the app containers with their postStart
//! hooks; probes; restarts by restart policy with back-off; and termination (preStop hooks
//! within the grace period, app containers first, sidecars last in reverse order). The record
//! it keeps (`status`) is saved whenever it changes.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use k8s_cri::v1 as cri;
use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_openapi::api::core::v1::{Container, LifecycleHandler, Pod, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use tokio::sync::{mpsc, watch};
use tonic::transport::Channel;

use super::convert::{self, Node, PodContext, Store};
use super::manifest::Loaded;
use super::probe::{self, Outcome, Target};
use super::status::{self, ContainerRecord, Phase, PodRecord, State, now};
use super::volumes;

/// What the runtime reported on its last relist.
#[derive(Debug, Default, PartialEq)]
pub struct Snapshot {
    pub sandboxes: HashMap<String, cri::PodSandbox>,
    pub containers: HashMap<String, cri::Container>,
}

/// Everything a worker shares with the agent.
#[derive(Clone)]
pub struct Shared {
    pub rt: RuntimeServiceClient<Channel>,
    pub img: ImageServiceClient<Channel>,
    /// The agent's state directory (records, volumes).
    pub state: PathBuf,
    /// Where container logs go (`/var/log/pods`).
    pub log_root: PathBuf,
    pub node: Arc<Node>,
    pub store: watch::Receiver<Arc<Store>>,
    pub relist: watch::Receiver<Arc<Snapshot>>,
    /// Asks the agent to relist at once.
    pub poke: mpsc::UnboundedSender<()>,
}

pub enum Command {
    /// The manifest changed: the pod is replaced.
    Update(Box<Loaded>),
    /// The manifest is gone: the pod is stopped and forgotten.
    Delete,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ProbeKind {
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
struct ProbeReport {
    container: String,
    id: String,
    kind: ProbeKind,
    outcome: Outcome,
    /// The verdict after thresholds, when it changed.
    verdict: Option<bool>,
}

pub struct Worker {
    sh: Shared,
    loaded: Loaded,
    pod: Pod,
    rec: PodRecord,
    cmds: mpsc::Receiver<Command>,
    probe_tx: mpsc::UnboundedSender<ProbeReport>,
    probe_rx: mpsc::UnboundedReceiver<ProbeReport>,
    /// Running probe tasks by container name.
    probes: HashMap<String, Vec<tokio::task::AbortHandle>>,
    volumes: Option<HashMap<String, PathBuf>>,
    target: Target,
    /// The next time a back-off ends.
    wake: Option<i64>,
    saved: Option<PodRecord>,
    last_refresh: i64,
    /// When disk-backed emptyDir volumes were last measured against their sizeLimit.
    last_usage_check: i64,
}

fn pod_key(l: &Loaded) -> (String, String) {
    let k = l.object.key();
    let (ns, name) = k.split_once('/').unwrap_or(("default", &k));
    (ns.to_string(), name.to_string())
}

fn new_uid() -> String {
    let mut b = [0u8; 16];
    let _ = getrandom::fill(&mut b);
    let h = hex::encode(b);
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

/// A fresh record for a pod manifest.
pub fn new_record(l: &Loaded, pod: &Pod) -> PodRecord {
    let (namespace, name) = pod_key(l);
    let spec = pod.spec.clone().unwrap_or_default();
    let uid = pod.metadata.uid.clone().unwrap_or_else(new_uid);
    PodRecord {
        namespace,
        name,
        uid,
        hash: l.hash.clone(),
        file: l.file.clone(),
        created_at: now(),
        phase: Phase::Pending,
        reason: String::new(),
        message: String::new(),
        qos: convert::qos(&spec).to_string(),
        sandbox: None,
        sandbox_attempt: 0,
        pod_ip: String::new(),
        conditions: Vec::new(),
        init_containers: spec
            .init_containers
            .iter()
            .flatten()
            .map(|c| {
                ContainerRecord::new(
                    &c.name,
                    c.image.as_deref().unwrap_or(""),
                    c.restart_policy.as_deref() == Some("Always"),
                )
            })
            .collect(),
        containers: spec
            .containers
            .iter()
            .map(|c| ContainerRecord::new(&c.name, c.image.as_deref().unwrap_or(""), false))
            .collect(),
        events: Vec::new(),
    }
}

fn pod_of(l: &Loaded) -> Pod {
    match &l.object {
        super::manifest::Object::Pod(p) => (**p).clone(),
        _ => Pod::default(),
    }
}

/// The image pull policy, defaulted as the API server does: Always for `:latest` or no tag.
fn pull_policy(c: &Container) -> String {
    if let Some(p) = &c.image_pull_policy {
        return p.clone();
    }
    let image = c.image.as_deref().unwrap_or("");
    if image.contains('@') {
        return "IfNotPresent".into();
    }
    let last = image.rsplit('/').next().unwrap_or(image);
    match last.split_once(':') {
        None => "Always".into(),
        Some((_, "latest")) => "Always".into(),
        Some(_) => "IfNotPresent".into(),
    }
}

/// The registry host of an image reference, as docker config files name it.
fn registry_host(image: &str) -> String {
    match image.split_once('/') {
        Some((first, _)) if first.contains(['.', ':']) || first == "localhost" => first.to_string(),
        _ => "docker.io".into(),
    }
}

impl Worker {
    pub fn new(
        sh: Shared,
        loaded: Loaded,
        adopted: Option<PodRecord>,
        cmds: mpsc::Receiver<Command>,
    ) -> Worker {
        let pod = pod_of(&loaded);
        let rec = match adopted {
            Some(r) if r.hash == loaded.hash => r,
            _ => new_record(&loaded, &pod),
        };
        let (probe_tx, probe_rx) = mpsc::unbounded_channel();
        Worker {
            sh,
            loaded,
            pod,
            rec,
            cmds,
            probe_tx,
            probe_rx,
            probes: HashMap::new(),
            volumes: None,
            target: Target::default(),
            wake: None,
            saved: None,
            last_refresh: 0,
            last_usage_check: 0,
        }
    }

    fn spec(&self) -> k8s_openapi::api::core::v1::PodSpec {
        self.pod.spec.clone().unwrap_or_default()
    }

    fn pod_dir(&self) -> PathBuf {
        self.sh.state.join("pods").join(&self.rec.uid)
    }

    fn log_dir(&self) -> PathBuf {
        self.sh.log_root.join(format!(
            "{}_{}_{}",
            self.rec.namespace, self.rec.name, self.rec.uid
        ))
    }

    fn save(&mut self) {
        if self.saved.as_ref() == Some(&self.rec) {
            return;
        }
        if let Err(e) = status::save(&self.sh.state, &self.rec) {
            tracing::warn!(pod = %self.rec.key(), error = %e, "saving the pod record");
        }
        self.saved = Some(self.rec.clone());
    }

    /// Runs the pod until it is deleted.
    pub async fn run(mut self) {
        let mut relist = self.sh.relist.clone();
        let mut store = self.sh.store.clone();
        let mut pending: Option<Command> = None;
        // A probe result that changes nothing needs no sync pass: with hundreds of probed pods
        // those would be most of the agent's work. The timer still syncs at least every 2 s.
        let mut sync_needed = true;
        let mut next_sync = tokio::time::Instant::now();
        loop {
            match pending.take() {
                Some(Command::Delete) => {
                    self.terminate("Killing").await;
                    self.cleanup().await;
                    status::remove(&self.sh.state, &self.rec.namespace, &self.rec.name);
                    return;
                }
                Some(Command::Update(l)) => {
                    self.rec.event(
                        "Normal",
                        "Killing",
                        "",
                        "the pod's manifest changed; it is replaced",
                    );
                    self.save();
                    self.terminate("Killing").await;
                    self.cleanup().await;
                    self.pod = pod_of(&l);
                    self.rec = new_record(&l, &self.pod);
                    self.loaded = *l;
                    self.volumes = None;
                }
                None => {}
            }
            if sync_needed || tokio::time::Instant::now() >= next_sync {
                self.sync().await;
                let sleep = match self.wake {
                    Some(t) => Duration::from_secs((t - now()).clamp(0, 2) as u64),
                    None => Duration::from_secs(2),
                };
                next_sync = tokio::time::Instant::now() + sleep;
            }
            self.save();
            sync_needed = true;
            tokio::select! {
                r = relist.changed() => { if r.is_err() { return; } }
                r = store.changed() => { if r.is_err() { return; } }
                c = self.cmds.recv() => match c {
                    Some(c) => pending = Some(c),
                    None => return,
                },
                Some(p) = self.probe_rx.recv() => sync_needed = self.on_probe(p).await,
                _ = tokio::time::sleep_until(next_sync) => {}
            }
        }
    }

    fn ctx_parts(&self) -> (Arc<Store>, String) {
        (self.sh.store.borrow().clone(), self.rec.pod_ip.clone())
    }

    /// One pass of the state machine.
    async fn sync(&mut self) {
        self.wake = None;
        if matches!(self.rec.phase, Phase::Succeeded | Phase::Failed) {
            // A pod killed for good (deadline, eviction) still has its last exits to record.
            if self.rec.all().any(|c| c.state.is_running()) {
                self.observe().await;
            }
            return;
        }
        // activeDeadlineSeconds counts from when the node took the pod, init containers included.
        if let Some(limit) = self.spec().active_deadline_seconds
            && now() >= self.rec.created_at + limit
        {
            self.deadline_exceeded().await;
            return;
        }
        if !self.ensure_volumes() {
            return;
        }
        // As kubelet's eviction manager: a disk-backed emptyDir past its sizeLimit evicts the pod
        // (measured every 10 s, since walking a volume is not free).
        if now() - self.last_usage_check >= 10 {
            self.last_usage_check = now();
            if let Some(message) = volumes::over_limit(&self.spec(), &self.pod_dir()) {
                self.evict(message).await;
                return;
            }
        }
        if !self.ensure_sandbox().await {
            return;
        }
        self.observe().await;
        if !self.run_init().await {
            self.update_phase();
            return;
        }
        self.run_app().await;
        self.update_phase();
        if matches!(self.rec.phase, Phase::Succeeded | Phase::Failed) {
            // Done: sidecars and the sandbox go; the record and logs stay.
            self.terminate("Completed").await;
        }
    }

    fn ensure_volumes(&mut self) -> bool {
        let spec = self.spec();
        let (store, ip) = self.ctx_parts();
        let empty = HashMap::new();
        let ctx = PodContext {
            pod: &self.pod,
            spec: &spec,
            namespace: &self.rec.namespace,
            name: &self.rec.name,
            uid: &self.rec.uid,
            store: &store,
            node: &self.sh.node,
            log_dir: Path::new(""),
            volumes: &empty,
            hosts_file: None,
            pod_ip: &ip,
        };
        let pod_dir = self.pod_dir();
        if self.volumes.is_none() {
            match volumes::prepare(&ctx, &pod_dir) {
                Ok(v) => self.volumes = Some(v),
                Err(e) => {
                    self.rec.event("Warning", "FailedMount", "", e.to_string());
                    self.rec.reason = "ContainerCreating".into();
                    self.wake = Some(now() + 2);
                    return false;
                }
            }
            self.last_refresh = now();
        } else if now() - self.last_refresh >= 1 {
            // Secrets and ConfigMaps edited since are written through to their volumes.
            self.last_refresh = now();
            for v in volumes::refresh(&ctx, &pod_dir) {
                tracing::info!(pod = %self.rec.key(), volume = %v, "volume updated");
            }
        }
        true
    }

    /// The hosts file of the pod when it has hostAliases.
    fn hosts_file(&self) -> Option<PathBuf> {
        let spec = self.pod.spec.as_ref()?;
        let aliases = spec.host_aliases.as_ref()?;
        let path = self.pod_dir().join("etc-hosts");
        if !path.exists() {
            let mut text =
                String::from("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n");
            let hostname = spec
                .hostname
                .clone()
                .unwrap_or_else(|| self.rec.name.clone());
            text.push_str(&format!("127.0.1.1\t{hostname}\n"));
            text.push_str("\n# Entries added by HostAliases.\n");
            for a in aliases {
                text.push_str(&format!(
                    "{}\t{}\n",
                    a.ip,
                    a.hostnames.clone().unwrap_or_default().join("\t")
                ));
            }
            let _ = std::fs::create_dir_all(self.pod_dir());
            let _ = crate::atomic::write(&path, text.as_bytes(), 0o644);
        }
        Some(path)
    }

    async fn ensure_sandbox(&mut self) -> bool {
        if let Some(id) = self.rec.sandbox.clone() {
            let ready = self
                .sh
                .relist
                .borrow()
                .sandboxes
                .get(&id)
                .map(|s| s.state == cri::PodSandboxState::SandboxReady as i32);
            match ready {
                Some(true) => return true,
                // Not seen yet (just made, or the relist is behind): ask the runtime.
                None => {
                    if let Ok(r) = self
                        .sh
                        .rt
                        .pod_sandbox_status(cri::PodSandboxStatusRequest {
                            pod_sandbox_id: id.clone(),
                            verbose: false,
                        })
                        .await
                        && r.into_inner()
                            .status
                            .is_some_and(|s| s.state == cri::PodSandboxState::SandboxReady as i32)
                    {
                        return true;
                    }
                }
                Some(false) => {}
            }
            self.rec.event(
                "Normal",
                "SandboxChanged",
                "",
                "Pod sandbox changed, it will be killed and re-created.",
            );
            self.kill_all_containers(0).await;
            self.stop_all_probes();
            let _ = self
                .sh
                .rt
                .stop_pod_sandbox(cri::StopPodSandboxRequest {
                    pod_sandbox_id: id.clone(),
                })
                .await;
            let _ = self
                .sh
                .rt
                .remove_pod_sandbox(cri::RemovePodSandboxRequest { pod_sandbox_id: id })
                .await;
            self.rec.sandbox = None;
            self.rec.sandbox_attempt += 1;
            for c in self
                .rec
                .init_containers
                .iter_mut()
                .chain(self.rec.containers.iter_mut())
            {
                if c.id.is_some() {
                    c.id = None;
                    c.exited = None;
                    c.started = false;
                    c.ready = false;
                }
            }
            self.rec.set_condition("PodReadyToStartContainers", false);
        }
        let spec = self.spec();
        let log_dir = self.log_dir();
        let _ = std::fs::create_dir_all(&log_dir);
        let (store, ip) = self.ctx_parts();
        let vols = self.volumes.clone().unwrap_or_default();
        let ctx = PodContext {
            pod: &self.pod,
            spec: &spec,
            namespace: &self.rec.namespace,
            name: &self.rec.name,
            uid: &self.rec.uid,
            store: &store,
            node: &self.sh.node,
            log_dir: &log_dir,
            volumes: &vols,
            hosts_file: None,
            pod_ip: &ip,
        };
        let mut cfg = convert::sandbox_config(&ctx, self.rec.sandbox_attempt);
        cfg.labels
            .insert(super::agent::AGENT_LABEL.into(), "true".into());
        let handler = spec.runtime_class_name.clone().unwrap_or_default();
        match self
            .sh
            .rt
            .run_pod_sandbox(cri::RunPodSandboxRequest {
                config: Some(cfg),
                runtime_handler: handler,
            })
            .await
        {
            Ok(r) => {
                let id = r.into_inner().pod_sandbox_id;
                self.rec.sandbox = Some(id.clone());
                self.rec.reason.clear();
                self.rec.set_condition("PodReadyToStartContainers", true);
                self.target = self.sandbox_target(&id).await;
                self.rec.pod_ip = self.target.pod_ip.clone();
                let _ = self.sh.poke.send(());
                true
            }
            Err(s) => {
                self.rec.event(
                    "Warning",
                    "FailedCreatePodSandBox",
                    "",
                    format!("Failed to create pod sandbox: {}", s.message()),
                );
                self.rec.reason = "ContainerCreating".into();
                self.wake = Some(now() + 5);
                false
            }
        }
    }

    /// The pod's network namespace and IP, from the runtime's verbose status: crius reports
    /// `netNamespacePath`, containerd its runtime spec.
    async fn sandbox_target(&mut self, id: &str) -> Target {
        let Ok(r) = self
            .sh
            .rt
            .pod_sandbox_status(cri::PodSandboxStatusRequest {
                pod_sandbox_id: id.to_string(),
                verbose: true,
            })
            .await
        else {
            return Target::default();
        };
        let r = r.into_inner();
        let ip = r
            .status
            .as_ref()
            .and_then(|s| s.network.as_ref())
            .map(|n| n.ip.clone())
            .unwrap_or_default();
        let host_net = self.pod.spec.as_ref().and_then(|s| s.host_network) == Some(true);
        let info: serde_json::Value = r
            .info
            .get("info")
            .and_then(|s| serde_json::from_str(s).ok())
            .unwrap_or_default();
        let netns = info["netNamespacePath"]
            .as_str()
            .map(PathBuf::from)
            .or_else(|| {
                info["runtimeSpec"]["linux"]["namespaces"]
                    .as_array()?
                    .iter()
                    .find(|n| n["type"] == "network")?["path"]
                    .as_str()
                    .map(PathBuf::from)
            });
        Target {
            netns: if host_net { None } else { netns },
            pod_ip: ip,
        }
    }

    /// Brings the container records up to date with the runtime.
    async fn observe(&mut self) {
        self.observe_with(false).await
    }

    /// After stopping containers: the last relist predates their exits, so every container
    /// recorded as running is asked about directly.
    async fn observe_stopped(&mut self) {
        self.observe_with(true).await
    }

    async fn observe_with(&mut self, ask_running: bool) {
        let snapshot = self.sh.relist.borrow().clone();
        let names: Vec<String> = self.rec.all().map(|c| c.name.clone()).collect();
        for name in names {
            let Some(rec) = self.rec.container(&name) else {
                continue;
            };
            let Some(id) = rec.id.clone() else {
                continue;
            };
            if rec.exited.as_deref() == Some(id.as_str()) {
                continue;
            }
            let seen = snapshot.containers.get(&id).map(|c| c.state);
            let exited = seen == Some(cri::ContainerState::ContainerExited as i32)
                || ((seen.is_none() || ask_running) && rec.state.is_running());
            if !exited || matches!(rec.state, State::Terminated { .. }) {
                continue;
            }
            let st = self
                .sh
                .rt
                .container_status(cri::ContainerStatusRequest {
                    container_id: id.clone(),
                    verbose: false,
                })
                .await
                .ok()
                .and_then(|r| r.into_inner().status);
            let term = match st {
                Some(s) if s.state == cri::ContainerState::ContainerExited as i32 => {
                    let mut message = s.message.clone();
                    if message.is_empty() {
                        message = self.termination_message(&name, s.exit_code);
                    }
                    State::Terminated {
                        exit_code: s.exit_code,
                        reason: if s.reason.is_empty() {
                            if s.exit_code == 0 {
                                "Completed".into()
                            } else {
                                "Error".into()
                            }
                        } else {
                            s.reason
                        },
                        message,
                        started_at: s.started_at / 1_000_000_000,
                        finished_at: s.finished_at / 1_000_000_000,
                    }
                }
                Some(_) => continue,
                None => State::Terminated {
                    exit_code: 137,
                    reason: "ContainerStatusUnknown".into(),
                    message: "The container could not be located when the pod was terminated"
                        .into(),
                    started_at: 0,
                    finished_at: now(),
                },
            };
            self.stop_probes(&name);
            if let Some(rec) = self.rec.container(&name) {
                rec.state = term;
                rec.exited = Some(id);
                rec.ready = false;
            }
        }
    }

    /// The termination message a container left in its file (or its log's tail, by policy).
    fn termination_message(&self, name: &str, exit_code: i32) -> String {
        let path = self.pod_dir().join("termination").join(name);
        let msg = std::fs::read(&path)
            .map(|b| String::from_utf8_lossy(&b[..b.len().min(4096)]).into_owned())
            .unwrap_or_default();
        if !msg.is_empty() {
            return msg;
        }
        let fallback = self
            .spec()
            .containers
            .iter()
            .chain(self.spec().init_containers.iter().flatten())
            .find(|c| c.name == name)
            .and_then(|c| c.termination_message_policy.clone())
            .is_some_and(|p| p == "FallbackToLogsOnError");
        if fallback && exit_code != 0 {
            let restarts = self
                .rec
                .all()
                .find(|c| c.name == name)
                .map(|c| c.restart_count)
                .unwrap_or(0);
            let log = self.log_dir().join(name).join(format!("{restarts}.log"));
            let text = std::fs::read_to_string(log).unwrap_or_default();
            let lines: Vec<&str> = text
                .lines()
                .filter_map(|l| l.splitn(4, ' ').nth(3))
                .collect();
            let tail = lines[lines.len().saturating_sub(80)..].join("\n");
            return tail
                .chars()
                .rev()
                .take(2048)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
        }
        String::new()
    }

    fn restart_policy(&self) -> String {
        self.spec()
            .restart_policy
            .unwrap_or_else(|| "Always".into())
    }

    /// Init containers in order; true once every one has completed (sidecars: started).
    async fn run_init(&mut self) -> bool {
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

    async fn run_app(&mut self) {
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

    /// The image to run: pulled by policy, with the pod's pull secrets.
    async fn ensure_image(&mut self, c: &Container) -> Result<String, (String, String)> {
        let image = c.image.clone().unwrap_or_default();
        let policy = pull_policy(c);
        let present = self
            .sh
            .img
            .image_status(cri::ImageStatusRequest {
                image: Some(cri::ImageSpec {
                    image: image.clone(),
                    ..Default::default()
                }),
                verbose: false,
            })
            .await
            .ok()
            .and_then(|r| r.into_inner().image);
        match (policy.as_str(), &present) {
            ("Never", None) => {
                let msg =
                    format!("Container image {image:?} is not present with pull policy of Never");
                self.rec
                    .event("Warning", "ErrImageNeverPull", &c.name, msg.clone());
                return Err(("ErrImageNeverPull".into(), msg));
            }
            ("Never" | "IfNotPresent", Some(i)) => {
                self.rec.event(
                    "Normal",
                    "Pulled",
                    &c.name,
                    format!("Container image {image:?} already present on machine"),
                );
                return Ok(i.id.clone());
            }
            _ => {}
        }
        self.rec.event(
            "Normal",
            "Pulling",
            &c.name,
            format!("Pulling image {image:?}"),
        );
        self.save();
        let started = std::time::Instant::now();
        let auth = self.pull_auth(&image);
        match self
            .sh
            .img
            .pull_image(cri::PullImageRequest {
                image: Some(cri::ImageSpec {
                    image: image.clone(),
                    ..Default::default()
                }),
                auth,
                sandbox_config: None,
            })
            .await
        {
            Ok(r) => {
                self.rec.event(
                    "Normal",
                    "Pulled",
                    &c.name,
                    format!(
                        "Successfully pulled image {image:?} in {:.3}s",
                        started.elapsed().as_secs_f64()
                    ),
                );
                if let Some(rec) = self.rec.container(&c.name) {
                    rec.pull_backoff = Default::default();
                }
                Ok(r.into_inner().image_ref)
            }
            Err(s) => {
                let msg = format!("Failed to pull image {image:?}: {}", s.message());
                self.rec.event("Warning", "Failed", &c.name, msg.clone());
                if let Some(rec) = self.rec.container(&c.name) {
                    rec.pull_backoff.step(now());
                }
                Err(("ErrImagePull".into(), msg))
            }
        }
    }

    /// Credentials for an image from the pod's imagePullSecrets (docker config JSON).
    fn pull_auth(&self, image: &str) -> Option<cri::AuthConfig> {
        let host = registry_host(image);
        let store = self.sh.store.borrow().clone();
        for s in self.spec().image_pull_secrets.iter().flatten() {
            let Some(data) = store.secret(&self.rec.namespace, &s.name) else {
                continue;
            };
            let Some(raw) = data
                .get(".dockerconfigjson")
                .or_else(|| data.get(".dockercfg"))
            else {
                continue;
            };
            let Ok(v) = serde_json::from_slice::<serde_json::Value>(raw) else {
                continue;
            };
            let auths = v.get("auths").unwrap_or(&v);
            let Some(obj) = auths.as_object() else {
                continue;
            };
            for (server, entry) in obj {
                let s = server
                    .trim_start_matches("https://")
                    .trim_start_matches("http://")
                    .trim_end_matches('/');
                let s = s.split('/').next().unwrap_or(s);
                let matches = s == host
                    || (host == "docker.io"
                        && (s == "index.docker.io" || s == "registry-1.docker.io"));
                if matches {
                    let get = |k: &str| entry[k].as_str().unwrap_or("").to_string();
                    return Some(cri::AuthConfig {
                        username: get("username"),
                        password: get("password"),
                        auth: get("auth"),
                        server_address: server.clone(),
                        ..Default::default()
                    });
                }
            }
        }
        None
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
        // A container that ran before counts a restart; its last run is its last state.
        let (attempt, previous) = {
            let Some(rec) = self.rec.container(&c.name) else {
                return;
            };
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
            (rec.restart_count, rec.id.take())
        };
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
            pod: &self.pod,
            spec: &spec,
            namespace: &self.rec.namespace,
            name: &self.rec.name,
            uid: &self.rec.uid,
            store: &store,
            node: &self.sh.node,
            log_dir: &log_dir,
            volumes: &vols,
            hosts_file: hosts.as_deref(),
            pod_ip: &ip,
        };
        let cfg = match convert::container_config(&ctx, c, attempt, &image, Some(&term_file)) {
            Ok(cfg) => cfg,
            Err(e) => {
                self.rec
                    .event("Warning", "Failed", &c.name, format!("Error: {}", e.0));
                if let Some(rec) = self.rec.container(&c.name) {
                    rec.state = State::waiting("CreateContainerConfigError", e.0);
                    rec.id = previous;
                }
                self.wake = Some(now() + 2);
                return;
            }
        };
        // The run before last goes; the last one stays for its logs.
        let sandbox_config = self.sandbox_config_for(&ctx);
        if let Err(msg) = self.check_non_root(c, &image).await {
            self.rec
                .event("Warning", "Failed", &c.name, format!("Error: {msg}"));
            if let Some(rec) = self.rec.container(&c.name) {
                rec.state = State::waiting("CreateContainerConfigError", msg);
                rec.id = previous;
            }
            self.wake = Some(now() + 2);
            return;
        }
        let created = self
            .sh
            .rt
            .create_container(cri::CreateContainerRequest {
                pod_sandbox_id: sandbox.clone(),
                config: Some(cfg),
                sandbox_config: Some(sandbox_config),
            })
            .await;
        let id = match created {
            Ok(r) => r.into_inner().container_id,
            Err(s) => {
                self.rec.event(
                    "Warning",
                    "Failed",
                    &c.name,
                    format!("Error: {}", s.message()),
                );
                if let Some(rec) = self.rec.container(&c.name) {
                    rec.state = State::waiting("CreateContainerError", s.message());
                    rec.id = previous;
                }
                self.wake = Some(now() + 2);
                return;
            }
        };
        if let Some(old) = previous {
            self.remove_container(&old).await;
        }
        self.rec.event(
            "Normal",
            "Created",
            &c.name,
            format!("Created container {}", c.name),
        );
        if let Err(s) = self
            .sh
            .rt
            .start_container(cri::StartContainerRequest {
                container_id: id.clone(),
            })
            .await
        {
            self.rec.event(
                "Warning",
                "Failed",
                &c.name,
                format!("Error: {}", s.message()),
            );
            if let Some(rec) = self.rec.container(&c.name) {
                rec.id = Some(id);
                rec.state = State::Terminated {
                    exit_code: 128,
                    reason: "StartError".into(),
                    message: s.message().to_string(),
                    started_at: 0,
                    finished_at: now(),
                };
            }
            return;
        }
        self.rec.event(
            "Normal",
            "Started",
            &c.name,
            format!("Started container {}", c.name),
        );
        let has_startup = c.startup_probe.is_some();
        let has_readiness = c.readiness_probe.is_some();
        if let Some(rec) = self.rec.container(&c.name) {
            rec.id = Some(id.clone());
            rec.state = State::Running { started_at: now() };
            rec.started = false;
            rec.ready = false;
            rec.probes.clear();
        }
        self.save();
        let _ = self.sh.poke.send(());
        // postStart runs before the container counts as started; a failure kills it.
        if let Some(h) = c.lifecycle.as_ref().and_then(|l| l.post_start.as_ref())
            && let Err(msg) = self.run_hook(c, &id, h, Duration::from_secs(120)).await
        {
            self.rec.event(
                "Warning",
                "FailedPostStartHook",
                &c.name,
                format!("PostStartHook failed: {msg}"),
            );
            self.stop_container(&c.name, &id, self.grace()).await;
            return;
        }
        if let Some(rec) = self.rec.container(&c.name) {
            rec.started = !has_startup;
            rec.ready = !has_startup && !has_readiness;
        }
        if has_startup {
            self.spawn_probe(c, &id, ProbeKind::Startup);
        } else {
            self.spawn_probe(c, &id, ProbeKind::Liveness);
            self.spawn_probe(c, &id, ProbeKind::Readiness);
        }
    }

    fn sandbox_config_for(&self, ctx: &PodContext) -> cri::PodSandboxConfig {
        let mut cfg = convert::sandbox_config(ctx, self.rec.sandbox_attempt);
        cfg.labels
            .insert(super::agent::AGENT_LABEL.into(), "true".into());
        cfg
    }

    /// runAsNonRoot: the user must be known and not root (from the spec, else the image).
    async fn check_non_root(&mut self, c: &Container, image: &str) -> Result<(), String> {
        let pod_sc = self
            .pod
            .spec
            .as_ref()
            .and_then(|s| s.security_context.as_ref());
        let sc = c.security_context.as_ref();
        let non_root = sc
            .and_then(|s| s.run_as_non_root)
            .or_else(|| pod_sc.and_then(|s| s.run_as_non_root))
            .unwrap_or(false);
        if !non_root {
            return Ok(());
        }
        let uid = sc
            .and_then(|s| s.run_as_user)
            .or_else(|| pod_sc.and_then(|s| s.run_as_user));
        let uid = match uid {
            Some(u) => Some(u),
            None => self
                .sh
                .img
                .image_status(cri::ImageStatusRequest {
                    image: Some(cri::ImageSpec {
                        image: image.to_string(),
                        ..Default::default()
                    }),
                    verbose: false,
                })
                .await
                .ok()
                .and_then(|r| r.into_inner().image)
                .and_then(|i| {
                    if !i.username.is_empty() {
                        return Some(-1);
                    }
                    i.uid.map(|u| u.value)
                }),
        };
        match uid {
            Some(0) | None => Err("container has runAsNonRoot and image will run as root".into()),
            Some(-1) => Err(
                "container has runAsNonRoot and image has non-numeric user, cannot verify user is non-root"
                    .into(),
            ),
            Some(_) => Ok(()),
        }
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

    fn grace(&self) -> i64 {
        self.pod
            .spec
            .as_ref()
            .and_then(|s| s.termination_grace_period_seconds)
            .unwrap_or(30)
    }

    /// Runs a lifecycle hook in (or against) the container.
    async fn run_hook(
        &mut self,
        c: &Container,
        id: &str,
        h: &LifecycleHandler,
        timeout: Duration,
    ) -> Result<(), String> {
        if let Some(e) = &h.exec {
            let cmd = e.command.clone().unwrap_or_default();
            return match probe::exec(&mut self.sh.rt.clone(), id, &cmd, timeout).await {
                Outcome::Success(_) => Ok(()),
                o => Err(o.message().to_string()),
            };
        }
        if let Some(g) = &h.http_get {
            let port = port_number(&g.port, c).ok_or("unknown port")?;
            return match probe::http(&self.target, g, port, timeout).await {
                Outcome::Success(_) => Ok(()),
                o => Err(o.message().to_string()),
            };
        }
        if let Some(s) = &h.sleep {
            tokio::time::sleep(Duration::from_secs(s.seconds.max(0) as u64).min(timeout)).await;
        }
        Ok(())
    }

    fn spawn_probe(&mut self, c: &Container, id: &str, kind: ProbeKind) {
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

    fn stop_all_probes(&mut self) {
        for (_, hs) in self.probes.drain() {
            for h in hs {
                h.abort();
            }
        }
    }

    fn stop_probes(&mut self, name: &str) {
        for h in self.probes.remove(name).unwrap_or_default() {
            h.abort();
        }
    }

    /// Records a probe result and acts on its verdict; says whether the pod needs a sync pass
    /// (a container to start or restart).
    async fn on_probe(&mut self, p: ProbeReport) -> bool {
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

    async fn stop_container(&mut self, name: &str, id: &str, grace: i64) {
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

    async fn kill_all_containers(&mut self, grace: i64) {
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
    async fn terminate(&mut self, reason: &str) {
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
                self.stop_probes(&c.name);
                if reason == "Killing" {
                    self.rec.event(
                        "Normal",
                        "Killing",
                        &c.name,
                        format!("Stopping container {}", c.name),
                    );
                }
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
                self.stop_probes(&c.name);
                if reason == "Killing" {
                    self.rec.event(
                        "Normal",
                        "Killing",
                        &c.name,
                        format!("Stopping container {}", c.name),
                    );
                }
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
    async fn deadline_exceeded(&mut self) {
        const MESSAGE: &str = "Pod was active on the node longer than the specified deadline";
        self.rec.event("Warning", "DeadlineExceeded", "", MESSAGE);
        self.terminate("Killing").await;
        self.rec.phase = Phase::Failed;
        self.rec.reason = "DeadlineExceeded".into();
        self.rec.message = MESSAGE.into();
        self.save();
    }

    /// The pod used more than it may of the node: it is killed and fails, as kubelet evicts.
    async fn evict(&mut self, message: String) {
        self.rec.event("Warning", "Evicted", "", message.clone());
        self.terminate("Killing").await;
        self.rec.phase = Phase::Failed;
        self.rec.reason = "Evicted".into();
        self.rec.message = message;
        self.save();
    }

    /// Removes the pod's sandbox, containers and files.
    async fn cleanup(&mut self) {
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

    /// Phase and conditions from the containers' states.
    fn update_phase(&mut self) {
        let policy = self.restart_policy();
        let r = &mut self.rec;
        if r.phase == Phase::Failed
            && matches!(
                r.reason.as_str(),
                "Init:Error" | "DeadlineExceeded" | "Evicted"
            )
        {
            r.set_condition("Ready", false);
            r.set_condition("ContainersReady", false);
            return;
        }
        let (mut running, mut restarting, mut not_started) = (false, false, false);
        let mut codes = Vec::new();
        for c in &r.containers {
            match &c.state {
                State::Running { .. } => running = true,
                State::Terminated { exit_code, .. } => {
                    if policy == "Always" || (policy == "OnFailure" && *exit_code != 0) {
                        restarting = true;
                    } else {
                        codes.push(*exit_code);
                    }
                }
                State::Waiting { .. } => {
                    if c.id.is_some() || c.last_state.is_some() {
                        restarting = true;
                    } else {
                        not_started = true;
                    }
                }
            }
        }
        r.phase = if !r.condition("Initialized") || not_started {
            Phase::Pending
        } else if running || restarting {
            Phase::Running
        } else if codes.iter().all(|c| *c == 0) {
            Phase::Succeeded
        } else {
            Phase::Failed
        };
        r.reason.clear();
        let ready = r.phase == Phase::Running
            && r.containers.iter().all(|c| c.ready)
            && r.init_containers
                .iter()
                .filter(|c| c.sidecar)
                .all(|c| c.ready);
        r.set_condition("ContainersReady", ready);
        r.set_condition("Ready", ready);
        if !r.conditions.iter().any(|c| c.kind == "Initialized") {
            r.set_condition("Initialized", false);
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

/// A probe or hook port: a number, or the name of one of the container's ports.
fn port_number(port: &IntOrString, c: &Container) -> Option<u16> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pull_policy_defaults() {
        let c = |image: &str| Container {
            image: Some(image.into()),
            ..Default::default()
        };
        assert_eq!(pull_policy(&c("busybox")), "Always");
        assert_eq!(pull_policy(&c("busybox:latest")), "Always");
        assert_eq!(pull_policy(&c("localhost:5000/busybox")), "Always");
        assert_eq!(pull_policy(&c("localhost:5000/busybox:1")), "IfNotPresent");
        assert_eq!(pull_policy(&c("busybox@sha256:00")), "IfNotPresent");
        assert_eq!(registry_host("127.0.0.1:5000/a/b:1"), "127.0.0.1:5000");
        assert_eq!(registry_host("library/busybox"), "docker.io");
    }
}
