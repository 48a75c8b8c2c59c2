//! One pod's lifecycle, driven through CRI by a task of its own, the way kubelet's pod workers
//! do it: volumes, then the sandbox (re-made if it dies), then image pulls, init containers one
//! by one (sidecars started and kept running), then the app containers with their postStart
//! hooks; probes; restarts by restart policy with back-off; and termination (preStop hooks
//! within the grace period, app containers first, sidecars last in reverse order). The record
//! it keeps (`status`) is saved whenever it changes.
//!
//! The work is split by job: `sandbox` (volumes, hosts file, the sandbox), `images` (pulls,
//! pull credentials, runAsNonRoot), `containers` (init and app containers, restarts, hooks),
//! `observe` (exits seen by the runtime, phase and conditions), `probes`, and `terminate`
//! (stopping, deadline, eviction, cleanup). This file has the worker, its record and its loop.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use crate::cri::v1 as cri;
use crate::cri::v1::image_service_client::ImageServiceClient;
use crate::cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_openapi::api::core::v1::{Pod, PodSpec};
use tokio::sync::{mpsc, watch};
use tonic::transport::Channel;

use super::convert::{self, Node, PodContext, Store};
use super::manifest::Loaded;
use super::probe::Target;
use super::status::{self, ContainerRecord, Phase, PodRecord, now};
use super::volumes;

mod containers;
mod images;
mod observe;
mod probes;
mod sandbox;
mod terminate;

use probes::ProbeReport;

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
        pod_ips: Vec::new(),
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

/// No volumes: a pod's context before they are prepared.
static NO_VOLUMES: LazyLock<HashMap<String, PathBuf>> = LazyLock::new(HashMap::new);

/// The pod's context for `convert` and `volumes`: its identity from the record, the Secrets and
/// ConfigMaps, the node and the pod's IP, with no log directory, volumes or hosts file (the
/// callers that have them set them). It borrows the worker's fields one by one, so the others
/// stay free to change while it lives.
fn pod_context<'a>(
    pod: &'a Pod,
    spec: &'a PodSpec,
    rec: &'a PodRecord,
    store: &'a Store,
    node: &'a Node,
    pod_ips: &'a [String],
) -> PodContext<'a> {
    PodContext {
        pod,
        spec,
        namespace: &rec.namespace,
        name: &rec.name,
        uid: &rec.uid,
        store,
        node,
        log_dir: Path::new(""),
        volumes: &NO_VOLUMES,
        hosts_file: None,
        pod_ips,
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

    fn ctx_parts(&self) -> (Arc<Store>, Vec<String>) {
        (self.sh.store.borrow().clone(), self.rec.ips())
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

    fn restart_policy(&self) -> String {
        self.spec()
            .restart_policy
            .unwrap_or_else(|| "Always".into())
    }

    fn grace(&self) -> i64 {
        self.pod
            .spec
            .as_ref()
            .and_then(|s| s.termination_grace_period_seconds)
            .unwrap_or(30)
    }
}
