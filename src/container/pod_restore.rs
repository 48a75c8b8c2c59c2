//! RestorePod's side in `container`: a pod checkpoint (`pod_checkpoint`'s layout) read as
//! hostile input, and its containers made from it. Restoring is gated by the same key as
//! restore through CreateContainer (`checkpoint.restore_from_archive`), and criu's presence is
//! checked before anything is read. The directory is opened once without following a link, and
//! every member is opened beneath that handle (`restore::open_member_at`: no link, regular
//! files only, never blocking, size-bounded): `pod.json` at most 1 MiB, the archives together at
//! most what the state directory has free. The manifest decides nothing on its own: its names
//! must be the configs' names, each archive's name is the one its place gives, and each archive
//! is unpacked once by the confined unpacker into a private directory, as restore through
//! CreateContainer does. A config's image must be the image its checkpoint was made of (looked up,
//! never tagged), and its process the checkpointed one (`process_match`).

use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::stat::Mode;

use super::checkpoint::criu;
use super::config::ContainerConfig;
use super::create::Restoring;
use super::pod_checkpoint::{
    LAYOUT_VERSION, MANIFEST, MAX_CONTAINERS, Manifest, archive_name, is_link,
};
use super::restore::{self, RESTORE_KEY, Unpacked};
use super::{ContainerService, Error, Path, PathBuf, image, invalid};

/// The most `pod.json` may hold.
const MANIFEST_MAX: u64 = 1 << 20;

/// A pod checkpoint opened for RestorePod: its directory's handle and its manifest.
pub struct PodCheckpoint {
    path: PathBuf,
    dir: Arc<OwnedFd>,
    manifest: Manifest,
}

/// A container of a pod checkpoint ready to be made: its archive unpacked, its image found.
pub struct PreparedRestore {
    /// The container's name (its config's metadata name).
    pub name: String,
    image: Arc<image::Image>,
    unpacked: Unpacked,
}

fn bad(path: &Path, reason: impl Into<String>) -> Error {
    Error::BadPodCheckpoint {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

/// An archive's refusal said as the pod checkpoint's (its field is `checkpoint_path`).
fn of_pod(e: Error) -> Error {
    match e {
        Error::BadArchive { archive, reason } => Error::BadPodCheckpoint {
            path: archive,
            reason,
        },
        e => e,
    }
}

impl PodCheckpoint {
    /// The containers it holds, by name, in its order.
    pub fn names(&self) -> Vec<&str> {
        self.manifest
            .containers
            .iter()
            .map(|c| c.name.as_str())
            .collect()
    }

    /// Opens the directory `path` (not through a link) and reads its manifest.
    fn open(path: &Path) -> Result<PodCheckpoint, Error> {
        let flags = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let dir = nix::fcntl::open(path, flags, Mode::empty()).map_err(|e| match e {
            Errno::ENOENT => bad(path, "it does not exist"),
            Errno::ELOOP | Errno::ENOTDIR if is_link(path) => {
                bad(path, "it is a symbolic link (never followed)")
            }
            Errno::ENOTDIR => bad(path, "it is not a directory"),
            e => bad(path, std::io::Error::from(e).to_string()),
        })?;
        let f = restore::open_member_at(path, dir.as_fd(), MANIFEST, Some(MANIFEST_MAX))
            .map_err(of_pod)?;
        let mut text = Vec::new();
        f.take(MANIFEST_MAX + 1)
            .read_to_end(&mut text)
            .map_err(|e| bad(path, format!("{MANIFEST}: {e}")))?;
        if text.len() as u64 > MANIFEST_MAX {
            return Err(bad(path, format!("{MANIFEST}: grew while read")));
        }
        let manifest: Manifest =
            serde_json::from_slice(&text).map_err(|e| bad(path, format!("{MANIFEST}: {e}")))?;
        check_manifest(path, &manifest)?;
        Ok(PodCheckpoint {
            path: path.to_path_buf(),
            dir: Arc::new(dir),
            manifest,
        })
    }
}

/// What a manifest must be: this layout, 1 to `MAX_CONTAINERS` containers with unique,
/// non-empty names, each archive named by its place.
fn check_manifest(path: &Path, m: &Manifest) -> Result<(), Error> {
    if m.version != LAYOUT_VERSION {
        return Err(bad(
            path,
            format!(
                "{MANIFEST}: layout version {}, this crius reads {LAYOUT_VERSION}",
                m.version
            ),
        ));
    }
    if m.containers.is_empty() || m.containers.len() > MAX_CONTAINERS {
        return Err(bad(
            path,
            format!(
                "{MANIFEST}: {} containers (1 to {MAX_CONTAINERS})",
                m.containers.len()
            ),
        ));
    }
    let mut names = std::collections::HashSet::new();
    for (i, c) in m.containers.iter().enumerate() {
        if c.name.is_empty() || c.name.len() > 253 || c.name.contains(['\0', '\n']) {
            return Err(bad(
                path,
                format!("{MANIFEST}: containers[{i}]: a bad name"),
            ));
        }
        if !names.insert(c.name.as_str()) {
            return Err(bad(
                path,
                format!("{MANIFEST}: containers[{i}]: the name {:?} again", c.name),
            ));
        }
        if c.archive != archive_name(i) {
            return Err(bad(
                path,
                format!(
                    "{MANIFEST}: containers[{i}]: its archive must be {}",
                    archive_name(i)
                ),
            ));
        }
    }
    Ok(())
}

/// How many bytes of archives the state directory's file system may take in: what it has free
/// beyond a twentieth of its size.
fn room(dir: &Path) -> u64 {
    match nix::sys::statvfs::statvfs(dir) {
        Ok(st) => {
            let unit = st.fragment_size();
            let free = st.blocks_available().saturating_mul(unit);
            free.saturating_sub(st.blocks().saturating_mul(unit) / 20)
        }
        Err(_) => 0,
    }
}

impl ContainerService {
    /// RestorePod's checks before its checkpoint is read (restore on, criu installed), then the
    /// directory opened and its manifest read.
    pub async fn open_pod_checkpoint(&self, path: &Path) -> Result<PodCheckpoint, Error> {
        if self.inner.restore_dir.is_none() {
            return Err(Error::PodRestoreRefused {
                path: path.to_path_buf(),
                reason: format!(
                    "restoring from checkpoints is off (set {RESTORE_KEY} = true in the daemon's config)"
                ),
            });
        }
        if criu().is_none() {
            return Err(Error::PodRestoreRefused {
                path: path.to_path_buf(),
                reason: "criu is not installed (no criu in PATH)".into(),
            });
        }
        let p = path.to_path_buf();
        tokio::task::spawn_blocking(move || PodCheckpoint::open(&p))
            .await
            .map_err(|e| bad(path, e.to_string()))?
    }

    /// Each config's container of `cp`, matched by name, unpacked and checked against its
    /// config (image, no terminal), in the configs' order. The names must be the checkpoint's.
    pub async fn prepare_restores(
        &self,
        cp: &PodCheckpoint,
        configs: &[ContainerConfig],
    ) -> Result<Vec<PreparedRestore>, Error> {
        let parent = self
            .inner
            .restore_dir
            .clone()
            .ok_or_else(|| bad(&cp.path, "restoring is off"))?;
        let name_of = |c: &ContainerConfig| {
            c.metadata
                .as_ref()
                .map(|m| m.name.clone())
                .unwrap_or_default()
        };
        let asked: std::collections::BTreeSet<String> = configs.iter().map(name_of).collect();
        let held: std::collections::BTreeSet<String> =
            cp.names().into_iter().map(str::to_string).collect();
        if asked != held {
            return Err(invalid(
                "container_configs",
                format!(
                    "the names {:?} are not the checkpoint's {:?}",
                    asked.iter().collect::<Vec<_>>(),
                    held.iter().collect::<Vec<_>>()
                ),
            ));
        }
        let p = parent.clone();
        let mut free = tokio::task::spawn_blocking(move || {
            let _ = std::fs::create_dir_all(&p);
            room(&p)
        })
        .await
        .unwrap_or(0);
        let mut out = Vec::with_capacity(configs.len());
        for (i, config) in configs.iter().enumerate() {
            let name = name_of(config);
            if config.tty {
                return Err(invalid(
                    format!("container_configs[{i}].tty"),
                    "a container with a terminal cannot be restored",
                ));
            }
            let wanted = config
                .image
                .as_ref()
                .map(|i| i.image.clone())
                .unwrap_or_default();
            if wanted.is_empty() {
                return Err(invalid(
                    format!("container_configs[{i}].image.image"),
                    "is required",
                ));
            }
            let image = self
                .inner
                .images
                .lookup(&wanted)?
                .ok_or_else(|| Error::ImageNotFound {
                    image: wanted.clone(),
                })?;
            let place = cp.names().iter().position(|n| *n == name).unwrap_or(0);
            let (unpacked, dump, size) = self.unpack_member(cp, place, &parent, free).await?;
            free = free.saturating_sub(size);
            let made_of = self.dump_image(unpacked.archive(), &dump)?;
            if made_of.record.id != image.record.id {
                return Err(invalid(
                    format!("container_configs[{i}].image.image"),
                    format!(
                        "{wanted} is image {}, but the checkpoint of {name:?} was made of {} ({})",
                        image.record.id, dump.rootfs_image, made_of.record.id
                    ),
                ));
            }
            out.push(PreparedRestore {
                name,
                image,
                unpacked,
            });
        }
        Ok(out)
    }

    /// The archive of the checkpoint's `place`-th container, at most `room` bytes, unpacked
    /// below `parent`; its `config.dump` and size.
    async fn unpack_member(
        &self,
        cp: &PodCheckpoint,
        place: usize,
        parent: &Path,
        room: u64,
    ) -> Result<(Unpacked, super::checkpoint::ConfigDump, u64), Error> {
        let member = archive_name(place);
        let shown = cp.path.join(&member);
        let (dir, parent) = (cp.dir.clone(), parent.to_path_buf());
        let (s, key) = (shown.clone(), self.seal_key().map_err(of_pod)?);
        tokio::task::spawn_blocking(move || {
            let f = restore::open_member_at(&s, dir.as_fd(), &member, None)?;
            let size = f.metadata().map(|m| m.len()).unwrap_or(u64::MAX);
            if size > room {
                return Err(restore::bad(
                    &s,
                    format!("{size} bytes, more than the {room} the state directory has free"),
                ));
            }
            let unpacked = restore::unpack_into(f, restore::private_dir(&s, &parent)?, &key)?;
            let dir = unpacked
                .dir()
                .ok_or_else(|| restore::bad(&s, "not unpacked"))?;
            let dump = restore::archive_config(&s, &dir)?;
            Ok((unpacked, dump, size))
        })
        .await
        .map_err(|e| bad(&shown, e.to_string()))?
        .map_err(of_pod)
    }

    /// RestorePod's container: made in pod `sandbox_id` from `p` (CREATED, not started; its
    /// start restores the processes).
    pub async fn create_restored(
        &self,
        sandbox_id: &str,
        config: ContainerConfig,
        p: PreparedRestore,
    ) -> Result<String, Error> {
        let restoring = Restoring {
            image: p.image,
            unpacked: p.unpacked,
        };
        self.create_from(sandbox_id, config, Some(restoring))
            .await
            .map_err(of_pod)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::super::pod_checkpoint::{ManifestEntry, PodName};
    use super::*;

    fn manifest(names: &[&str]) -> Manifest {
        Manifest {
            version: LAYOUT_VERSION,
            runtime: "crius".into(),
            pod: PodName::default(),
            checkpointed_time: String::new(),
            containers: names
                .iter()
                .enumerate()
                .map(|(i, n)| ManifestEntry {
                    name: n.to_string(),
                    archive: archive_name(i),
                    image: "busybox".into(),
                })
                .collect(),
        }
    }

    fn write(dir: &Path, m: &Manifest) {
        std::fs::write(dir.join(MANIFEST), serde_json::to_vec(m).unwrap()).unwrap();
    }

    fn refusal(dir: &Path) -> String {
        PodCheckpoint::open(dir).err().unwrap().to_string()
    }

    #[test]
    fn a_manifest_is_read_beneath_its_directory() {
        let d = tempfile::tempdir().unwrap();
        write(d.path(), &manifest(&["a", "b"]));
        let cp = PodCheckpoint::open(d.path()).unwrap();
        assert_eq!(cp.names(), ["a", "b"]);
    }

    #[test]
    fn hostile_manifests_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path();
        // No manifest, or one that is a link (to a host file), a FIFO, or too big.
        let m = refusal(p);
        assert!(
            m.starts_with("checkpoint_path") && m.contains("pod.json"),
            "{m}"
        );
        std::os::unix::fs::symlink("/etc/passwd", p.join(MANIFEST)).unwrap();
        assert!(refusal(p).contains("link"), "{}", refusal(p));
        std::fs::remove_file(p.join(MANIFEST)).unwrap();
        nix::unistd::mkfifo(&p.join(MANIFEST), Mode::from_bits_truncate(0o600)).unwrap();
        let started = std::time::Instant::now();
        assert!(refusal(p).contains("not a regular"), "{}", refusal(p));
        assert!(started.elapsed() < std::time::Duration::from_secs(2));
        std::fs::remove_file(p.join(MANIFEST)).unwrap();
        std::fs::File::create(p.join(MANIFEST))
            .unwrap()
            .set_len(MANIFEST_MAX + 1)
            .unwrap();
        assert!(refusal(p).contains("more than"), "{}", refusal(p));
        // Archives it names elsewhere, names twice or empty, another layout, none, or keys
        // it does not know.
        let mut elsewhere = manifest(&["a"]);
        elsewhere.containers[0].archive = "../../etc/shadow".into();
        let mut version = manifest(&["a"]);
        version.version = 2;
        for (m, said) in [
            (elsewhere, "its archive must be container-0.tar"),
            (manifest(&["a", "a"]), "again"),
            (manifest(&[""]), "bad name"),
            (version, "layout version 2"),
            (manifest(&[]), "0 containers"),
        ] {
            write(p, &m);
            let e = refusal(p);
            assert!(e.contains(said), "{said}: {e}");
        }
        std::fs::write(
            p.join(MANIFEST),
            br#"{"version":1,"runtime":"x","pod":{"name":"","namespace":"","uid":""},"checkpointedTime":"","containers":[],"devices":["/dev/kmsg"]}"#,
        )
        .unwrap();
        assert!(refusal(p).contains("unknown field"), "{}", refusal(p));
        // The directory itself as a link, or a file.
        let real = d.path().join("real");
        std::fs::create_dir(&real).unwrap();
        write(&real, &manifest(&["a"]));
        let link = d.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        assert!(
            refusal(&link).contains("symbolic link"),
            "{}",
            refusal(&link)
        );
        assert!(refusal(&real.join(MANIFEST)).contains("not a directory"));
    }
}
