//! CheckpointContainer and restoring from its archive, with CRIU (`criu` from the PATH).
//!
//! A checkpoint is a tar at the requested path in the layout CRI-O and containerd write: the
//! CRIU images under `checkpoint/`, `config.dump` (what the container was made from),
//! `spec.dump` (its OCI spec), `rootfs-diff.tar` (its writable layer as a layer tar, see
//! `snapshot::diff`) and `deleted.files`; crius adds `crius.json` (the mounts and network
//! namespace the images refer to from outside) and `descriptors.json` (the stdio pipes). The
//! container keeps running. CreateContainer whose image is the path of such an archive makes a
//! container of the checkpoint's image with its layer changes, and StartContainer restores the
//! processes into it (CRI-O's convention); the pod may be another one. The archive is hostile:
//! `restore` gates, unpacks, reads and restores it.

use super::{
    Bundle, Cgroup, ContainerService, ContainerState, Deserialize, Duration, Error, MonitorConfig,
    Path, PathBuf, ProcessId, Record, Serialize, atomic, invalid, io_err, now_nanos, runtime,
    state_name,
};

/// What `crius.json` in an archive holds.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(super) struct Externals {
    /// Mount points the images name as external (their key is the mount point).
    pub mounts: Vec<String>,
    /// The key of the pod's network namespace, when the container was in one.
    pub net: Option<String>,
}

/// CRI-O's `config.dump`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub(super) struct ConfigDump {
    pub id: String,
    pub name: String,
    pub rootfs_image: String,
    pub rootfs_image_ref: String,
    pub rootfs_image_name: String,
    pub runtime: String,
    pub created_time: String,
    pub checkpointed_time: String,
}

/// The network namespace's key in the images.
pub(super) const NET_KEY: &str = "crius-pod-net";
/// How long a dump may take when the request gives no timeout.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

pub(super) fn refused(id: &str, reason: impl Into<String>) -> Error {
    Error::CheckpointRefused {
        id: id.to_string(),
        reason: reason.into(),
    }
}

pub(super) fn failed(id: &str, message: impl Into<String>) -> Error {
    Error::Checkpoint {
        id: id.to_string(),
        message: message.into(),
    }
}

/// criu, from the PATH.
pub(super) fn criu() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("criu"))
        .find(|p| p.is_file())
}

/// Whether an image name given to CreateContainer is a checkpoint archive's path.
pub(super) fn is_archive(image: &str) -> bool {
    Path::new(image).is_absolute() && Path::new(image).is_file()
}

fn rfc3339(nanos: i64) -> String {
    let at = std::time::UNIX_EPOCH + Duration::from_nanos(nanos.max(0) as u64);
    humantime::format_rfc3339_nanos(at).to_string()
}

/// What a dump is bounded by: CheckpointContainer's timeout, or a CRI deadline (CheckpointPod's).
#[derive(Debug, Clone, Copy)]
pub(super) enum Bound {
    Timeout(Duration),
    Deadline(tokio::time::Instant),
}

impl Bound {
    /// When the work must end.
    fn until(self, started: tokio::time::Instant) -> tokio::time::Instant {
        match self {
            Bound::Timeout(limit) => started + limit,
            Bound::Deadline(at) => at,
        }
    }

    /// The error for work still under way when the bound passed.
    fn passed(self, id: &str, doing: &str) -> Error {
        match self {
            Bound::Timeout(limit) => failed(
                id,
                format!("{doing} took longer than {} s", limit.as_secs()),
            ),
            Bound::Deadline(_) => Error::DeadlinePassed {
                what: format!("{doing} of container {id}"),
            },
        }
    }
}

/// Who holds a dumped container's cgroup frozen: the dump itself (CheckpointContainer, until its
/// rootfs diff is written), or its caller (CheckpointPod, which freezes every container first).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Freeze {
    Own,
    Held,
}

/// A running container checked dumpable, with its checkpoint under way (one at a time) until
/// dropped.
pub(super) struct Dumpable<'a> {
    pub r: Record,
    b: Bundle,
    spec: oci_spec::runtime::Spec,
    mon: MonitorConfig,
    criu: PathBuf,
    init: ProcessId,
    _one: Checkpointing<'a>,
}

impl Dumpable<'_> {
    /// Where its dump is made: in its bundle, never in the caller's directory.
    pub(super) fn work(&self) -> PathBuf {
        self.b.dir.join("checkpoint.tmp")
    }
}

impl ContainerService {
    pub async fn checkpoint(&self, id: &str, location: &str, timeout: i64) -> Result<(), Error> {
        let at = Path::new(location);
        if !at.is_absolute() || at.file_name().is_none() {
            return Err(invalid(
                "location",
                format!("{location:?} must be an absolute file path"),
            ));
        }
        if !at.parent().is_some_and(Path::is_dir) {
            return Err(invalid(
                "location",
                format!("{location:?}: its directory does not exist"),
            ));
        }
        let d = self.dumpable(id, None).await?;
        let id = d.r.id.as_str();
        let limit = if timeout > 0 {
            Duration::from_secs(timeout as u64)
        } else {
            DEFAULT_TIMEOUT
        };
        let work = d.work();
        let result = self.capture(&d, Freeze::Own, Bound::Timeout(limit)).await;
        let result = match result {
            Ok(()) => {
                let (work2, at2) = (work.clone(), at.to_path_buf());
                tokio::task::spawn_blocking(move || write_archive(&work2, &at2))
                    .await
                    .map_err(|e| failed(id, e.to_string()))?
                    .map_err(io_err(at))
            }
            Err(e) => Err(e),
        };
        let _ = tokio::fs::remove_dir_all(&work).await;
        result
    }

    /// The container `id` checked dumpable: running (and, given `pod`, of that pod), with its
    /// own PID namespace, no terminal, no user namespace, and criu installed.
    pub(super) async fn dumpable(
        &self,
        id: &str,
        pod: Option<(&str, &str)>,
    ) -> Result<Dumpable<'_>, Error> {
        let (r, b) = {
            let entry = self.entry(id)?;
            let r = entry.lock().await;
            Self::present(&r)?;
            if let Some((pod, field)) = pod
                && r.sandbox_id != pod
            {
                return Err(invalid(
                    field,
                    format!(
                        "container {} is in pod sandbox {}, not {pod}",
                        r.id, r.sandbox_id
                    ),
                ));
            }
            if r.state != ContainerState::Running {
                return Err(Error::WrongState {
                    id: r.id.clone(),
                    state: state_name(r.state),
                    want: "running",
                });
            }
            (r.clone(), self.bundle(&r.id))
        };
        let id = r.id.as_str();
        let one = Checkpointing::start(self, id)?;
        let mon_path = b.dir.join("monitor.json");
        let mon: MonitorConfig = atomic::read_json(&mon_path)
            .ok()
            .flatten()
            .ok_or_else(|| failed(id, format!("{} is unreadable", mon_path.display())))?;
        if mon.tty {
            return Err(refused(id, "it has a terminal"));
        }
        if !mon.new_pid_ns {
            return Err(refused(
                id,
                "it shares a PID namespace (only its own can be dumped)",
            ));
        }
        if mon.userns.is_some() {
            return Err(refused(id, "its pod has a user namespace"));
        }
        let Some(criu) = criu() else {
            return Err(refused(id, "criu is not installed (no criu in PATH)"));
        };
        let Some(init) = r.init else {
            return Err(failed(id, "no init process recorded"));
        };
        let spec_path = b.dir.join("config.json");
        let spec: oci_spec::runtime::Spec = atomic::read_json(&spec_path)
            .ok()
            .flatten()
            .ok_or_else(|| failed(id, format!("{} is unreadable", spec_path.display())))?;
        Ok(Dumpable {
            r,
            b,
            spec,
            mon,
            criu,
            init,
            _one: one,
        })
    }

    /// Dumps `d` into its work directory (made afresh): criu's images, the rootfs diff and the
    /// files a restore reads. What it leaves on failure is the caller's to remove.
    pub(super) async fn capture(
        &self,
        d: &Dumpable<'_>,
        freeze: Freeze,
        bound: Bound,
    ) -> Result<(), Error> {
        let work = d.work();
        let _ = tokio::fs::remove_dir_all(&work).await;
        let images = work.join("checkpoint");
        tokio::fs::create_dir_all(&images)
            .await
            .map_err(io_err(&images))?;
        self.dump(d, &work, freeze, bound).await
    }

    async fn dump(
        &self,
        d: &Dumpable<'_>,
        work: &Path,
        freeze: Freeze,
        bound: Bound,
    ) -> Result<(), Error> {
        let started = tokio::time::Instant::now();
        let (r, id) = (&d.r, d.r.id.as_str());
        let (mut cmd, ext, stdio) = dump_command(d, work)?;
        // The recorded init must still be the process the record names.
        if !d.init.alive() {
            return Err(Error::WrongState {
                id: id.into(),
                state: "exited",
                want: "running",
            });
        }
        // Frozen from before the dump until the rootfs diff is written: running in between,
        // the container could change a file CRIU recorded (a size), and the restore refuses it.
        // CRIU, told the cgroup, thaws it while it works and leaves it as it found it.
        let mut frozen = None;
        if let Some(cg) = &r.cgroup {
            cmd.arg("--freeze-cgroup").arg(&cg.path);
            if freeze == Freeze::Own {
                let f = Frozen::freeze(cg, bound.until(started))
                    .await
                    .map_err(|e| {
                        failed(id, format!("freezing cgroup {}: {e}", cg.path.display()))
                    })?;
                frozen = Some(f);
            }
        }
        run_dump(&mut cmd, id, &d.criu, work, bound.until(started), bound).await?;

        // CRIU (3.17 checked) leaves a cgroup frozen as it found it; one that thawed it would
        // let the diff below differ from the images, so no archive then.
        if let Some(cg) = &r.cgroup
            && !cg.is_frozen()
        {
            return Err(failed(
                id,
                "criu left its cgroup thawed: the rootfs cannot be taken as the dump saw it",
            ));
        }
        // The writable layer's changes, and what the container was made from.
        let upper = d.b.layer.join("upper");
        let (u, to) = (upper.clone(), work.join("rootfs-diff.tar"));
        let room = diff_room(work);
        let until = bound.until(started);
        let deleted = tokio::task::spawn_blocking(move || {
            std::fs::File::create(&to).and_then(|f| {
                let bounded = Bounded::new(f, until);
                crate::snapshot::diff::write_diff(&u, std::io::BufWriter::new(bounded), room)
            })
        })
        .await
        .map_err(|e| failed(id, e.to_string()))?
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::TimedOut => bound.passed(id, "writing the rootfs diff"),
            _ => io_err(&upper)(e),
        })?;
        drop(frozen);
        write_dump_files(d, work, &deleted, &ext, &stdio)?;
        // Sealed last, over everything a restore will read and hand criu.
        let (key, w) = (self.seal_key()?, work.to_path_buf());
        tokio::task::spawn_blocking(move || super::seal::seal(&w, &key))
            .await
            .map_err(|e| failed(id, e.to_string()))?
    }
}

/// criu's dump command for `d` into `work`, with the mounts and network namespace it is to take
/// as external, and the stdio pipes a restore replaces.
fn dump_command(
    d: &Dumpable<'_>,
    work: &Path,
) -> Result<(tokio::process::Command, Externals, Vec<String>), Error> {
    let pid = d.init.pid;
    // Mounts whose source lies outside the container: named by mount point, so a restore
    // can give the new container's own.
    let mut ext = Externals::default();
    for m in d.spec.mounts().as_deref().unwrap_or_default() {
        let bind = m.typ().as_deref() == Some("bind")
            || m.options()
                .as_ref()
                .is_some_and(|o| o.iter().any(|x| x == "bind" || x == "rbind"));
        if bind || m.typ().as_deref() == Some("cgroup2") {
            ext.mounts.push(m.destination().display().to_string());
        }
    }
    // A masked file is the host's /dev/null (see runtime::init::paths), whose file system the
    // container does not hold: external too, and a restore masks with /dev/null again.
    ext.mounts.extend(masks_of_host_null(&d.spec, pid));
    let mut cmd = tokio::process::Command::new(&d.criu);
    cmd.arg("dump")
        .args(["--tree", &pid.to_string()])
        .arg("--images-dir")
        .arg(work.join("checkpoint"))
        .args(["--leave-running", "--manage-cgroups=ignore"])
        .arg("--log-file")
        .arg(work.join("dump.log"))
        .arg("-v4");
    for m in &ext.mounts {
        cmd.args(["--external", &format!("mnt[{m}]:{m}")]);
    }
    if d.mon.join.iter().any(|n| n.kind == "net") {
        let ns = format!("/proc/{pid}/ns/net");
        let inode = std::fs::metadata(&ns)
            .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
            .map_err(io_err(Path::new(&ns)))?;
        cmd.args(["--external", &format!("net[{inode}]:{NET_KEY}")]);
        ext.net = Some(NET_KEY.into());
    }
    // The stdio pipes, which a restore replaces with the new container's own.
    let stdio: Vec<String> = (0..3)
        .map(|fd| {
            std::fs::read_link(format!("/proc/{pid}/fd/{fd}"))
                .map(|l| l.display().to_string())
                .unwrap_or_default()
        })
        .collect();
    cmd.stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    Ok((cmd, ext, stdio))
}

/// The small files beside criu's images: what the container was made from, its spec, what its
/// layer deleted, its externals and stdio.
fn write_dump_files(
    d: &Dumpable<'_>,
    work: &Path,
    deleted: &[String],
    ext: &Externals,
    stdio: &[String],
) -> Result<(), Error> {
    let r = &d.r;
    let meta = r.config.metadata.clone().unwrap_or_default();
    let config = ConfigDump {
        id: r.id.clone(),
        name: meta.name,
        rootfs_image: r
            .config
            .image
            .as_ref()
            .map(|i| i.image.clone())
            .unwrap_or_default(),
        rootfs_image_ref: r.image_id.clone(),
        rootfs_image_name: r.image_ref.clone(),
        runtime: "crius".into(),
        created_time: rfc3339(r.created_at),
        checkpointed_time: rfc3339(now_nanos()),
    };
    fn write_json<T: Serialize + ?Sized>(dir: &Path, name: &str, v: &T) -> Result<(), Error> {
        let p = dir.join(name);
        let bytes = serde_json::to_vec_pretty(v).map_err(|e| Error::Io {
            path: p.clone(),
            source: e.into(),
        })?;
        std::fs::write(&p, bytes).map_err(io_err(&p))
    }
    write_json(work, "config.dump", &config)?;
    write_json(work, "spec.dump", &d.spec)?;
    write_json(work, "deleted.files", deleted)?;
    write_json(work, "crius.json", ext)?;
    write_json(work, "descriptors.json", stdio)?;
    Ok(())
}

/// A writer that fails (`TimedOut`) once `until` has passed, so a long write stops at a deadline.
pub(super) struct Bounded<W> {
    inner: W,
    until: tokio::time::Instant,
}

impl<W> Bounded<W> {
    pub(super) fn new(inner: W, until: tokio::time::Instant) -> Bounded<W> {
        Bounded { inner, until }
    }

    pub(super) fn into_inner(self) -> W {
        self.inner
    }
}

impl<W: std::io::Write> std::io::Write for Bounded<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if tokio::time::Instant::now() >= self.until {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the deadline passed",
            ));
        }
        self.inner.write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// The archive: every file of `work` in a tar at `at`, written atomically.
fn write_archive(work: &Path, at: &Path) -> std::io::Result<()> {
    crate::atomic::write_with(at, 0o644, |f| {
        let out = archive_into(work, std::io::BufWriter::new(f))?;
        out.into_inner().map_err(|e| e.into_error()).map(drop)
    })
}

/// Every file of `work` as a tar written to `out`, flushed. The small files go first, so a
/// restore finds `config.dump` without reading past the CRIU images.
pub(super) fn archive_into<W: std::io::Write>(work: &Path, out: W) -> std::io::Result<W> {
    let mut names: Vec<_> = std::fs::read_dir(work)?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<Result<_, _>>()?;
    names.sort_by_key(|n| (work.join(n).is_dir(), n.clone()));
    let mut tar = tar::Builder::new(out);
    tar.follow_symlinks(false);
    for n in &names {
        let p = work.join(n);
        if p.is_dir() {
            tar.append_dir_all(n, &p)?;
        } else {
            tar.append_path_with_name(&p, n)?;
        }
    }
    let mut out = tar.into_inner()?;
    out.flush()?;
    Ok(out)
}

/// The spec's masked paths that are bound files in the container (the host's `/dev/null`), from
/// its mount table: a file's mount has a root below its file system's, while a masked directory
/// is a tmpfs of its own (root `/`) and a masked path that does not exist is no mount.
fn masks_of_host_null(spec: &oci_spec::runtime::Spec, pid: i32) -> Vec<String> {
    let masked = spec
        .linux()
        .as_ref()
        .and_then(|l| l.masked_paths().clone())
        .unwrap_or_default();
    let Ok(table) = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")) else {
        return Vec::new();
    };
    table
        .lines()
        .filter_map(|line| {
            let mut fields = line.split(' ');
            let root = fields.nth(3)?;
            let point = fields.next()?;
            (root != "/").then_some(point)
        })
        .filter(|point| masked.iter().any(|m| m == point))
        .map(str::to_string)
        .collect()
}

/// Runs `criu dump` until `until`; its errors, from its log when it wrote one. A dump still
/// running then is killed and waited for, so nothing of criu's acts on the container after.
async fn run_dump(
    cmd: &mut tokio::process::Command,
    id: &str,
    criu: &Path,
    work: &Path,
    until: tokio::time::Instant,
    bound: Bound,
) -> Result<(), Error> {
    use tokio::io::AsyncReadExt;
    let mut child = cmd
        .spawn()
        .map_err(|e| failed(id, format!("running {}: {e}", criu.display())))?;
    // Read beside the wait: criu must never block on a full pipe.
    let stderr = child.stderr.take().map(|mut e| {
        tokio::spawn(async move {
            let mut said = Vec::new();
            let _ = (&mut e).take(64 << 10).read_to_end(&mut said).await;
            said
        })
    });
    let status = match tokio::time::timeout_at(until, child.wait()).await {
        Err(_) => {
            if let Err(e) = child.kill().await {
                tracing::warn!(id, error = %e, "killing criu dump past its bound");
            }
            return Err(bound.passed(id, "criu dump"));
        }
        Ok(status) => status.map_err(|e| failed(id, format!("criu dump: {e}")))?,
    };
    if !status.success() {
        let log = work.join("dump.log");
        let said = match stderr {
            Some(t) => t.await.unwrap_or_default(),
            None => Vec::new(),
        };
        let errors = if log.exists() {
            runtime::monitor::criu_errors(&log)
        } else {
            String::from_utf8_lossy(&said).trim().to_string()
        };
        return Err(failed(id, format!("criu dump ({status}): {errors}")));
    }
    Ok(())
}

/// How many bytes of the container's files the diff may take: half of what the work directory's
/// file system has free beyond a twentieth of its size (the archive copies the diff once more),
/// so a container's sparse or huge files fail the checkpoint instead of filling that disk.
fn diff_room(work: &Path) -> u64 {
    match nix::sys::statvfs::statvfs(work) {
        Ok(st) => {
            let unit = st.fragment_size();
            let free = st.blocks_available().saturating_mul(unit);
            let reserve = st.blocks().saturating_mul(unit) / 20;
            free.saturating_sub(reserve) / 2
        }
        Err(_) => 0,
    }
}

/// A container's checkpoint under way, until dropped.
struct Checkpointing<'a>(&'a ContainerService, String);

impl<'a> Checkpointing<'a> {
    fn start(svc: &'a ContainerService, id: &str) -> Result<Checkpointing<'a>, Error> {
        let mut on = svc
            .inner
            .checkpointing
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if !on.insert(id.to_string()) {
            return Err(refused(id, "a checkpoint of it is being taken"));
        }
        Ok(Checkpointing(svc, id.to_string()))
    }
}

impl Drop for Checkpointing<'_> {
    fn drop(&mut self) {
        self.0
            .inner
            .checkpointing
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.1);
    }
}

/// A container's cgroup frozen (cgroup v2's `cgroup.freeze`) until dropped.
pub(super) struct Frozen(Cgroup);

impl Frozen {
    /// Freezes `cgroup`, waiting until every process in it is frozen: at most 10 s, and not past
    /// `until` (thawed again then).
    pub(super) async fn freeze(
        cgroup: &Cgroup,
        until: tokio::time::Instant,
    ) -> std::io::Result<Frozen> {
        cgroup.freeze(true)?;
        let frozen = Frozen(cgroup.clone());
        let started = std::time::Instant::now();
        while !frozen.0.is_frozen() {
            if started.elapsed() > Duration::from_secs(10) {
                return Err(std::io::Error::other("not frozen after 10 s"));
            }
            if tokio::time::Instant::now() >= until {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "not frozen by the deadline",
                ));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok(frozen)
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        if let Err(e) = self.0.freeze(false) {
            tracing::warn!(error = %e, "thawing after a checkpoint");
        }
    }
}
