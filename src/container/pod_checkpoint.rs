//! CheckpointPod: several running containers of one pod captured as one cut. Every selected
//! container's cgroup is frozen before any is dumped, and all are thawed once the last dump and
//! rootfs diff are taken, on an error, or at the call's deadline (a dump still running then is
//! killed and waited for first). Each dump then becomes an archive in CheckpointContainer's
//! format, and `pod.json` names them by container name: the layout RestorePod reads
//! (`pod_restore`). The caller's directory is opened once, without following a link, checked
//! empty, and everything is made relative to that handle with `O_EXCL`, never outside it; what
//! a failed call made there is removed, the directory itself never. Uses `checkpoint`'s dumps.

use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Mutex;

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::stat::Mode;
use tokio::time::Instant;

use super::checkpoint::{Bound, Bounded, Dumpable, Freeze, Frozen, archive_into, failed, refused};
use super::{ContainerService, Deserialize, Error, Path, PathBuf, Serialize, invalid, io_err};

/// The pod checkpoint's manifest, written last: a directory with it holds a whole checkpoint.
pub(super) const MANIFEST: &str = "pod.json";
/// The version of the layout `Manifest` describes.
pub(super) const LAYOUT_VERSION: u32 = 1;
/// The most containers one pod checkpoint holds.
pub(super) const MAX_CONTAINERS: usize = 256;
/// The field CheckpointPod's directory comes in.
const FIELD: &str = "output_path";

/// `pod.json`: which archive holds which container, by the container's name.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct Manifest {
    pub version: u32,
    pub runtime: String,
    /// The pod checkpointed (for whoever reads the directory; a restore takes its new config).
    pub pod: PodName,
    pub checkpointed_time: String,
    pub containers: Vec<ManifestEntry>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PodName {
    pub name: String,
    pub namespace: String,
    pub uid: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ManifestEntry {
    /// The container's metadata name, which RestorePod matches configs by.
    pub name: String,
    /// Its archive: always `archive_name` of its place in the list (a restore refuses others).
    pub archive: String,
    /// The image it was made of, as its config named it.
    pub image: String,
}

/// The archive of the `i`-th container of a pod checkpoint.
pub(super) fn archive_name(i: usize) -> String {
    format!("container-{i}.tar")
}

/// Whether `path` is a symbolic link itself (for a refusal's words only).
pub(super) fn is_link(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink())
}

/// The caller's directory, opened once; the names made in it so far.
struct OutputDir {
    path: PathBuf,
    fd: OwnedFd,
    made: Mutex<Vec<String>>,
}

impl OutputDir {
    /// Opens `path`, which must be an existing empty directory and not a link.
    fn open(path: &Path) -> Result<OutputDir, Error> {
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let shown = path.display();
        let fd = nix::fcntl::open(path, flags, Mode::empty()).map_err(|e| match e {
            Errno::ENOENT => invalid(FIELD, format!("{shown} does not exist")),
            // O_DIRECTORY answers ENOTDIR for a link too.
            Errno::ELOOP | Errno::ENOTDIR if is_link(path) => invalid(
                FIELD,
                format!("{shown} is a symbolic link (never followed)"),
            ),
            Errno::ENOTDIR => invalid(FIELD, format!("{shown} is not a directory")),
            e => io_err(path)(e.into()),
        })?;
        let mut dir = nix::dir::Dir::openat(fd.as_fd(), ".", flags, Mode::empty())
            .map_err(|e| io_err(path)(e.into()))?;
        for entry in dir.iter() {
            let entry = entry.map_err(|e| io_err(path)(e.into()))?;
            let name = entry.file_name().to_bytes();
            if name != b"." && name != b".." {
                return Err(invalid(
                    FIELD,
                    format!(
                        "{shown} is not empty (it holds {:?})",
                        String::from_utf8_lossy(name)
                    ),
                ));
            }
        }
        Ok(OutputDir {
            path: path.to_path_buf(),
            fd,
            made: Mutex::new(Vec::new()),
        })
    }

    fn note(&self, name: &str) {
        self.made
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(name.to_string());
    }

    /// Writes `name` whole or not at all: a temporary name made with `O_EXCL` (never through
    /// a link), filled by `fill` until `until`, synced, then renamed.
    fn write(
        &self,
        name: &str,
        until: Instant,
        fill: impl FnOnce(&mut Bounded<std::io::BufWriter<std::fs::File>>) -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        let tmp = format!(".{name}.tmp");
        let flags =
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        // Only root reads it: it holds the processes' memory.
        let fd = nix::fcntl::openat(
            self.fd.as_fd(),
            tmp.as_str(),
            flags,
            Mode::from_bits_truncate(0o600),
        )?;
        // Made by this call (O_EXCL): a failure removes it.
        self.note(&tmp);
        let mut out = Bounded::new(std::io::BufWriter::new(std::fs::File::from(fd)), until);
        fill(&mut out)?;
        out.flush()?;
        let file = out.into_inner().into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        self.note(name);
        nix::fcntl::renameat(self.fd.as_fd(), tmp.as_str(), self.fd.as_fd(), name)?;
        Ok(())
    }

    /// Makes what was written durable (the renames).
    fn sync(&self) -> std::io::Result<()> {
        Ok(nix::unistd::fsync(self.fd.as_fd())?)
    }

    /// Removes every name this call made (the directory stays).
    fn remove_made(&self) {
        let made = std::mem::take(&mut *self.made.lock().unwrap_or_else(|p| p.into_inner()));
        for name in made {
            match nix::unistd::unlinkat(
                self.fd.as_fd(),
                name.as_str(),
                nix::unistd::UnlinkatFlags::NoRemoveDir,
            ) {
                Ok(()) | Err(Errno::ENOENT) => {}
                Err(e) => tracing::warn!(
                    dir = %self.path.display(), name, error = %e,
                    "removing a failed pod checkpoint's file"
                ),
            }
        }
        let _ = self.sync();
    }
}

impl ContainerService {
    /// CheckpointPod of the containers `ids` of pod `pod` into the empty directory `output`,
    /// by `deadline`.
    pub async fn checkpoint_pod(
        &self,
        pod: &str,
        ids: &[String],
        output: &Path,
        deadline: Instant,
    ) -> Result<(), Error> {
        let sandbox = self.inner.sandboxes.get(pod).await?;
        if !sandbox.ready {
            return Err(crate::sandbox::Error::NotReady { id: sandbox.id }.into());
        }
        let o = output.to_path_buf();
        let out = std::sync::Arc::new(
            tokio::task::spawn_blocking(move || OutputDir::open(&o))
                .await
                .map_err(|e| io_err(output)(std::io::Error::other(e)))??,
        );
        // Every container named is checked (of this pod, running, dumpable) before any is
        // refused for what the node lacks.
        let mut dumps: Vec<Dumpable<'_>> = Vec::with_capacity(ids.len());
        for (i, id) in ids.iter().enumerate() {
            let field = format!("container_ids[{i}]");
            dumps.push(
                self.dumpable(id, Some((sandbox.id.as_str(), field.as_str())))
                    .await?,
            );
        }
        for (i, d) in dumps.iter().enumerate() {
            if d.r.cgroup.is_none() {
                return Err(refused(
                    &d.r.id,
                    "it has no cgroup v2 to freeze (a pod checkpoint pauses every container first)",
                ));
            }
            if let Some(j) = dumps[..i].iter().position(|o| name_of(o) == name_of(d)) {
                return Err(invalid(
                    format!("container_ids[{i}]"),
                    format!(
                        "container {} has the name {:?} of container_ids[{j}]: a pod checkpoint names containers by name",
                        d.r.id,
                        name_of(d)
                    ),
                ));
            }
        }
        let meta = sandbox.config.metadata.clone().unwrap_or_default();
        let pod_name = PodName {
            name: meta.name,
            namespace: meta.namespace,
            uid: meta.uid,
        };
        let result = match self.capture_all(&dumps, deadline).await {
            Ok(()) => write_all(&out, &dumps, pod_name, deadline).await,
            Err(e) => Err(e),
        };
        for d in &dumps {
            let _ = tokio::fs::remove_dir_all(d.work()).await;
        }
        // Finished past the deadline, the caller has its error already: nothing may stay.
        let result = result.and_then(|()| {
            if Instant::now() >= deadline {
                Err(Error::DeadlinePassed {
                    what: format!("the checkpoint of pod sandbox {}", sandbox.id),
                })
            } else {
                Ok(())
            }
        });
        if result.is_err() {
            let out = out.clone();
            let _ = tokio::task::spawn_blocking(move || out.remove_made()).await;
        }
        result
    }

    /// Freezes every container of `dumps`, then dumps each while all stay frozen; all are
    /// thawed when this returns, whatever it returns.
    async fn capture_all(&self, dumps: &[Dumpable<'_>], deadline: Instant) -> Result<(), Error> {
        let mut frozen = Vec::with_capacity(dumps.len());
        for d in dumps {
            let Some(cg) = &d.r.cgroup else {
                return Err(refused(&d.r.id, "it has no cgroup v2 to freeze"));
            };
            let f = Frozen::freeze(cg, deadline).await.map_err(|e| {
                if e.kind() == std::io::ErrorKind::TimedOut {
                    Error::DeadlinePassed {
                        what: format!("pausing container {}", d.r.id),
                    }
                } else {
                    failed(
                        &d.r.id,
                        format!("freezing cgroup {}: {e}", cg.path.display()),
                    )
                }
            })?;
            frozen.push(f);
        }
        for d in dumps {
            self.capture(d, Freeze::Held, Bound::Deadline(deadline))
                .await?;
        }
        drop(frozen);
        Ok(())
    }
}

fn name_of<'a>(d: &'a Dumpable<'_>) -> &'a str {
    d.r.config
        .metadata
        .as_ref()
        .map(|m| m.name.as_str())
        .unwrap_or_default()
}

/// Each dump as its archive in `out`, then the manifest naming them.
async fn write_all(
    out: &std::sync::Arc<OutputDir>,
    dumps: &[Dumpable<'_>],
    pod: PodName,
    deadline: Instant,
) -> Result<(), Error> {
    let mut entries = Vec::with_capacity(dumps.len());
    for (i, d) in dumps.iter().enumerate() {
        let name = archive_name(i);
        let (o, work, n) = (out.clone(), d.work(), name.clone());
        tokio::task::spawn_blocking(move || {
            o.write(&n, deadline, |w| archive_into(&work, w).map(drop))
        })
        .await
        .map_err(|e| failed(&d.r.id, e.to_string()))?
        .map_err(|e| written(out, &name, &d.r.id, e))?;
        entries.push(ManifestEntry {
            name: name_of(d).to_string(),
            archive: name,
            image: d
                .r
                .config
                .image
                .as_ref()
                .map(|i| i.image.clone())
                .unwrap_or_default(),
        });
    }
    let manifest = Manifest {
        version: LAYOUT_VERSION,
        runtime: "crius".into(),
        pod,
        checkpointed_time: humantime::format_rfc3339_seconds(std::time::SystemTime::now())
            .to_string(),
        containers: entries,
    };
    let text = serde_json::to_vec_pretty(&manifest)
        .map_err(|e| io_err(&out.path.join(MANIFEST))(e.into()))?;
    let o = out.clone();
    tokio::task::spawn_blocking(move || {
        o.write(MANIFEST, deadline, |w| w.write_all(&text))?;
        o.sync()
    })
    .await
    .map_err(|e| io_err(&out.path)(std::io::Error::other(e)))?
    .map_err(|e| written(out, MANIFEST, "", e))
}

/// A write into the caller's directory that failed: at the deadline, or with its path.
fn written(out: &OutputDir, name: &str, id: &str, e: std::io::Error) -> Error {
    if e.kind() == std::io::ErrorKind::TimedOut {
        let of = if id.is_empty() {
            String::new()
        } else {
            format!(" of container {id}")
        };
        Error::DeadlinePassed {
            what: format!("writing {name}{of}"),
        }
    } else {
        io_err(&out.path.join(name))(e)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn the_output_must_be_an_empty_directory_not_a_link() {
        let d = tempfile::tempdir().unwrap();
        let message = |p: &Path| OutputDir::open(p).err().unwrap().to_string();
        let m = message(&d.path().join("gone"));
        assert!(
            m.starts_with("output_path") && m.contains("does not exist"),
            "{m}"
        );
        std::fs::write(d.path().join("file"), b"x").unwrap();
        let m = message(&d.path().join("file"));
        assert!(m.contains("not a directory"), "{m}");
        std::fs::create_dir(d.path().join("real")).unwrap();
        std::os::unix::fs::symlink("real", d.path().join("link")).unwrap();
        let m = message(&d.path().join("link"));
        assert!(m.contains("symbolic link"), "{m}");
        let m = message(d.path());
        assert!(m.contains("not empty"), "{m}");
        OutputDir::open(&d.path().join("real")).unwrap();
    }

    #[test]
    fn writes_go_to_the_opened_directory_and_a_failure_leaves_nothing() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("out");
        std::fs::create_dir(&dir).unwrap();
        let out = OutputDir::open(&dir).unwrap();
        // The path is swapped for a link elsewhere after the open: writes still land in the
        // directory opened.
        let moved = d.path().join("moved");
        std::fs::rename(&dir, &moved).unwrap();
        let elsewhere = d.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &dir).unwrap();
        let later = Instant::now() + std::time::Duration::from_secs(60);
        out.write("a.tar", later, |w| w.write_all(b"archive"))
            .unwrap();
        assert_eq!(std::fs::read(moved.join("a.tar")).unwrap(), b"archive");
        assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(moved.join("a.tar"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        // An existing name is never written over.
        std::fs::write(moved.join(".b.tar.tmp"), b"theirs").unwrap();
        assert!(out.write("b.tar", later, |w| w.write_all(b"x")).is_err());
        // Past its deadline a write fails, and a removal takes all this call made.
        let past = Instant::now();
        let e = out
            .write("c.tar", past, |w| w.write_all(&[0; 1 << 20]))
            .unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::TimedOut);
        out.remove_made();
        let mut left: Vec<_> = std::fs::read_dir(&moved)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        // The caller's file with a name this call tried stays: only what this call made goes.
        assert_eq!(left, [".b.tar.tmp"]);
    }

    #[test]
    fn the_manifest_refuses_what_it_does_not_know() {
        let m = Manifest {
            version: LAYOUT_VERSION,
            runtime: "crius".into(),
            pod: PodName::default(),
            checkpointed_time: String::new(),
            containers: vec![ManifestEntry {
                name: "a".into(),
                archive: archive_name(0),
                image: "busybox".into(),
            }],
        };
        let text = serde_json::to_string(&m).unwrap();
        let back: Manifest = serde_json::from_str(&text).unwrap();
        assert_eq!(back.containers[0].archive, "container-0.tar");
        let extra = text.replacen("{", "{\"devices\":[],", 1);
        assert!(serde_json::from_str::<Manifest>(&extra).is_err());
    }
}
