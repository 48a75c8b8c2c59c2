//! `crius agent`: watches a manifest directory (like kubelet's static pods) and keeps one worker
//! per Pod in it: a new file starts its pods, a changed pod is replaced, a removed one is
//! stopped. Secrets and ConfigMaps from the same directory feed volumes, env and pull
//! credentials. Relists of the runtime (kubelet's PLEG) tell the workers what changed: one at
//! once on each of the runtime's container events (kubelet's Evented PLEG), and one every 10 s
//! in case an event was missed; a runtime without the event stream is relisted every second. On start it reads back its records and adopts the pods still running; sandboxes it
//! made for pods it no longer knows are removed.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::cri::v1 as cri;
use tokio::sync::{mpsc, watch};

use super::AGENT_LABEL;
use super::convert::{Node, Store, SwapBehavior};
use super::manifest::{self, Loaded, Object};
use super::status;
use super::worker::{Command, Shared, Snapshot, Worker};

#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub socket: PathBuf,
    pub manifests: PathBuf,
    pub state: PathBuf,
    pub log_root: PathBuf,
    pub swap_behavior: SwapBehavior,
    pub seccomp_root: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("runtime at {socket}: {message}")]
    Runtime { socket: PathBuf, message: String },
}

struct Running {
    tx: mpsc::Sender<Command>,
    hash: String,
    task: tokio::task::JoinHandle<()>,
    deleting: bool,
}

/// Reads every manifest file of the directory. A file that fails keeps what it had before (so a
/// bad edit does not stop pods); its errors are logged once per version.
struct Manifests {
    dir: PathBuf,
    files: HashMap<PathBuf, (SystemTime, Vec<Loaded>)>,
    reported: HashMap<PathBuf, SystemTime>,
}

impl Manifests {
    fn scan(&mut self) -> Vec<Loaded> {
        let mut seen = Vec::new();
        if let Ok(entries) = std::fs::read_dir(&self.dir) {
            for e in entries.flatten() {
                let p = e.path();
                let name = e.file_name().to_string_lossy().into_owned();
                if name.starts_with('.')
                    || !(name.ends_with(".yaml")
                        || name.ends_with(".yml")
                        || name.ends_with(".json"))
                {
                    continue;
                }
                let Ok(mtime) = e.metadata().and_then(|m| m.modified()) else {
                    continue;
                };
                seen.push(p.clone());
                if self.files.get(&p).is_some_and(|(t, _)| *t == mtime) {
                    continue;
                }
                match manifest::load_file(&p) {
                    Ok(objs) => {
                        for o in &objs {
                            for w in &o.warnings {
                                tracing::warn!(file = %p.display(), "{w}");
                            }
                        }
                        self.files.insert(p.clone(), (mtime, objs));
                        self.reported.remove(&p);
                    }
                    Err(e) => {
                        if self.reported.get(&p) != Some(&mtime) {
                            tracing::error!("{e}");
                            self.reported.insert(p.clone(), mtime);
                        }
                    }
                }
            }
        }
        self.files.retain(|p, _| seen.contains(p));
        let mut files: Vec<&PathBuf> = self.files.keys().collect();
        files.sort();
        files
            .into_iter()
            .flat_map(|f| self.files[f].1.iter().cloned())
            .collect()
    }
}

/// Lists the runtime's sandboxes and containers.
async fn relist(sh: &Shared) -> Option<Snapshot> {
    let mut rt = sh.rt.clone();
    let sandboxes = rt
        .list_pod_sandbox(cri::ListPodSandboxRequest { filter: None })
        .await
        .ok()?
        .into_inner()
        .items;
    let containers = rt
        .list_containers(cri::ListContainersRequest { filter: None })
        .await
        .ok()?
        .into_inner()
        .containers;
    Some(Snapshot {
        sandboxes: sandboxes.into_iter().map(|s| (s.id.clone(), s)).collect(),
        containers: containers.into_iter().map(|c| (c.id.clone(), c)).collect(),
    })
}

/// How often the runtime is relisted without its event stream, and with it.
const RELIST: Duration = Duration::from_secs(1);
const RELIST_EVENTED: Duration = Duration::from_secs(10);

/// Follows the runtime's container events: each asks for a relist at once, and so does every
/// new subscription (events may have been missed meanwhile). `evented` says whether the stream
/// is up. A runtime without it (Unimplemented) is left to the periodic relist and asked again
/// every minute.
async fn follow_events(sh: Shared, evented: Arc<std::sync::atomic::AtomicBool>) {
    use std::sync::atomic::Ordering;
    let mut rt = sh.rt.clone();
    loop {
        match rt
            .get_container_events(cri::GetEventsRequest {})
            .await
            .map(tonic::Response::into_inner)
        {
            Ok(mut events) => {
                evented.store(true, Ordering::Relaxed);
                let _ = sh.poke.send(());
                while let Ok(Some(_)) = events.message().await {
                    let _ = sh.poke.send(());
                }
                evented.store(false, Ordering::Relaxed);
                // A relist now: the periodic one may be in its long sleep.
                let _ = sh.poke.send(());
                tracing::debug!("the runtime's event stream ended; relisting every second");
            }
            Err(s) if s.code() == tonic::Code::Unimplemented => {
                // Asked again now and then: the runtime may be upgraded under the agent.
                tracing::debug!("the runtime has no container events; relisting every second");
                tokio::time::sleep(Duration::from_secs(60)).await;
                continue;
            }
            Err(s) => tracing::debug!(error = %s.message(), "subscribing to container events"),
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// The senders of what the workers watch (relists, Secrets and ConfigMaps), and the agent's
/// end of their requests for a relist.
struct Feeds {
    relist: watch::Sender<Arc<Snapshot>>,
    store: watch::Sender<Arc<Store>>,
    pokes: mpsc::UnboundedReceiver<()>,
}

/// Makes the manifest, state and log directories.
fn make_dirs(cfg: &AgentConfig) -> Result<(), AgentError> {
    for d in [&cfg.manifests, &cfg.state, &cfg.log_root] {
        std::fs::create_dir_all(d).map_err(|source| AgentError::Io {
            path: d.clone(),
            source,
        })?;
    }
    Ok(())
}

/// The runtime's clients and the node, as the workers share them, with the feeds to them.
fn connect(cfg: &AgentConfig) -> Result<(Shared, Feeds), AgentError> {
    let channel = crate::cri::client::channel(&cfg.socket).map_err(|e| AgentError::Runtime {
        socket: cfg.socket.clone(),
        message: e.to_string(),
    })?;
    let rt = crate::cri::client::runtime(channel.clone());
    let img = crate::cri::client::images(channel);
    let (relist_tx, relist_rx) = watch::channel(Arc::new(Snapshot::default()));
    let (store_tx, store_rx) = watch::channel(Arc::new(Store::default()));
    let (poke_tx, poke_rx) = mpsc::unbounded_channel();
    let sh = Shared {
        rt,
        img,
        state: cfg.state.clone(),
        log_root: cfg.log_root.clone(),
        node: Arc::new(Node::detect(cfg.swap_behavior, cfg.seccomp_root.clone())),
        store: store_rx,
        relist: relist_rx,
        poke: poke_tx,
    };
    let feeds = Feeds {
        relist: relist_tx,
        store: store_tx,
        pokes: poke_rx,
    };
    Ok((sh, feeds))
}

/// The first relist, waited for until the runtime answers.
async fn first_relist(sh: &Shared, socket: &Path) -> Snapshot {
    loop {
        match relist(sh).await {
            Some(s) => return s,
            None => {
                tracing::warn!(socket = %socket.display(), "the runtime does not answer yet");
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
        }
    }
}

/// Relists the runtime for good: on each poke (bursts coalesced), else every period, short
/// without the event stream. Workers hear of a relist only when something changed (kubelet's
/// PLEG events).
async fn relist_loop(
    sh: Shared,
    evented: Arc<std::sync::atomic::AtomicBool>,
    mut poke_rx: mpsc::UnboundedReceiver<()>,
    relist_tx: watch::Sender<Arc<Snapshot>>,
) {
    loop {
        let period = if evented.load(std::sync::atomic::Ordering::Relaxed) {
            RELIST_EVENTED
        } else {
            RELIST
        };
        tokio::select! {
            _ = tokio::time::sleep(period) => {}
            Some(()) = poke_rx.recv() => {
                // Coalesce bursts of pokes.
                tokio::time::sleep(Duration::from_millis(50)).await;
                while poke_rx.try_recv().is_ok() {}
            }
        }
        if let Some(s) = relist(&sh).await {
            relist_tx.send_if_modified(|cur| {
                let changed = **cur != s;
                if changed {
                    *cur = Arc::new(s);
                }
                changed
            });
        }
    }
}

/// The manifests' objects sorted: Secrets and ConfigMaps into a store, Pods by key (the first
/// file wins when two define one).
fn desired(objects: Vec<Loaded>) -> (Store, HashMap<String, Loaded>) {
    let mut store = Store::default();
    let mut wanted: HashMap<String, Loaded> = HashMap::new();
    for l in objects {
        let key = l.object.key();
        match &l.object {
            Object::Secret(s) => {
                store.secrets.insert(key, (**s).clone());
            }
            Object::ConfigMap(c) => {
                store.config_maps.insert(key, (**c).clone());
            }
            Object::Pod(_) => {
                if let Some(first) = wanted.get(&key) {
                    tracing::error!(
                        pod = %key,
                        first = %first.file.display(),
                        second = %l.file.display(),
                        "the pod is defined twice; the first file wins"
                    );
                    continue;
                }
                wanted.insert(key, l);
            }
        }
    }
    (store, wanted)
}

/// The agent's pods: a worker each by `namespace/name`, and the records read back at start
/// that no worker has adopted yet.
struct Pods {
    sh: Shared,
    running: HashMap<String, Running>,
    records: HashMap<String, status::PodRecord>,
}

impl Pods {
    /// Starts a worker for each new pod (adopting its record) and hands changed manifests to
    /// theirs.
    async fn start_or_update(&mut self, wanted: &HashMap<String, Loaded>) {
        for (key, l) in wanted {
            match self.running.get_mut(key) {
                Some(r) if r.hash == l.hash || r.deleting => {}
                Some(r) => {
                    r.hash = l.hash.clone();
                    let _ = r.tx.send(Command::Update(Box::new(l.clone()))).await;
                }
                None => {
                    let (tx, rx) = mpsc::channel(8);
                    let adopted = self.records.remove(key);
                    let w = Worker::new(self.sh.clone(), l.clone(), adopted, rx);
                    self.running.insert(
                        key.clone(),
                        Running {
                            tx,
                            hash: l.hash.clone(),
                            task: tokio::spawn(w.run()),
                            deleting: false,
                        },
                    );
                }
            }
        }
    }

    /// Pods whose manifest is gone: their workers are told to delete them.
    async fn delete_gone(&mut self, wanted: &HashMap<String, Loaded>) {
        for (key, r) in self.running.iter_mut() {
            if !wanted.contains_key(key) && !r.deleting {
                r.deleting = true;
                let _ = r.tx.send(Command::Delete).await;
            }
        }
    }

    /// Records of pods no longer in any manifest: stopped and forgotten; then the sandboxes
    /// no record knows.
    async fn stop_orphans(&mut self) {
        for (key, rec) in self.records.drain() {
            tracing::info!(pod = %key, "stopping a pod whose manifest is gone");
            let (tx, rx) = mpsc::channel(8);
            let l = orphan_loaded(&rec);
            let w = Worker::new(self.sh.clone(), l, Some(rec), rx);
            let _ = tx.send(Command::Delete).await;
            self.running.insert(
                key,
                Running {
                    tx,
                    hash: String::new(),
                    task: tokio::spawn(w.run()),
                    deleting: true,
                },
            );
        }
        remove_strays(&self.sh, &self.running).await;
    }
}

/// Runs the agent until the process is stopped.
pub async fn run(cfg: AgentConfig) -> Result<(), AgentError> {
    make_dirs(&cfg)?;
    let (sh, feeds) = connect(&cfg)?;
    // The first relist before anything runs: workers adopt what is there.
    let first = first_relist(&sh, &cfg.socket).await;
    feeds.relist.send_replace(Arc::new(first));
    let evented = Arc::new(std::sync::atomic::AtomicBool::new(false));
    tokio::spawn(follow_events(sh.clone(), evented.clone()));
    tokio::spawn(relist_loop(sh.clone(), evented, feeds.pokes, feeds.relist));

    let records = status::load_all(&cfg.state)
        .into_iter()
        .map(|r| (r.key(), r))
        .collect();
    let mut manifests = Manifests {
        dir: cfg.manifests.clone(),
        files: HashMap::new(),
        reported: HashMap::new(),
    };
    let mut pods = Pods {
        sh,
        running: HashMap::new(),
        records,
    };
    let mut first_pass = true;
    tracing::info!(manifests = %cfg.manifests.display(), state = %cfg.state.display(), "agent running");
    loop {
        let (store, wanted) = desired(manifests.scan());
        feeds.store.send_if_modified(|cur| {
            let same = cur.secrets == store.secrets && cur.config_maps == store.config_maps;
            if !same {
                *cur = Arc::new(store);
            }
            !same
        });
        pods.start_or_update(&wanted).await;
        pods.delete_gone(&wanted).await;
        pods.running.retain(|_, r| !r.task.is_finished());
        if first_pass {
            first_pass = false;
            pods.stop_orphans().await;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// A stand-in manifest for a record whose file is gone, enough to stop its pod.
fn orphan_loaded(rec: &status::PodRecord) -> Loaded {
    let mut pod = k8s_openapi::api::core::v1::Pod::default();
    pod.metadata.name = Some(rec.name.clone());
    pod.metadata.namespace = Some(rec.namespace.clone());
    pod.metadata.uid = Some(rec.uid.clone());
    Loaded {
        object: Object::Pod(Box::new(pod)),
        file: rec.file.clone(),
        line: 0,
        warnings: Vec::new(),
        hash: rec.hash.clone(),
    }
}

/// Sandboxes the agent made for pods it has no record of (a record lost, a crash between run
/// and save): removed.
async fn remove_strays(sh: &Shared, pods: &HashMap<String, Running>) {
    let snapshot = sh.relist.borrow().clone();
    let records: Vec<String> = status::load_all(&sh.state)
        .iter()
        .filter_map(|r| r.sandbox.clone())
        .collect();
    for (id, s) in &snapshot.sandboxes {
        if s.labels.get(AGENT_LABEL).map(String::as_str) != Some("true") {
            continue;
        }
        let key = format!(
            "{}/{}",
            s.labels
                .get(super::convert::LABEL_POD_NAMESPACE)
                .cloned()
                .unwrap_or_default(),
            s.labels
                .get(super::convert::LABEL_POD_NAME)
                .cloned()
                .unwrap_or_default()
        );
        if records.contains(id) {
            continue;
        }
        let _ = pods.get(&key);
        tracing::info!(sandbox = %id, pod = %key, "removing a sandbox no pod record knows");
        let mut rt = sh.rt.clone();
        let _ = rt
            .stop_pod_sandbox(cri::StopPodSandboxRequest {
                pod_sandbox_id: id.clone(),
            })
            .await;
        let _ = rt
            .remove_pod_sandbox(cri::RemovePodSandboxRequest {
                pod_sandbox_id: id.clone(),
            })
            .await;
    }
}

/// The manifest file `crius run` writes for a source file: its name in the manifest directory.
pub fn manifest_target(dir: &Path, source: &Path) -> PathBuf {
    let name = source
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "pod.yaml".into());
    dir.join(name)
}
