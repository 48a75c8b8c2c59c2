//! nri: the runtime side of NRI, the Node Resource Interface (containerd/nri v0.12's
//! protocol). Plugins connect to a unix socket, or are started here from the plugin
//! directory, and speak ttrpc over a multiplexed trunk (`mux`, `ttrpc`); `plugin` takes one
//! on (registration, configuration, synchronization). This module hands every pod and
//! container event to the plugins that subscribed, in index order, and merges what they ask
//! for (`adjust`). It knows pods and containers only as NRI's messages: `pod` and `container`
//! convert theirs and apply the answers. Uses tokio, `sys` (a launched plugin's socket) and the
//! generated NRI messages.

/// NRI's messages, generated from `github.com/containerd/nri`'s `pkg/api/api.proto` at the
/// version `hack/upstream.versions` pins, read from its Go module by `build.rs`.
#[allow(clippy::all, missing_docs)]
pub mod api {
    include!(concat!(env!("OUT_DIR"), "/nri.pkg.api.v1alpha1.rs"));
}

pub mod adjust;
mod launch;
pub mod mux;
pub mod plugin;
#[cfg(test)]
mod tests;
pub mod ttrpc;

use std::collections::HashMap;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use api::Event;
use plugin::{Plugin, Timeouts};
use ttrpc::{CallError, UNIMPLEMENTED};

/// The NRI version crius speaks (what plugins are told in Configure).
pub const NRI_VERSION: &str = "v0.12.0";

/// A future the inventory answers with.
pub type Answer<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// Where plugins come from and how long they may take.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The socket external plugins connect to; none when connections are off.
    pub socket: Option<PathBuf>,
    /// Pre-installed plugins, `IDX-NAME` executables.
    pub plugin_dir: PathBuf,
    /// Their configuration, `IDX-NAME.conf` or `NAME.conf`.
    pub plugin_config_dir: PathBuf,
    pub registration_timeout: Duration,
    pub request_timeout: Duration,
}

/// What NRI asks of the rest of the runtime: every pod and container as it is now (for a
/// plugin's synchronization), and the updates and evictions plugins ask for.
pub trait Inventory: Send + Sync + 'static {
    fn snapshot(&self) -> Answer<(Vec<api::PodSandbox>, Vec<api::Container>)>;
    /// Applies updates and evictions; returns the updates that failed.
    fn apply(
        &self,
        updates: Vec<api::ContainerUpdate>,
        evictions: Vec<api::ContainerEviction>,
    ) -> Answer<Vec<api::ContainerUpdate>>;
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A plugin answered an event with an error: the CRI call it hooks fails.
    #[error("NRI plugin {plugin} failed {event}: {message}")]
    Plugin {
        plugin: String,
        event: &'static str,
        message: String,
    },
    #[error("NRI: {0}")]
    Adjustment(#[from] adjust::Conflict),
    #[error("NRI validator {plugin} rejected container adjustment, reason: {reason}")]
    Rejected { plugin: String, reason: String },
}

/// Whether plugins have already been told a pod or container stopped (they are told once).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Live,
    Stopped,
}

/// The NRI side of the runtime; cheap to clone.
#[derive(Clone)]
pub struct Nri {
    inner: Arc<Inner>,
}

struct Inner {
    settings: Settings,
    timeouts: Timeouts,
    /// Plugins taken on, by ascending index.
    plugins: Mutex<Vec<Arc<Plugin>>>,
    /// CRI calls that make pods and containers hold it shared until what they made is
    /// listed; a plugin's synchronization holds it alone, so nothing made meanwhile is missed.
    sync: Arc<tokio::sync::RwLock<()>>,
    inventory: OnceLock<Arc<dyn Inventory>>,
    /// Pods and containers plugins were told of, by ID.
    ledger: Mutex<HashMap<String, Phase>>,
    /// Whether the socket's directory was made here.
    made_dir: AtomicBool,
}

/// What the plugins ask of a container being created.
#[derive(Debug, Default)]
pub struct Adjusted {
    pub adjust: api::ContainerAdjustment,
    pub updates: Vec<api::ContainerUpdate>,
    pub evictions: Vec<api::ContainerEviction>,
}

impl Nri {
    pub fn new(settings: Settings) -> Nri {
        let timeouts = Timeouts {
            registration: settings.registration_timeout,
            request: settings.request_timeout,
            // A plugin may hold its synchronization a while (critest's late joiners hold it 2
            // s); never less than an event's timeout.
            sync: settings.request_timeout.max(Duration::from_secs(5)),
        };
        Nri {
            inner: Arc::new(Inner {
                settings,
                timeouts,
                plugins: Mutex::new(Vec::new()),
                sync: Arc::new(tokio::sync::RwLock::new(())),
                inventory: OnceLock::new(),
                ledger: Mutex::new(HashMap::new()),
                made_dir: AtomicBool::new(false),
            }),
        }
    }

    /// Starts taking plugins on: the ledger is seeded from `inventory`, the socket listens
    /// (a stale one is replaced) and the pre-installed plugins start. A socket that cannot be
    /// made is logged: the runtime runs on without external plugins.
    pub async fn serve(&self, inventory: Arc<dyn Inventory>) {
        let (pods, containers) = inventory.snapshot().await;
        {
            let mut ledger = self.ledger();
            for p in &pods {
                ledger.insert(p.id.clone(), Phase::Live);
            }
            for c in &containers {
                let stopped = c.state == api::ContainerState::ContainerStopped as i32;
                ledger.insert(
                    c.id.clone(),
                    if stopped { Phase::Stopped } else { Phase::Live },
                );
            }
        }
        let _ = self.inner.inventory.set(inventory);
        if let Some(path) = self.inner.settings.socket.clone() {
            match launch::listen(&path) {
                Ok((listener, made)) => {
                    self.inner.made_dir.store(made, Ordering::Relaxed);
                    let me = self.clone();
                    tokio::spawn(async move { me.accept(listener).await });
                }
                Err(e) => tracing::error!(
                    socket = %path.display(),
                    error = %e,
                    "NRI: external plugins cannot connect"
                ),
            }
        }
        for (name, idx, stream, child) in launch::start_installed(&self.inner.settings.plugin_dir) {
            let config = launch::plugin_config(&self.inner.settings.plugin_config_dir, &idx, &name);
            let me = self.clone();
            tokio::spawn(async move {
                me.take_on(stream, Some((name, idx, child)), config).await;
            });
        }
    }

    async fn accept(&self, listener: tokio::net::UnixListener) {
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    let me = self.clone();
                    tokio::spawn(async move { me.take_on(stream, None, String::new()).await });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "NRI: accepting a plugin");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }

    /// Registers, configures and synchronizes one plugin, then lists it; it is unlisted when
    /// its trunk ends.
    async fn take_on(
        &self,
        stream: tokio::net::UnixStream,
        launched: Option<(String, String, tokio::process::Child)>,
        config: String,
    ) {
        let calls = Arc::new(Updates { nri: self.clone() });
        let plugin =
            match plugin::register(stream, launched, config, self.inner.timeouts, calls).await {
                Ok(p) => Arc::new(p),
                Err(e) => {
                    tracing::warn!(error = %e, "NRI: a plugin was not taken on");
                    return;
                }
            };
        let Some(inventory) = self.inner.inventory.get().cloned() else {
            return;
        };
        // Nothing is made while the plugin learns what there is, so it misses nothing.
        let hold = self.inner.sync.clone().write_owned().await;
        let (pods, containers) = inventory.snapshot().await;
        let updates =
            match plugin::synchronize(&plugin, pods, containers, self.inner.timeouts.sync).await {
                Ok(u) => u,
                Err(e) => {
                    tracing::warn!(plugin = plugin.id(), error = %e, "NRI: synchronization failed");
                    return;
                }
            };
        {
            let mut list = self.plugins();
            list.push(plugin.clone());
            list.sort_by(|a, b| a.idx.cmp(&b.idx).then(a.name.cmp(&b.name)));
        }
        drop(hold);
        tracing::info!(
            plugin = plugin.id(),
            events = format!("{:#x}", plugin.events),
            "NRI plugin connected"
        );
        if !updates.is_empty() {
            let failed = inventory.apply(updates, Vec::new()).await;
            if !failed.is_empty() {
                tracing::warn!(
                    plugin = plugin.id(),
                    failed = failed.len(),
                    "NRI: updates failed"
                );
            }
        }
        plugin.trunk.closed().await;
        self.drop_plugin(&plugin, "its connection ended");
    }

    fn plugins(&self) -> std::sync::MutexGuard<'_, Vec<Arc<Plugin>>> {
        self.inner.plugins.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn ledger(&self) -> std::sync::MutexGuard<'_, HashMap<String, Phase>> {
        self.inner.ledger.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn drop_plugin(&self, plugin: &Arc<Plugin>, why: &str) {
        let mut list = self.plugins();
        let before = list.len();
        list.retain(|p| !Arc::ptr_eq(p, plugin));
        if list.len() != before {
            tracing::warn!(plugin = plugin.id(), why, "NRI plugin dropped");
        }
        drop(list);
        plugin.close();
    }

    /// At the daemon's exit: every plugin is closed (launched ones killed) and the socket
    /// removed.
    pub fn shutdown(&self) {
        let plugins: Vec<Arc<Plugin>> = self.plugins().drain(..).collect();
        for p in plugins {
            p.close();
        }
        if let Some(path) = &self.inner.settings.socket {
            let _ = std::fs::remove_file(path);
            if self.inner.made_dir.load(Ordering::Relaxed)
                && let Some(dir) = path.parent()
            {
                // Only when empty: another runtime's socket may have joined it.
                let _ = std::fs::remove_dir(dir);
            }
        }
    }

    /// Whether any plugin is listed (callers skip building messages when none is).
    pub fn active(&self) -> bool {
        !self.plugins().is_empty()
    }

    /// Held by a CRI call from before it tells plugins of what it makes until that is listed.
    pub async fn hold_sync(&self) -> tokio::sync::OwnedRwLockReadGuard<()> {
        self.inner.sync.clone().read_owned().await
    }

    /// The plugins subscribed to `event`, by index.
    fn subscribed(&self, event: Event) -> Vec<Arc<Plugin>> {
        self.plugins()
            .iter()
            .filter(|p| p.wants(event))
            .cloned()
            .collect()
    }

    /// Calls `method` on one plugin. A plugin that is gone, too slow or speaks nonsense is
    /// dropped and the call goes on without it (None); one that answers with an error fails
    /// it. A plugin older than the event gets it as a StateChange.
    async fn call_one<Req: prost::Message, Resp: prost::Message + Default>(
        &self,
        plugin: &Arc<Plugin>,
        event: Event,
        method: &'static str,
        req: &Req,
        legacy: Option<&api::StateChangeEvent>,
    ) -> Result<Option<Resp>, Error> {
        let timeout = self.inner.timeouts.request;
        let started = std::time::Instant::now();
        let result = match plugin.call::<Req, Resp>(method, req, timeout).await {
            Err(CallError::Failed { code, .. }) if code == UNIMPLEMENTED && legacy.is_some() => {
                let change = legacy.cloned().unwrap_or_default();
                plugin
                    .call::<_, api::Empty>("StateChange", &change, timeout)
                    .await
                    .map(|_| Resp::default())
            }
            other => other,
        };
        tracing::debug!(
            plugin = plugin.id(),
            method,
            elapsed = ?started.elapsed(),
            "NRI call"
        );
        match result {
            Ok(r) => Ok(Some(r)),
            Err(CallError::Failed { message, .. }) => Err(Error::Plugin {
                plugin: plugin.id(),
                event: method,
                message,
            }),
            Err(e) => {
                tracing::warn!(plugin = plugin.id(), event = ?event, error = %e, "NRI plugin failed");
                self.drop_plugin(plugin, "it failed an event");
                Ok(None)
            }
        }
    }

    /// Tells every subscribed plugin of a pod or container event, in index order.
    async fn tell<Req: prost::Message>(
        &self,
        event: Event,
        method: &'static str,
        req: &Req,
        pod: &api::PodSandbox,
        container: Option<&api::Container>,
    ) -> Result<(), Error> {
        let legacy = api::StateChangeEvent {
            event: event as i32,
            pod: Some(pod.clone()),
            container: container.cloned(),
        };
        for p in self.subscribed(event) {
            self.call_one::<Req, api::Empty>(&p, event, method, req, Some(&legacy))
                .await?;
        }
        Ok(())
    }

    /// `tell` for an event nothing waits on: a plugin's error is logged, not returned.
    async fn notify<Req: prost::Message>(
        &self,
        event: Event,
        method: &'static str,
        req: &Req,
        pod: &api::PodSandbox,
        container: Option<&api::Container>,
    ) {
        if let Err(e) = self.tell(event, method, req, pod, container).await {
            let id = container.map_or(&pod.id, |c| &c.id);
            tracing::warn!(id, error = %e, "NRI {method}");
        }
    }

    fn set_phase(&self, id: &str, phase: Phase) {
        self.ledger().insert(id.to_string(), phase);
    }

    /// Marks `id` stopped; true the first time, when plugins are to be told.
    fn first_stop(&self, id: &str) -> bool {
        match self.ledger().get_mut(id) {
            Some(p) if *p == Phase::Live => {
                *p = Phase::Stopped;
                true
            }
            _ => false,
        }
    }

    /// RunPodSandbox, before the pod is listed: an error fails the pod.
    pub async fn run_pod(&self, pod: &api::PodSandbox) -> Result<(), Error> {
        let req = api::RunPodSandboxRequest {
            pod: Some(pod.clone()),
        };
        self.tell(Event::RunPodSandbox, "RunPodSandbox", &req, pod, None)
            .await?;
        self.set_phase(&pod.id, Phase::Live);
        Ok(())
    }

    /// StopPodSandbox, once per pod, after its containers stopped.
    pub async fn stop_pod(&self, pod: &api::PodSandbox) -> Result<(), Error> {
        if !self.first_stop(&pod.id) {
            return Ok(());
        }
        let req = api::StopPodSandboxRequest {
            pod: Some(pod.clone()),
        };
        self.tell(Event::StopPodSandbox, "StopPodSandbox", &req, pod, None)
            .await
    }

    /// RemovePodSandbox (StopPodSandbox first if plugins were not told yet). Failures are
    /// logged: the pod is gone either way.
    pub async fn remove_pod(&self, pod: &api::PodSandbox) {
        if let Err(e) = self.stop_pod(pod).await {
            tracing::warn!(sandbox = pod.id, error = %e, "NRI StopPodSandbox");
        }
        if self.ledger().remove(&pod.id).is_none() {
            return;
        }
        let req = api::RemovePodSandboxRequest {
            pod: Some(pod.clone()),
        };
        self.notify(Event::RemovePodSandbox, "RemovePodSandbox", &req, pod, None)
            .await;
    }

    /// CreateContainer, before the container is made: each plugin in index order sees it as
    /// the ones before adjusted it; the merged adjustment comes back, validated.
    pub async fn create_container(
        &self,
        pod: &api::PodSandbox,
        container: &api::Container,
    ) -> Result<Adjusted, Error> {
        let mut merged = adjust::Merged::new(&container.id);
        let mut seen = container.clone();
        let mut consulted = Vec::new();
        for p in self.subscribed(Event::CreateContainer) {
            let req = api::CreateContainerRequest {
                pod: Some(pod.clone()),
                container: Some(seen.clone()),
            };
            let answer: Option<api::CreateContainerResponse> = self
                .call_one(&p, Event::CreateContainer, "CreateContainer", &req, None)
                .await?;
            consulted.push(api::PluginInstance {
                name: p.name.clone(),
                index: p.idx.clone(),
            });
            if let Some(a) = answer {
                merged.take(&p.id(), a)?;
                seen = merged.applied_to(container);
            }
        }
        let adjusted = merged.finish();
        self.validate(pod, container, &adjusted, consulted).await?;
        Ok(adjusted.into())
    }

    /// Validating plugins, all at once, after the adjustments are merged: one that rejects
    /// or fails fails the create.
    async fn validate(
        &self,
        pod: &api::PodSandbox,
        container: &api::Container,
        merged: &adjust::Finished,
        plugins: Vec<api::PluginInstance>,
    ) -> Result<(), Error> {
        let validators = self.subscribed(Event::ValidateContainerAdjustment);
        if validators.is_empty() {
            return Ok(());
        }
        let req = api::ValidateContainerAdjustmentRequest {
            pod: Some(pod.clone()),
            container: Some(container.clone()),
            adjust: Some(merged.adjust.clone()),
            update: merged.updates.clone(),
            owners: Some(merged.owners.clone()),
            plugins,
        };
        let calls = validators.iter().map(|p| {
            let req = &req;
            async move {
                let r: Result<Option<api::ValidateContainerAdjustmentResponse>, Error> = self
                    .call_one(
                        p,
                        Event::ValidateContainerAdjustment,
                        "ValidateContainerAdjustment",
                        req,
                        None,
                    )
                    .await;
                (p.id(), r)
            }
        });
        for (plugin, r) in futures_util::future::join_all(calls).await {
            match r {
                Ok(Some(v)) if v.reject => {
                    return Err(Error::Rejected {
                        plugin,
                        reason: v.reason,
                    });
                }
                Err(Error::Plugin { message, .. }) => {
                    return Err(Error::Rejected {
                        plugin,
                        reason: message,
                    });
                }
                Err(e) => return Err(e),
                Ok(_) => {}
            }
        }
        Ok(())
    }

    /// A pod or container is listed: plugins are to be told when it stops and goes.
    pub fn created(&self, id: &str) {
        self.set_phase(id, Phase::Live);
    }

    /// It stopped with no plugin to tell.
    pub fn stopped_quietly(&self, id: &str) {
        self.first_stop(id);
    }

    /// It went with no plugin to tell.
    pub fn forget(&self, id: &str) {
        self.ledger().remove(id);
    }

    /// The container is listed: plugins are told it was made.
    pub async fn post_create(&self, pod: &api::PodSandbox, container: &api::Container) {
        let req = api::PostCreateContainerRequest {
            pod: Some(pod.clone()),
            container: Some(container.clone()),
        };
        self.notify(
            Event::PostCreateContainer,
            "PostCreateContainer",
            &req,
            pod,
            Some(container),
        )
        .await;
    }

    /// StartContainer, before the container starts: an error fails the start.
    pub async fn start_container(
        &self,
        pod: &api::PodSandbox,
        container: &api::Container,
    ) -> Result<(), Error> {
        let req = api::StartContainerRequest {
            pod: Some(pod.clone()),
            container: Some(container.clone()),
        };
        self.tell(
            Event::StartContainer,
            "StartContainer",
            &req,
            pod,
            Some(container),
        )
        .await
    }

    /// The container runs.
    pub async fn post_start(&self, pod: &api::PodSandbox, container: &api::Container) {
        let req = api::PostStartContainerRequest {
            pod: Some(pod.clone()),
            container: Some(container.clone()),
        };
        self.notify(
            Event::PostStartContainer,
            "PostStartContainer",
            &req,
            pod,
            Some(container),
        )
        .await;
    }

    /// Whether plugins are yet to be told `id` stopped (callers build the messages only then).
    pub fn stop_untold(&self, id: &str) -> bool {
        self.ledger().get(id) == Some(&Phase::Live)
    }

    /// StopContainer, once per container, when it stopped (asked to, or on its own). The
    /// updates plugins ask for in answer are applied; failures are logged.
    pub async fn stop_container(&self, pod: &api::PodSandbox, container: &api::Container) {
        if !self.first_stop(&container.id) {
            return;
        }
        let req = api::StopContainerRequest {
            pod: Some(pod.clone()),
            container: Some(container.clone()),
        };
        let mut updates = Vec::new();
        for p in self.subscribed(Event::StopContainer) {
            let r: Result<Option<api::StopContainerResponse>, Error> = self
                .call_one(&p, Event::StopContainer, "StopContainer", &req, None)
                .await;
            match r {
                // The stopped container itself is not updated: its record is held while
                // plugins are told, and it has nothing left to limit.
                Ok(Some(a)) => updates.extend(
                    a.update
                        .into_iter()
                        .filter(|u| u.container_id != container.id),
                ),
                Ok(None) => {}
                Err(e) => tracing::warn!(container = container.id, error = %e, "NRI StopContainer"),
            }
        }
        self.apply(updates, Vec::new()).await;
    }

    /// RemoveContainer (StopContainer first if plugins were not told yet).
    pub async fn remove_container(&self, pod: &api::PodSandbox, container: &api::Container) {
        self.stop_container(pod, container).await;
        if self.ledger().remove(&container.id).is_none() {
            return;
        }
        let req = api::RemoveContainerRequest {
            pod: Some(pod.clone()),
            container: Some(container.clone()),
        };
        self.notify(
            Event::RemoveContainer,
            "RemoveContainer",
            &req,
            pod,
            Some(container),
        )
        .await;
    }

    /// Whether plugins know of `id` at all (a container whose create failed is unknown).
    pub fn knows(&self, id: &str) -> bool {
        self.ledger().contains_key(id)
    }

    /// Applies updates and evictions through the inventory, logging what failed.
    pub async fn apply(
        &self,
        updates: Vec<api::ContainerUpdate>,
        evictions: Vec<api::ContainerEviction>,
    ) -> Vec<api::ContainerUpdate> {
        if updates.is_empty() && evictions.is_empty() {
            return Vec::new();
        }
        let Some(inventory) = self.inner.inventory.get().cloned() else {
            return updates;
        };
        let failed = inventory.apply(updates, evictions).await;
        for f in &failed {
            tracing::warn!(container = f.container_id, "NRI: a container update failed");
        }
        failed
    }
}

/// The runtime service's UpdateContainers, for one plugin.
struct Updates {
    nri: Nri,
}

impl plugin::RuntimeCalls for Updates {
    fn update_containers(
        &self,
        plugin: String,
        req: api::UpdateContainersRequest,
    ) -> Answer<api::UpdateContainersResponse> {
        let nri = self.nri.clone();
        Box::pin(async move {
            tracing::info!(
                plugin,
                updates = req.update.len(),
                evictions = req.evict.len(),
                "NRI: unsolicited container updates"
            );
            let failed = nri.apply(req.update, req.evict).await;
            api::UpdateContainersResponse { failed }
        })
    }
}
