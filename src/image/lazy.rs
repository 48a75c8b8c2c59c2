//! Lazy pulling (`image.lazy_pull`): an image whose layers are all eStargz is usable once each
//! layer's table of contents is fetched and verified (its digest is in the manifest, which is
//! verified), and its whole pull goes on behind. A lazy layer is served by a `crius lazyfs`
//! helper (see `snapshot::lazy`), which asks this side for chunks: each is fetched with a range
//! request, checked against the TOC's digest and written to the layer's cache before the helper
//! reads it. Lazy layers are known by chain ID, blob digest *and* TOC digest (see `Key`).
//! Chunks are answered on a runtime thread of their own, with a registry client of their own: a
//! CRI call blocked reading a lazy file (a user lookup in the image's `/etc/passwd`) holds a
//! daemon worker, and must not be what the chunk waits for. Once the whole pull has committed
//! the layer's snapshot, new containers use that; the lazy mount is detached, and its helper
//! and directory go with the last container on it.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};

use super::pull_manifest::Resolved;
use super::registry::{Registry, Session};
use super::{Credentials, Error, Inner, Layer, Reference};
use crate::atomic;
use crate::content::Digest;
use crate::runtime::{self, ProcessId};
use crate::snapshot::lazy::toc::{self, Tree};
use crate::snapshot::lazy::{Budget, BudgetError, Held, LazyDir, MAX_SERVED_WEIGHT, Source};

/// How long a helper may take to mount.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// How often each helper is looked for.
const WATCH_EVERY: Duration = Duration::from_secs(1);
/// A chunk's fetch, before the helper (which waits 300 s) is told it failed.
const FILL_TIMEOUT: Duration = Duration::from_secs(120);
/// What the chunk fills in flight may hold at once, every layer's together: each holds its
/// compressed member and its decoded chunk (up to `toc::MAX_CHUNK` each), and 128 layers of
/// 64 MiB chunks read at once would otherwise take 16 GiB. A fill waits for room within its
/// `FILL_TIMEOUT`.
const FILL_BYTES: u32 = 512 << 20;
/// How long one image's footers and TOCs may take, all its layers together: the mounting lock
/// is held meanwhile, and a registry answering a byte a minute is never timed out per read.
/// Past it, the image is pulled whole.
const TOC_DEADLINE: Duration = Duration::from_secs(120);
/// The most layers of one image served lazily (each is a helper, a mount and a tree); an
/// image with more is pulled whole (overlay stacks at most 500 anyway).
const MAX_LAZY_LAYERS: usize = 128;
/// The most layers remembered as not matching their image (see `Lazy::distrust`): a registry
/// serving one bad image after another must not grow the set without end, and a layer
/// forgotten is only served lazily again until its whole pull finds it out again.
const MAX_DISTRUSTED: usize = 4096;

/// Why a layer is not served lazily, or a chunk not served.
#[derive(Debug, thiserror::Error)]
enum LazyError {
    #[error(transparent)]
    Registry(#[from] Error),
    #[error(transparent)]
    Toc(#[from] toc::TocError),
    #[error("TOC digest {got}, the manifest says {want}")]
    TocDigest { got: Digest, want: Digest },
    #[error("smaller than an eStargz footer")]
    Small,
    #[error(
        "its files take {need} bytes and the served layers' caches may still write {claimed}; \
         the store has {free} free (half is the most lazy caches use)"
    )]
    Room { need: u64, claimed: u64, free: u64 },
    #[error(transparent)]
    Chunk(#[from] toc::ChunkError),
    #[error("no chunk {0}")]
    NoChunk(usize),
    #[error("no answer from the registry within {0:?}")]
    Timeout(Duration),
    #[error(transparent)]
    Budget(#[from] BudgetError),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("lazyfs did not mount: {0:?}")]
    Helper(String),
    #[error(transparent)]
    Task(#[from] tokio::task::JoinError),
}

fn io_err(path: PathBuf) -> impl FnOnce(std::io::Error) -> LazyError {
    move |source| LazyError::Io { path, source }
}

/// A lazy layer: its chain ID, its blob's digest and its TOC's digest. The chain ID comes from
/// diff IDs nothing has checked yet, and the blob digest from a manifest the registry serving
/// the TOC may have written; only with the TOC digest of the image's own verified manifest
/// does a layer served for one image never serve another with other files.
pub(super) type Key = (Digest, Digest, Digest);

/// A layer's key, when it is an eStargz one.
pub(super) fn key(l: &Layer) -> Option<Key> {
    Some((l.chain_id.clone(), l.digest.clone(), l.toc_digest.clone()?))
}

/// The lazy layers being served.
pub(super) struct Lazy {
    root: PathBuf,
    enabled: bool,
    delay: Duration,
    layers: Mutex<HashMap<Key, Arc<Served>>>,
    /// One image's layers are mounted, and recorded with its image, at a time (see `Mounted`);
    /// retiring takes it too, so a layer being given to a new image is not retired meanwhile.
    mounting: Arc<tokio::sync::Mutex<()>>,
    /// The chunk answers' runtime and registry client (see the module's comment).
    chunks: ChunkRuntime,
    registry: Registry,
    /// What the served layers' trees and helpers may take (see `MAX_SERVED_WEIGHT`).
    budget: Budget,
    /// Layers whose whole pull did not match their image: never served lazily again (until the
    /// daemon restarts), so pulling such an image again pulls it whole and fails as it should.
    distrusted: Mutex<HashSet<Key>>,
    /// Bytes the chunk fills in flight may hold, all layers together (see `FILL_BYTES`).
    fills: Arc<tokio::sync::Semaphore>,
}

/// One mounted lazy layer, as this side serves its chunks.
struct Served {
    key: Key,
    dir: LazyDir,
    /// Every chain of the images it serves (see `Lazy::protected`).
    chains: Mutex<BTreeSet<Digest>>,
    source: Source,
    tree: Tree,
    cache: std::fs::File,
    present: Vec<AtomicBool>,
    creds: Option<Credentials>,
    server: Mutex<Option<tokio::task::AbortHandle>>,
    /// Its share of `Lazy::budget`, given back when the last holder drops it.
    _held: Held,
}

impl Served {
    /// Another image is served by this layer: its chains are kept too (written to its source).
    fn protect(&self, chains: &[Digest]) {
        let mut mine = lock(&self.chains);
        let before = mine.len();
        mine.extend(chains.iter().cloned());
        if mine.len() != before {
            let mut source = self.source.clone();
            source.image_chains = mine.iter().cloned().collect();
            if let Err(e) = atomic::write_json(&self.dir.source(), &source) {
                tracing::warn!(dir = %self.dir.path().display(), error = %e, "lazy layer's source not written");
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A runtime on a thread of its own, started when first needed; it lives as long as the
/// daemon (the thread never returns, so nothing drops it inside another runtime).
#[derive(Default)]
struct ChunkRuntime(std::sync::OnceLock<tokio::runtime::Handle>);

impl ChunkRuntime {
    fn handle(&self) -> Result<&tokio::runtime::Handle, LazyError> {
        if let Some(h) = self.0.get() {
            return Ok(h);
        }
        let failed = |e: std::io::Error| io_err(PathBuf::from("lazy-chunks runtime"))(e);
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("lazy-chunks".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build();
                match rt {
                    Ok(rt) => {
                        let _ = tx.send(Ok(rt.handle().clone()));
                        rt.block_on(std::future::pending::<()>());
                    }
                    Err(e) => {
                        let _ = tx.send(Err(e));
                    }
                }
            })
            .map_err(failed)?;
        let handle = rx
            .recv()
            .map_err(|e| failed(std::io::Error::other(e)))?
            .map_err(failed)?;
        Ok(self.0.get_or_init(|| handle))
    }
}

impl Lazy {
    pub(super) fn new(
        root: &Path,
        enabled: bool,
        delay: Duration,
        config_path: PathBuf,
        auth_file: PathBuf,
    ) -> Lazy {
        Lazy {
            root: root.join("lazy"),
            enabled,
            delay,
            layers: Mutex::new(HashMap::new()),
            mounting: Arc::default(),
            chunks: ChunkRuntime::default(),
            registry: Registry::new(config_path, auth_file),
            budget: Budget::new(MAX_SERVED_WEIGHT),
            fills: Arc::new(tokio::sync::Semaphore::new(FILL_BYTES as usize)),
            distrusted: Mutex::new(HashSet::new()),
        }
    }

    pub(super) fn enabled(&self) -> bool {
        self.enabled
    }

    pub(super) fn delay(&self) -> Duration {
        self.delay
    }

    /// The mount serving the layer `key`, while it is served.
    pub(super) fn lower(&self, key: &Key) -> Option<PathBuf> {
        lock(&self.layers).get(key).map(|s| s.dir.mnt())
    }

    /// Stops offering `key` to new containers: its mount is detached and its mount point
    /// removed (an overlay being made from the path now fails, rather than stacking an empty
    /// directory). The helper and directory go once nothing uses the mount.
    fn retire(&self, key: &Key) {
        let Some(served) = lock(&self.layers).remove(key) else {
            return;
        };
        detach(&served.dir);
    }

    /// Retires each of `keys` that `keep` does not want, while no lazy pull is being recorded.
    /// An image of no lazy layers waits for no lazy pull.
    pub(super) async fn retire_unless(&self, keys: &[Key], keep: impl Fn(&Key) -> bool) {
        if keys.is_empty() {
            return;
        }
        let _one = self.mounting.lock().await;
        for k in keys {
            if !keep(k) {
                self.retire(k);
            }
        }
    }

    /// Retires `keys` for good, whoever uses them: their content did not match their image, so
    /// no new container may start on them (running ones keep them until they end). `unrecord`
    /// runs under the same lock, so no lazy pull records an image on them meanwhile.
    pub(super) async fn distrust<R>(&self, keys: &[Key], unrecord: impl FnOnce() -> R) -> R {
        let _one = self.mounting.lock().await;
        {
            let mut distrusted = lock(&self.distrusted);
            if distrusted.len() + keys.len() > MAX_DISTRUSTED {
                distrusted.clear();
            }
            distrusted.extend(keys.iter().cloned());
        }
        for k in keys {
            self.retire(k);
        }
        unrecord()
    }

    pub(super) fn distrusted(&self, key: &Key) -> bool {
        lock(&self.distrusted).contains(key)
    }

    /// Chains whose snapshots a running container on a lazy layer may stack (every layer of
    /// the images it was served for): the collection keeps them while the layer's directory
    /// is there, which is as long as its helper runs.
    pub(super) fn protected(&self) -> Vec<Digest> {
        let mut out = Vec::new();
        for entry in std::fs::read_dir(&self.root)
            .into_iter()
            .flatten()
            .flatten()
        {
            let dir = LazyDir::new(entry.path());
            if let Ok(Some(source)) = atomic::read_json::<Source>(&dir.source()) {
                out.extend(source.image_chains);
            }
        }
        out
    }
}

fn detach(dir: &LazyDir) {
    let _ = nix::mount::umount2(&dir.mnt(), nix::mount::MntFlags::MNT_DETACH);
    let _ = std::fs::remove_dir(dir.mnt());
}

/// The layers one lazy pull mounted, and the mounting lock, until its image is recorded:
/// dropped unkept (the pull failed or was cancelled), they are retired.
pub(super) struct Mounted {
    inner: Arc<Inner>,
    keys: Vec<Key>,
    _one: tokio::sync::OwnedMutexGuard<()>,
}

impl Mounted {
    /// The image is recorded: its layers stay.
    pub(super) fn keep(mut self) {
        self.keys.clear();
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        for k in &self.keys {
            self.inner.lazy.retire(k);
        }
    }
}

/// Serves an image's layers lazily when every layer not yet unpacked is eStargz. `None` when it
/// cannot (or a layer's TOC fails, logged): the whole pull does it all.
pub(super) async fn serve(
    inner: &Arc<Inner>,
    resolved: &Resolved<'_>,
    reference: &Reference,
    creds: &Option<Credentials>,
) -> Option<Mounted> {
    let layers = &resolved.layers;
    let mut wanted = Vec::new();
    for l in layers {
        if inner.snapshots.exists(&l.chain_id) {
            continue;
        }
        match key(l) {
            Some(k) if l.media_type.contains("gzip") => wanted.push((l, k)),
            _ => return None,
        }
    }
    if wanted.is_empty() {
        return None;
    }
    if wanted.len() > MAX_LAZY_LAYERS {
        tracing::info!(image = %reference, layers = wanted.len(), max = MAX_LAZY_LAYERS, "too many layers to serve lazily; pulling it whole");
        return None;
    }
    let chains: Vec<Digest> = layers.iter().map(|l| l.chain_id.clone()).collect();
    let shown = reference.to_string();
    let mut mounted = Mounted {
        inner: inner.clone(),
        keys: Vec::new(),
        _one: inner.lazy.mounting.clone().lock_owned().await,
    };
    // Under the lock: `distrust` takes it too.
    if let Some((l, _)) = wanted.iter().find(|(_, k)| inner.lazy.distrusted(k)) {
        tracing::warn!(image = %shown, layer = %l.digest, "this layer did not match its digests when last pulled whole; pulling the image whole");
        return None;
    }
    let deadline = tokio::time::Instant::now() + TOC_DEADLINE;
    for (l, key) in wanted {
        let served = lock(&inner.lazy.layers).get(&key).cloned();
        if let Some(served) = served {
            served.protect(&chains);
            continue;
        }
        let made = mount(
            inner,
            &resolved.session,
            &shown,
            l,
            &key,
            &chains,
            creds,
            deadline,
        );
        match made.await {
            Ok(()) => mounted.keys.push(key),
            Err(e) => {
                tracing::warn!(image = %shown, layer = %l.digest, error = %e, "lazy pull not possible; pulling it whole");
                // `mounted` retires what this pull mounted; another image's lazy layers stay.
                return None;
            }
        }
    }
    Some(mounted)
}

/// Fetches and checks one layer's TOC (by `deadline`), makes its directory and serves it.
#[allow(clippy::too_many_arguments)]
async fn mount(
    inner: &Arc<Inner>,
    session: &Session<'_>,
    shown: &str,
    layer: &Layer,
    key: &Key,
    image_chains: &[Digest],
    creds: &Option<Credentials>,
    deadline: tokio::time::Instant,
) -> Result<(), LazyError> {
    let digest = &layer.digest;
    let footer_at = layer
        .size
        .checked_sub(toc::FOOTER_SIZE)
        .ok_or(LazyError::Small)?;
    let fetched = tokio::time::timeout_at(deadline, async {
        let footer = session
            .range(digest, footer_at, layer.size, toc::FOOTER_SIZE)
            .await?;
        let toc_offset = toc::toc_offset(&footer)?;
        let member = session
            .range(digest, toc_offset, footer_at, toc::MAX_TOC)
            .await?;
        Ok::<_, LazyError>((toc_offset, member))
    })
    .await;
    let (toc_offset, member) = fetched.map_err(|_| LazyError::Timeout(TOC_DEADLINE))??;
    let want = key.2.clone();
    let allow_devices = inner.unpack.allow_device_nodes;
    let (json, tree) = tokio::task::spawn_blocking(move || {
        let json = toc::toc_json(&member)?;
        let got = Digest::of(&json);
        if got != want {
            return Err(LazyError::TocDigest { got, want });
        }
        let tree = Tree::parse(&json, toc_offset, allow_devices)?;
        Ok((json, tree))
    })
    .await??;
    // Taken before anything is made; given back when the layer's last holder drops it.
    let held = inner.lazy.budget.take(Budget::weight(&tree))?;
    let source = Source {
        reference: shown.to_string(),
        digest: digest.clone(),
        size: layer.size,
        toc_offset,
        chain_id: layer.chain_id.clone(),
        toc_digest: key.2.clone(),
        allow_devices,
        image_chains: image_chains.to_vec(),
    };
    let mut name = [0u8; 8];
    getrandom::fill(&mut name).map_err(|e| io_err(inner.lazy.root.clone())(e.into()))?;
    let dir = LazyDir::new(inner.lazy.root.join(format!(
        "{}-{}",
        &digest.hex()[..12],
        hex::encode(name)
    )));
    // Off the async threads (the TOC written is up to 64 MiB). Until its helper is watched, a
    // failure or a cancelled pull takes it all down: `Unmade` is made in the blocking task, so
    // a pull dropped while it runs removes the directory too.
    let root = inner.lazy.root.clone();
    let (key, creds) = (key.clone(), creds.clone());
    let others: Vec<Arc<Served>> = lock(&inner.lazy.layers).values().cloned().collect();
    let unmade = tokio::task::spawn_blocking(move || {
        let claimed = unwritten(&others);
        let served = prepare(
            &root, key, &dir, &source, &json, tree, &creds, held, claimed,
        )?;
        Ok::<_, LazyError>(Unmade(Some(Arc::new(served))))
    })
    .await??;
    let served = unmade.served()?;
    start(inner, &served)?;
    let helper = spawn_helper(&served.dir).await?;
    unmade.made();
    lock(&inner.lazy.layers).insert(served.key.clone(), served.clone());
    tokio::spawn(watch(inner.clone(), served, helper));
    tracing::info!(layer = %digest, image = shown, "layer served lazily");
    Ok(())
}

/// A layer being made: stopped, and its directory removed, if dropped before `made`.
struct Unmade(Option<Arc<Served>>);

impl Unmade {
    fn made(mut self) {
        self.0 = None;
    }

    fn served(&self) -> Result<Arc<Served>, LazyError> {
        self.0
            .clone()
            .ok_or_else(|| LazyError::Helper("its layer is gone".into()))
    }
}

impl Drop for Unmade {
    fn drop(&mut self) {
        if let Some(s) = self.0.take() {
            stop(&s);
        }
    }
}

/// What the served layers' caches may still write: each is sparse, made the size of its files,
/// so the store's free room does not yet show what its unread chunks will take.
fn unwritten(served: &[Arc<Served>]) -> u64 {
    use std::os::unix::fs::MetadataExt;
    served
        .iter()
        .map(|s| {
            let written = s
                .cache
                .metadata()
                .map_or(0, |m| m.blocks().saturating_mul(512));
            s.tree.cache_size.saturating_sub(written)
        })
        .fold(0u64, u64::saturating_add)
}

/// The layer's directory (0700, new: its name is random): its TOC, source, an empty cache file
/// (0600) the size of its files, and `mnt`. The cache, with what the served layers' caches
/// may still write (`claimed`), may take at most half the store's free room. On failure, what
/// it made is removed.
#[allow(clippy::too_many_arguments)]
fn prepare(
    root: &Path,
    key: Key,
    dir: &LazyDir,
    source: &Source,
    json: &[u8],
    tree: Tree,
    creds: &Option<Credentials>,
    held: Held,
    claimed: u64,
) -> Result<Served, LazyError> {
    let mut private = std::fs::DirBuilder::new();
    private.mode(0o700).recursive(true);
    private.create(root).map_err(io_err(root.to_path_buf()))?;
    let st = nix::sys::statvfs::statvfs(root).map_err(|e| io_err(root.to_path_buf())(e.into()))?;
    let free = st.blocks_available() as u64 * st.fragment_size() as u64;
    if tree.cache_size.saturating_add(claimed) > free / 2 {
        return Err(LazyError::Room {
            need: tree.cache_size,
            claimed,
            free,
        });
    }
    let mut new = std::fs::DirBuilder::new();
    new.mode(0o700);
    new.create(dir.path())
        .map_err(io_err(dir.path().to_path_buf()))?;
    let made = fill_dir(key, dir, source, json, tree, creds, held);
    if made.is_err() {
        let _ = std::fs::remove_dir_all(dir.path());
    }
    made
}

fn fill_dir(
    key: Key,
    dir: &LazyDir,
    source: &Source,
    json: &[u8],
    tree: Tree,
    creds: &Option<Credentials>,
    held: Held,
) -> Result<Served, LazyError> {
    let mut new = std::fs::DirBuilder::new();
    new.mode(0o700);
    new.create(dir.mnt()).map_err(io_err(dir.mnt()))?;
    atomic::write(&dir.toc(), json, 0o600).map_err(io_err(dir.toc()))?;
    atomic::write_json(&dir.source(), source).map_err(io_err(dir.source()))?;
    let cache = std::fs::File::options()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(dir.cache())
        .map_err(io_err(dir.cache()))?;
    cache
        .set_len(tree.cache_size)
        .map_err(io_err(dir.cache()))?;
    Ok(served(
        key,
        dir,
        source.clone(),
        tree,
        cache,
        creds.clone(),
        held,
    ))
}

fn served(
    key: Key,
    dir: &LazyDir,
    source: Source,
    tree: Tree,
    cache: std::fs::File,
    creds: Option<Credentials>,
    held: Held,
) -> Served {
    Served {
        key,
        dir: dir.clone(),
        chains: Mutex::new(source.image_chains.iter().cloned().collect()),
        source,
        present: tree.chunks.iter().map(|_| AtomicBool::new(false)).collect(),
        tree,
        cache,
        creds,
        server: Mutex::new(None),
        _held: held,
    }
}

/// Listens for the helper's chunk requests, on the chunks' runtime.
fn start(inner: &Arc<Inner>, served: &Arc<Served>) -> Result<(), LazyError> {
    let socket = served.dir.socket();
    let _ = std::fs::remove_file(&socket);
    let listener = std::os::unix::net::UnixListener::bind(&socket)
        .and_then(|l| l.set_nonblocking(true).map(|()| l))
        .map_err(io_err(socket.clone()))?;
    let rt = inner.lazy.chunks.handle()?;
    let listener = {
        let _in = rt.enter();
        UnixListener::from_std(listener).map_err(io_err(socket))?
    };
    let task = rt.spawn(listen(inner.clone(), served.clone(), listener));
    *lock(&served.server) = Some(task.abort_handle());
    Ok(())
}

/// Stops answering and removes the directory (the helper is gone, or never came).
fn stop(served: &Served) {
    if let Some(task) = lock(&served.server).take() {
        task.abort();
    }
    detach(&served.dir);
    let _ = std::fs::remove_dir_all(served.dir.path());
}

/// Starts `crius lazyfs DIR` in a process group of its own and waits for it to say the mount is
/// made; records who it is.
async fn spawn_helper(dir: &LazyDir) -> Result<ProcessId, LazyError> {
    let mut child = tokio::process::Command::new(runtime::exe::helper())
        .arg0("crius")
        .arg("lazyfs")
        .arg(dir.path())
        .process_group(0)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .map_err(io_err(runtime::exe::helper()))?;
    let stdout = child.stdout.take();
    // Killed unless it says ready, even when this future is dropped.
    let mut child = Unready(Some(child));
    let stdout = stdout.ok_or_else(|| LazyError::Helper("no stdout".into()))?;
    let mut line = String::new();
    let read = tokio::time::timeout(
        READY_TIMEOUT,
        tokio::io::BufReader::new(stdout).read_line(&mut line),
    )
    .await;
    if !matches!(read, Ok(Ok(_))) || line.trim() != "ready" {
        return Err(LazyError::Helper(line.trim().to_string()));
    }
    let who = match child.0.as_ref().and_then(|c| c.id()) {
        Some(pid) => ProcessId::of(pid as i32).map_err(io_err(dir.pid_file()))?,
        None => return Err(LazyError::Helper("gone after it said ready".into())),
    };
    atomic::write_json(&dir.pid_file(), &who).map_err(io_err(dir.pid_file()))?;
    // Left to tokio, which reaps it when it ends.
    drop(child.0.take());
    Ok(who)
}

/// A helper not yet ready: killed on drop.
struct Unready(Option<tokio::process::Child>);

impl Drop for Unready {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.start_kill();
        }
    }
}

/// Answers each connection of the helper: a chunk index in, one byte out (0: in the cache).
async fn listen(inner: Arc<Inner>, served: Arc<Served>, listener: UnixListener) {
    while let Ok((conn, _)) = listener.accept().await {
        tokio::spawn(answer(inner.clone(), served.clone(), conn));
    }
}

async fn answer(inner: Arc<Inner>, served: Arc<Served>, mut conn: UnixStream) {
    let Ok(reference) = Reference::parse(&served.source.reference) else {
        return;
    };
    let session = match inner
        .lazy
        .registry
        .session(&reference, served.creds.clone())
        .await
    {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "lazy layer: no registry session");
            return;
        }
    };
    let mut index = [0u8; 4];
    while conn.read_exact(&mut index).await.is_ok() {
        let i = u32::from_le_bytes(index) as usize;
        let fills = &inner.lazy.fills;
        let filled = tokio::time::timeout(FILL_TIMEOUT, fill(&session, &served, i, fills)).await;
        let answer = match filled {
            Ok(Ok(())) => 0,
            Ok(Err(e)) => {
                tracing::warn!(layer = %served.source.digest, chunk = i, error = %e, "lazy chunk not served");
                1
            }
            Err(_) => {
                let e = LazyError::Timeout(FILL_TIMEOUT);
                tracing::warn!(layer = %served.source.digest, chunk = i, error = %e, "lazy chunk not served");
                1
            }
        };
        if conn.write_all(&[answer]).await.is_err() {
            return;
        }
    }
}

/// Fetches chunk `i`, checks it and writes it to the cache, holding its bytes' share of `fills`
/// meanwhile.
async fn fill(
    session: &Session<'_>,
    served: &Arc<Served>,
    i: usize,
    fills: &Arc<tokio::sync::Semaphore>,
) -> Result<(), LazyError> {
    let chunk = served
        .tree
        .chunks
        .get(i)
        .ok_or(LazyError::NoChunk(i))?
        .clone();
    if served.present[i].load(Ordering::Acquire) {
        return Ok(());
    }
    let end = chunk.fetch_end();
    // The member as fetched (bounded below) and the chunk as decoded.
    let max_member = toc::MAX_CHUNK + (1 << 20);
    let weight = end
        .saturating_sub(chunk.blob_offset)
        .min(max_member)
        .saturating_add(chunk.size.min(toc::MAX_CHUNK));
    let share = u32::try_from(weight).unwrap_or(FILL_BYTES).min(FILL_BYTES);
    let _held = fills
        .clone()
        .acquire_many_owned(share)
        .await
        .map_err(|_| LazyError::Helper("the chunk fills are closed".into()))?;
    let member = session
        .range(&served.source.digest, chunk.blob_offset, end, max_member)
        .await?;
    let s = served.clone();
    tokio::task::spawn_blocking(move || {
        let bytes = toc::chunk_bytes(&chunk, &member)?;
        let at = s.tree.nodes[chunk.node].base + chunk.file_offset;
        s.cache
            .write_all_at(&bytes, at)
            .map_err(io_err(s.dir.cache()))?;
        s.present[i].store(true, Ordering::Release);
        Ok::<(), LazyError>(())
    })
    .await?
}

/// Waits for the helper to end (its mount detached and unused, or killed), then drops the
/// layer and its directory. `ended`, not `!alive`: a /proc that cannot be read (no descriptors
/// left) says nothing.
async fn watch(inner: Arc<Inner>, served: Arc<Served>, helper: ProcessId) {
    while !helper.ended() {
        tokio::time::sleep(WATCH_EVERY).await;
    }
    {
        let mut layers = lock(&inner.lazy.layers);
        if layers
            .get(&served.key)
            .is_some_and(|s| Arc::ptr_eq(s, &served))
        {
            tracing::warn!(layer = %served.source.digest, "lazyfs helper ended while its layer was offered");
            layers.remove(&served.key);
        }
    }
    stop(&served);
}

/// After a daemon restart: every lazy layer left is retired (the image it came with is pulled
/// again whole); a helper still serving containers is answered until it ends.
pub(super) fn recover(inner: &Arc<Inner>) {
    let Ok(entries) = std::fs::read_dir(&inner.lazy.root) else {
        return;
    };
    for entry in entries.flatten() {
        let dir = LazyDir::new(entry.path());
        let helper = atomic::read_json::<ProcessId>(&dir.pid_file())
            .ok()
            .flatten()
            .filter(|h| !h.ended());
        let revived = helper.and_then(|h| {
            let (source, tree) = dir.tree().ok()?;
            let cache = std::fs::File::options()
                .read(true)
                .write(true)
                .open(dir.cache())
                .ok()?;
            let key = (
                source.chain_id.clone(),
                source.digest.clone(),
                source.toc_digest.clone(),
            );
            // Counted, never refused: its containers run on it already.
            let held = inner.lazy.budget.force(Budget::weight(&tree));
            Some((
                h,
                Arc::new(served(key, &dir, source, tree, cache, None, held)),
            ))
        });
        let Some((helper, served)) = revived else {
            detach(&dir);
            let _ = std::fs::remove_dir_all(dir.path());
            continue;
        };
        tracing::info!(dir = %dir.path().display(), "lazy layer from before the restart: serving it until its containers end");
        detach(&dir);
        if start(inner, &served).is_ok() {
            tokio::spawn(watch(inner.clone(), served, helper));
        }
    }
}
