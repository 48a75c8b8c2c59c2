//! image: what a node knows about images. It resolves references, pulls and verifies images from
//! registries (`registry`, `hosts`, `auth`, `manifest`, `pull`, `pull_manifest`), keeps one record
//! per image (ID = config digest) with its tags and repo digests under `<root>/images`, serves
//! eStargz images before their pull ends (`lazy`) and finishes or refuses them behind
//! (`behind`), answers lookups by ID, tag or digest, and removes images with garbage collection
//! of blobs and snapshots no longer referenced. It uses `content` for blobs, `snapshot` for
//! unpacked layers and `atomic` for records; it knows nothing of gRPC (the `cri` module maps its
//! errors).

pub mod auth;
mod behind;
pub mod dockercfg;
pub mod hosts;
mod lazy;
pub mod manifest;
pub mod policy;
pub mod progress;
mod pull;
mod pull_manifest;
pub mod reference;
pub mod registry;
mod signature;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock, Weak};

use serde::{Deserialize, Serialize};

use crate::atomic;
use crate::content::{self, Digest};
use crate::snapshot::{self, Snapshotter, UnpackError, UnpackOptions};

pub use auth::Credentials;
pub use manifest::ImageConfig;
pub use reference::Reference;

impl Error {
    /// The kind of failure, for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::Reference(_) => "reference",
            Error::Credentials(_) | Error::AuthFile { .. } | Error::CredentialHelper { .. } => {
                "credentials"
            }
            Error::Policy { .. } | Error::PolicyFile { .. } => "policy",
            Error::NotFound { .. } | Error::RegistryNotFound { .. } => "not_found",
            Error::Unauthorized { .. } => "unauthorized",
            Error::InUse { .. } => "in_use",
            Error::Registry { .. }
            | Error::Http { .. }
            | Error::Download { .. }
            | Error::Network { .. } => "registry",
            Error::HostsConfig { .. } => "hosts_config",
            Error::Manifest { .. } | Error::NoPlatform { .. } => "manifest",
            Error::DigestMismatch { .. }
            | Error::SizeMismatch { .. }
            | Error::DiffIdMismatch { .. } => "verification",
            Error::Unpack { .. } => "unpack",
            Error::Content(_) | Error::Snapshot(_) | Error::Io { .. } => "storage",
        }
    }

    /// The blob whose bytes were not what a verified manifest or config says (its digest, its
    /// size or, for a layer, its diff ID), when that is why a pull failed: no network accident,
    /// since a resumed download that does not verify is fetched again from the start first.
    pub(crate) fn mismatched(&self) -> Option<&Digest> {
        match self {
            Error::DigestMismatch { expected, .. }
            | Error::Content(content::Error::DigestMismatch { expected, .. }) => Some(expected),
            Error::SizeMismatch { digest, .. }
            | Error::DiffIdMismatch { digest, .. }
            | Error::Content(content::Error::SizeMismatch { digest, .. }) => Some(digest),
            _ => None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Reference(#[from] reference::ParseError),
    #[error("invalid credentials: {0}")]
    Credentials(String),
    #[error("image {image:?} not found")]
    NotFound { image: String },
    #[error("image {image} is mounted as an image volume by container {container}")]
    InUse { image: String, container: String },
    #[error("{url}: not found: {message}")]
    RegistryNotFound { url: String, message: String },
    #[error("registry {registry}: authentication failed: {message}")]
    Unauthorized { registry: String, message: String },
    #[error("{url}: registry answered {status}: {message}")]
    Registry {
        url: String,
        status: u16,
        message: String,
    },
    #[error("{url}: {source}")]
    Http {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("{path}: {reason}")]
    HostsConfig { path: PathBuf, reason: String },
    #[error("registry credentials file {path}: {reason}")]
    AuthFile { path: PathBuf, reason: String },
    #[error("{image}: refused by the signature policy (scope {scope:?}): {reason}")]
    Policy {
        image: String,
        scope: String,
        reason: signature::Refusal,
    },
    #[error("signature policy {path}: {source}")]
    PolicyFile {
        path: PathBuf,
        source: policy::PolicyError,
    },
    #[error("credential helper docker-credential-{helper} for {server}: {reason}")]
    CredentialHelper {
        helper: String,
        server: String,
        reason: String,
    },
    #[error("{reference}: manifest {digest}: {reason}")]
    Manifest {
        reference: String,
        digest: String,
        reason: String,
    },
    #[error("{reference}: no image for platform {wanted} (the index has: {available})")]
    NoPlatform {
        reference: String,
        wanted: String,
        available: String,
    },
    #[error(
        "{what} {expected}: the registry sent content with digest {actual}; nothing was stored"
    )]
    DigestMismatch {
        what: &'static str,
        expected: Digest,
        actual: Digest,
    },
    #[error(
        "{what} {digest}: descriptor says {expected} bytes, the registry sent {actual}; nothing was stored"
    )]
    SizeMismatch {
        what: &'static str,
        digest: Digest,
        expected: u64,
        actual: u64,
    },
    #[error(
        "layer {digest}: uncompressed content has digest {actual}, the image config says {expected}"
    )]
    DiffIdMismatch {
        digest: Digest,
        expected: Digest,
        actual: Digest,
    },
    #[error("layer {digest}: {source}")]
    Unpack {
        digest: Digest,
        #[source]
        source: UnpackError,
    },
    #[error("layer {digest}: download interrupted: {message}")]
    Download { digest: Digest, message: String },
    /// The connection broke in the middle of a layer: retried, resuming where it stopped.
    #[error("layer {digest}: download interrupted: {message}")]
    Network { digest: Digest, message: String },
    #[error(transparent)]
    Content(#[from] content::Error),
    #[error(transparent)]
    Snapshot(#[from] snapshot::Error),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// One layer of a pulled image.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Layer {
    pub digest: Digest,
    pub size: u64,
    pub media_type: String,
    pub diff_id: Digest,
    pub chain_id: Digest,
    /// An eStargz layer's TOC digest (its manifest annotation): a lazy layer is known by it too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub toc_digest: Option<Digest>,
}

/// What is persisted per image.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Record {
    /// The config digest.
    pub id: Digest,
    pub repo_tags: Vec<String>,
    pub repo_digests: Vec<String>,
    /// The platform manifest.
    pub manifest: Digest,
    /// The index it was picked from, when the reference named one.
    pub index: Option<Digest>,
    pub config_size: u64,
    pub layers: Vec<Layer>,
    /// Bytes of content (config and compressed layers), as containerd reports an image's size.
    pub size: u64,
    /// Unix time in nanoseconds of the last pull.
    pub pulled_at: i64,
}

/// A pulled image: its record and parsed config.
#[derive(Debug, Clone)]
pub struct Image {
    pub record: Record,
    pub config: ImageConfig,
}

impl Image {
    /// The chain ID of the top layer (what a rootfs is stacked on); none for an image without layers.
    pub fn top_chain(&self) -> Option<&Digest> {
        self.record.layers.last().map(|l| &l.chain_id)
    }
}

#[derive(Default)]
struct Catalog {
    images: HashMap<Digest, Arc<Image>>,
    /// repo tags and repo digests -> image ID
    names: HashMap<String, Digest>,
}

/// Usage of the image filesystem.
#[derive(Debug, Clone)]
pub struct FsUsage {
    pub mountpoint: PathBuf,
    pub used_bytes: u64,
    pub inodes_used: u64,
}

pub(crate) struct Inner {
    dir: PathBuf,
    content: content::Store,
    snapshots: Snapshotter,
    registry: registry::Registry,
    catalog: RwLock<Catalog>,
    unpack: UnpackOptions,
    downloads: tokio::sync::Semaphore,
    layer_locks: Mutex<HashMap<Digest, Weak<tokio::sync::Mutex<()>>>>,
    /// Pulls hold it shared; garbage collection exclusively, so it never removes what a pull
    /// has committed but not yet recorded.
    gc: Arc<tokio::sync::RwLock<()>>,
    /// Snapshot chains in use by containers, with a count per chain.
    holds: Mutex<HashMap<Digest, usize>>,
    /// Images mounted as image volumes, with the containers mounting them: not removable
    /// while any does.
    pins: Mutex<HashMap<Digest, std::collections::BTreeSet<String>>>,
    progress: progress::Board,
    signature_policy: PathBuf,
    lazy: lazy::Lazy,
    /// Images taken out of the catalog because their layers did not match (see `behind`).
    refusals: behind::Refusals,
}

/// How a pull goes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Pull {
    /// Lazily where it can be.
    Any,
    /// Whole, behind a lazy pull: records the image only if it is still there.
    Behind,
}

/// The image service. Cheap to clone.
#[derive(Clone)]
pub struct ImageService {
    inner: Arc<Inner>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn read<T>(m: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    m.read().unwrap_or_else(|p| p.into_inner())
}

fn write<T>(m: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    m.write().unwrap_or_else(|p| p.into_inner())
}

/// Where the image service keeps its stores and how it reaches registries.
#[derive(Debug, Clone)]
pub struct Options {
    /// The daemon's root: `images/`, `content/` and `snapshots/` go below it.
    pub root: PathBuf,
    /// The hosts.toml directory (mirrors, TLS) and the registry credentials file.
    pub config_path: PathBuf,
    pub auth_file: PathBuf,
    pub allow_device_nodes: bool,
    pub max_concurrent_downloads: usize,
    /// The signature policy file, read at every pull (absent: no policy).
    pub signature_policy: PathBuf,
    /// Serve eStargz images before their pull ends (see `lazy`), and start their whole pull
    /// this long after.
    pub lazy_pull: bool,
    pub lazy_whole_pull_delay: std::time::Duration,
}

impl ImageService {
    /// Opens the stores under the configured root and loads every image record. A record whose
    /// config or snapshots are gone (a crash mid-removal) is dropped so the image is pulled again.
    pub fn open(cfg: &Options) -> Result<ImageService, Error> {
        let dir = cfg.root.join("images");
        std::fs::create_dir_all(&dir).map_err(|source| Error::Io {
            path: dir.clone(),
            source,
        })?;
        let content = content::Store::open(&cfg.root.join("content"))?;
        let snapshots = Snapshotter::open(&cfg.root.join("snapshots"))?;
        let inner = Inner {
            dir,
            content,
            snapshots,
            registry: registry::Registry::new(cfg.config_path.clone(), cfg.auth_file.clone()),
            catalog: RwLock::new(Catalog::default()),
            unpack: UnpackOptions {
                allow_device_nodes: cfg.allow_device_nodes,
            },
            downloads: tokio::sync::Semaphore::new(cfg.max_concurrent_downloads),
            layer_locks: Mutex::new(HashMap::new()),
            gc: Arc::default(),
            holds: Mutex::new(HashMap::new()),
            pins: Mutex::new(HashMap::new()),
            progress: progress::Board::default(),
            signature_policy: cfg.signature_policy.clone(),
            lazy: lazy::Lazy::new(
                &cfg.root,
                cfg.lazy_pull,
                cfg.lazy_whole_pull_delay,
                cfg.config_path.clone(),
                cfg.auth_file.clone(),
            ),
            refusals: behind::Refusals::default(),
        };
        let svc = ImageService {
            inner: Arc::new(inner),
        };
        svc.load()?;
        Ok(svc)
    }

    fn load(&self) -> Result<(), Error> {
        let dir = &self.inner.dir;
        atomic::sweep(dir);
        let mut records: Vec<Record> = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(|source| Error::Io {
            path: dir.clone(),
            source,
        })? {
            let entry = entry.map_err(|source| Error::Io {
                path: dir.clone(),
                source,
            })?;
            let path = entry.path();
            if path.extension().and_then(|e| e.to_str()) != Some("json") {
                continue;
            }
            match atomic::read_json::<Record>(&path) {
                Ok(Some(r)) => records.push(r),
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "ignoring unreadable image record")
                }
            }
        }
        // Older pulls first, so a tag claimed twice ends with the newest.
        records.sort_by_key(|r| r.pulled_at);
        let mut catalog = write(&self.inner.catalog);
        for r in records {
            let complete = r
                .layers
                .iter()
                .all(|l| self.inner.snapshots.exists(&l.chain_id));
            let config = self
                .inner
                .content
                .read(&r.id)
                .map_err(|e| e.to_string())
                .and_then(|b| manifest::parse_config(&b).map_err(|e| e.to_string()));
            match (complete, config) {
                (true, Ok(config)) => {
                    for name in r.repo_tags.iter().chain(&r.repo_digests) {
                        if let Some(old) = catalog.names.insert(name.clone(), r.id.clone())
                            && old != r.id
                            && let Some(img) = catalog.images.get_mut(&old)
                        {
                            let mut rec = img.record.clone();
                            rec.repo_tags.retain(|t| t != name);
                            *img = Arc::new(Image {
                                record: rec,
                                config: img.config.clone(),
                            });
                        }
                    }
                    catalog
                        .images
                        .insert(r.id.clone(), Arc::new(Image { record: r, config }));
                }
                (complete, config) => {
                    tracing::warn!(image = %r.id, complete, config_ok = config.is_ok(), "dropping incomplete image record; pull it again");
                    let _ = atomic::remove(&self.record_path(&r.id));
                }
            }
        }
        tracing::info!(images = catalog.images.len(), "image catalog loaded");
        Ok(())
    }

    fn record_path(&self, id: &Digest) -> PathBuf {
        self.inner.dir.join(format!("{}.json", id.hex()))
    }

    /// Pulls `image` and records it. Concurrent pulls of the same layers share the work. With
    /// `lazy_pull`, an eStargz image is recorded once its layers are served lazily, and its
    /// whole pull goes on behind (see `lazy`).
    pub async fn pull(&self, image: &str, creds: Option<Credentials>) -> Result<Arc<Image>, Error> {
        let (pulled, lazy) = self.pull_as(image, creds.clone(), Pull::Any).await?;
        if lazy {
            self.finish_behind(creds, pulled.clone());
        }
        Ok(pulled)
    }

    /// One pull; says whether it was served lazily.
    async fn pull_as(
        &self,
        image: &str,
        creds: Option<Credentials>,
        how: Pull,
    ) -> Result<(Arc<Image>, bool), Error> {
        let started = std::time::Instant::now();
        let reference = Reference::parse(image)?;
        let key = reference.to_string();
        let progress = self.inner.progress.start(&key);
        let mut watched = Watched {
            board: &self.inner.progress,
            key: &key,
            progress: &progress,
            ended: false,
        };
        let result = {
            // Until the image is in the catalog: a collection before that would take its blobs.
            // Shared with the pull's unpackers: a cancelled pull's unpacker still running keeps
            // the collection off what it is writing.
            let pulling = Arc::new(self.inner.gc.clone().read_owned().await);
            let may_lazy = how == Pull::Any && self.inner.lazy.enabled();
            match pull::pull(
                &self.inner,
                &reference,
                creds,
                &progress,
                &pulling,
                may_lazy,
            )
            .await
            {
                Ok((record, config, lazy)) => {
                    let added = self.add(record, config, how == Pull::Behind);
                    // Recorded: the layers it mounted stay (dropped on an error, they go).
                    let served = lazy.is_some();
                    if let (Ok(_), Some(m)) = (&added, lazy) {
                        m.keep();
                    }
                    added.map(|i| (i, served))
                }
                Err(e) => Err(e),
            }
        };
        self.inner.progress.finish(
            &key,
            &progress,
            result.as_ref().err().map(|e| e.to_string()),
        );
        watched.ended = true;
        // A pull's buffers (layers in flight, decompressors) are freed by now; without this the
        // daemon would keep them resident.
        crate::sys::trim_heap();
        crate::metrics::global().pull(
            progress
                .bytes_done
                .load(std::sync::atomic::Ordering::Relaxed),
            started.elapsed().as_secs_f64(),
            result.as_ref().err().map(Error::reason),
        );
        result
    }

    /// Records a pulled image, merging names with an existing record of the same ID and moving
    /// tags away from images that held them before.
    /// `behind` (the whole pull behind a lazy one) records it only if it is still there, under
    /// the same lock: a removal meanwhile stands.
    fn add(
        &self,
        mut record: Record,
        config: ImageConfig,
        behind: bool,
    ) -> Result<Arc<Image>, Error> {
        let mut catalog = write(&self.inner.catalog);
        if behind && !catalog.images.contains_key(&record.id) {
            return Err(Error::NotFound {
                image: record.id.to_string(),
            });
        }
        if let Some(existing) = catalog.images.get(&record.id) {
            for t in &existing.record.repo_tags {
                if !record.repo_tags.contains(t) {
                    record.repo_tags.push(t.clone());
                }
            }
            for d in &existing.record.repo_digests {
                if !record.repo_digests.contains(d) {
                    record.repo_digests.push(d.clone());
                }
            }
        }
        let mut changed: Vec<Arc<Image>> = Vec::new();
        for tag in &record.repo_tags {
            if let Some(old) = catalog.names.get(tag).cloned()
                && old != record.id
                && let Some(img) = catalog.images.get(&old).cloned()
            {
                let mut rec = img.record.clone();
                rec.repo_tags.retain(|t| t != tag);
                let updated = Arc::new(Image {
                    record: rec,
                    config: img.config.clone(),
                });
                catalog.images.insert(old.clone(), updated.clone());
                changed.push(updated);
            }
        }
        for img in &changed {
            self.persist(&img.record)?;
        }
        self.persist(&record)?;
        for name in record.repo_tags.iter().chain(&record.repo_digests) {
            catalog.names.insert(name.clone(), record.id.clone());
        }
        self.inner.refusals.forget(&record);
        let image = Arc::new(Image { record, config });
        catalog
            .images
            .insert(image.record.id.clone(), image.clone());
        Ok(image)
    }

    fn persist(&self, record: &Record) -> Result<(), Error> {
        let path = self.record_path(&record.id);
        atomic::write_json(&path, record).map_err(|source| Error::Io { path, source })
    }

    /// Finds an image by ID (`sha256:…` or 64 hex), `name:tag` or `name@digest`.
    pub fn lookup(&self, image: &str) -> Result<Option<Arc<Image>>, Error> {
        let name = catalog_name(image)?;
        let catalog = read(&self.inner.catalog);
        let id = match &name {
            CatalogName::Id(id) => Some(id),
            CatalogName::Name(n) => catalog.names.get(n),
        };
        Ok(id.and_then(|id| catalog.images.get(id)).cloned())
    }

    /// Every image, in a stable order.
    pub fn list(&self) -> Vec<Arc<Image>> {
        let catalog = read(&self.inner.catalog);
        let mut out: Vec<Arc<Image>> = catalog.images.values().cloned().collect();
        out.sort_by(|a, b| a.record.id.cmp(&b.record.id));
        out
    }

    /// The raw config blob of an image (for verbose status).
    pub fn config_blob(&self, id: &Digest) -> Result<Vec<u8>, Error> {
        Ok(self.inner.content.read(id)?)
    }

    /// Removes an image and all its names; unknown images are fine (removal is idempotent).
    /// Blobs and snapshots no other image uses are then collected.
    pub async fn remove(&self, image: &str) -> Result<(), Error> {
        let Some(img) = self.lookup(image)? else {
            return Ok(());
        };
        if let Some(c) = lock(&self.inner.pins)
            .get(&img.record.id)
            .and_then(|holders| holders.iter().next())
        {
            return Err(Error::InUse {
                image: img.record.id.to_string(),
                container: c.clone(),
            });
        }
        {
            let mut catalog = write(&self.inner.catalog);
            self.unrecord(&mut catalog, &img.record.id)?;
        }
        let keys: Vec<lazy::Key> = img.record.layers.iter().filter_map(lazy::key).collect();
        self.inner
            .lazy
            .retire_unless(&keys, |k| self.lazy_in_use(k))
            .await;
        match self.inner.gc.clone().try_write_owned() {
            Ok(guard) => {
                let me = self.clone();
                // The guard goes with the collection: it holds even if this call is dropped.
                tokio::task::spawn_blocking(move || {
                    let _guard = guard;
                    me.collect()
                })
                .await
                .map_err(|e| Error::Io {
                    path: self.inner.dir.clone(),
                    source: std::io::Error::other(e),
                })??;
            }
            // A pull is running: collect once it is done, without holding up the caller.
            Err(_) => self.collect_later(),
        }
        Ok(())
    }

    /// Takes image `id` and its names out of the catalog and its record off the disk.
    fn unrecord(&self, catalog: &mut Catalog, id: &Digest) -> Result<(), Error> {
        let path = self.record_path(id);
        atomic::remove(&path).map_err(|source| Error::Io { path, source })?;
        catalog.images.remove(id);
        catalog.names.retain(|_, i| i != id);
        Ok(())
    }

    /// Collects garbage once no pull is running, in the background.
    fn collect_later(&self) {
        let me = self.clone();
        tokio::spawn(async move {
            let guard = me.inner.gc.clone().write_owned().await;
            let me2 = me.clone();
            let collect = move || {
                let _guard = guard;
                me2.collect()
            };
            match tokio::task::spawn_blocking(collect).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::warn!(error = %e, "image garbage collection failed"),
                Err(e) => tracing::warn!(error = %e, "image garbage collection panicked"),
            }
        });
    }

    /// Removes blobs and snapshots no image and no container references. Caller holds `gc`.
    fn collect(&self) -> Result<(), Error> {
        let (blobs, chains) = {
            let catalog = read(&self.inner.catalog);
            let mut blobs: HashSet<Digest> = HashSet::new();
            let mut chains: HashSet<Digest> = HashSet::new();
            for img in catalog.images.values() {
                let r = &img.record;
                blobs.insert(r.id.clone());
                blobs.insert(r.manifest.clone());
                if let Some(i) = &r.index {
                    blobs.insert(i.clone());
                }
                // Layers are kept unpacked only: a layer blob an older crius kept goes.
                for l in &r.layers {
                    chains.insert(l.chain_id.clone());
                }
            }
            (blobs, chains)
        };
        // Held chains keep their whole ancestry; a lazy layer still serving a container keeps
        // every chain of its images (a held lazy chain has no snapshot to follow).
        let mut keep = chains;
        keep.extend(self.inner.lazy.protected());
        for chain in lock(&self.inner.holds).keys() {
            let mut next = Some(chain.clone());
            while let Some(c) = next {
                next = self.inner.snapshots.meta(&c).ok().and_then(|m| m.parent);
                keep.insert(c);
            }
        }
        let mut freed = (0usize, 0usize);
        for d in self.inner.content.list()? {
            if !blobs.contains(&d) {
                self.inner.content.remove(&d)?;
                freed.0 += 1;
            }
        }
        for m in self.inner.snapshots.list()? {
            if !keep.contains(&m.chain_id) {
                self.inner.snapshots.remove(&m.chain_id)?;
                freed.1 += 1;
            }
        }
        tracing::info!(
            blobs = freed.0,
            snapshots = freed.1,
            "image garbage collected"
        );
        Ok(())
    }

    /// Keeps an image's snapshots while a container uses them, even if the image is removed.
    pub fn hold(&self, chain: &Digest) {
        *lock(&self.inner.holds).entry(chain.clone()).or_insert(0) += 1;
    }

    pub fn release(&self, chain: &Digest) {
        let mut holds = lock(&self.inner.holds);
        if let Some(n) = holds.get_mut(chain) {
            *n -= 1;
            if *n == 0 {
                holds.remove(chain);
            }
        }
    }

    /// Keeps image `id` from removal while `container` mounts it as an image volume.
    pub fn pin(&self, id: &Digest, container: &str) {
        lock(&self.inner.pins)
            .entry(id.clone())
            .or_default()
            .insert(container.to_string());
    }

    pub fn unpin(&self, id: &Digest, container: &str) {
        let mut pins = lock(&self.inner.pins);
        if let Some(holders) = pins.get_mut(id) {
            holders.remove(container);
            if holders.is_empty() {
                pins.remove(id);
            }
        }
    }

    /// The overlay lower directories for a rootfs on `chain`, topmost first.
    /// The overlay lower directories for a rootfs of `image`, topmost first. A layer not yet
    /// unpacked but served lazily gives its mount (found by its blob's digest too: see `lazy`).
    pub fn lowerdirs(&self, image: &Image) -> Result<Vec<PathBuf>, Error> {
        let mut out = Vec::new();
        for l in image.record.layers.iter().rev() {
            if self.inner.snapshots.exists(&l.chain_id) {
                out.push(self.inner.snapshots.fs_dir(&l.chain_id));
            } else if let Some(mnt) = lazy::key(l).and_then(|k| self.inner.lazy.lower(&k)) {
                out.push(mnt);
            } else {
                return Err(snapshot::Error::Missing {
                    chain_id: l.chain_id.clone(),
                }
                .into());
            }
        }
        Ok(out)
    }

    /// Serves, until their containers end, the lazy layers a previous daemon left.
    pub fn recover_lazy(&self) {
        lazy::recover(&self.inner);
    }

    /// Bytes and inodes the image store uses (content blobs and unpacked snapshots).
    pub fn fs_usage(&self) -> Result<FsUsage, Error> {
        let (mut bytes, mut inodes) = self.inner.content.usage()?;
        for m in self.inner.snapshots.list()? {
            bytes += m.size;
            inodes += m.inodes;
        }
        Ok(FsUsage {
            mountpoint: self.inner.snapshots.root().to_path_buf(),
            used_bytes: bytes,
            inodes_used: inodes,
        })
    }

    /// Progress of the pull of `image` (normalised), if one is running or just ended.
    pub fn progress(&self, image: &str) -> Option<Arc<progress::Progress>> {
        let key = Reference::parse(image).ok()?.to_string();
        self.inner.progress.get(&key)
    }

    pub fn root(&self) -> &Path {
        &self.inner.dir
    }
}

impl Inner {
    fn layer_lock(&self, digest: &Digest) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = lock(&self.layer_locks);
        if let Some(l) = locks.get(digest).and_then(Weak::upgrade) {
            return l;
        }
        locks.retain(|_, w| w.strong_count() > 0);
        let l = Arc::new(tokio::sync::Mutex::new(()));
        locks.insert(digest.clone(), Arc::downgrade(&l));
        l
    }
}

/// That `data` is the object `digest` names.
pub(crate) fn check_digest(what: &'static str, digest: &Digest, data: &[u8]) -> Result<(), Error> {
    let actual = Digest::of(data);
    if &actual != digest {
        return Err(Error::DigestMismatch {
            what,
            expected: digest.clone(),
            actual,
        });
    }
    Ok(())
}

/// An image as named in a request: its ID, or the tag or repo digest the catalog keeps it by.
enum CatalogName {
    Id(Digest),
    Name(String),
}

impl CatalogName {
    /// The key of its entry in a table of names (an ID as `sha256:…`).
    fn key(&self) -> String {
        match self {
            CatalogName::Id(id) => id.to_string(),
            CatalogName::Name(n) => n.clone(),
        }
    }
}

/// Reads an ID (`sha256:…` or 64 hex), `name:tag` or `name@digest`.
fn catalog_name(image: &str) -> Result<CatalogName, Error> {
    if image.starts_with("sha256:") {
        return Ok(CatalogName::Id(image.parse::<Digest>()?));
    }
    if image.len() == 64 && image.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Ok(CatalogName::Id(Digest::from_hex(image)?));
    }
    let r = Reference::parse(image)?;
    Ok(CatalogName::Name(match &r.digest {
        Some(d) => r.repo_digest(d),
        None => r.repo_tag().unwrap_or_else(|| r.name()),
    }))
}

/// A pull's entry on the progress board, ended as abandoned when the pull is dropped before its
/// end (a cancelled PullImage).
struct Watched<'a> {
    board: &'a progress::Board,
    key: &'a str,
    progress: &'a Arc<progress::Progress>,
    ended: bool,
}

impl Drop for Watched<'_> {
    fn drop(&mut self) {
        if !self.ended {
            self.board.abandon(self.key, self.progress);
        }
    }
}
