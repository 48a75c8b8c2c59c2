//! Checkpoint archives as hostile input, for restore through CreateContainer. Restore is off
//! unless `checkpoint.restore_from_archive` turns it on, and criu's presence is checked before
//! the archive is touched. The archive is then unpacked once, by the confined layer unpacker
//! (`snapshot::unpack`: nothing outside its directory, no sparse member, no device node), into
//! a private directory (`<state>/restore/<random>`, 0700) that becomes the new container's
//! `restore/`; the tree must hold only directories and regular files (no link, FIFO, socket or
//! whiteout node, so no `checkpoint/` that leads elsewhere reaches criu). Members are read only
//! from there, each opened beneath the directory without following links, non-blocking, and only
//! when it is a regular file within its size bound. What the archive's saved config says is read
//! for the image's name alone; the image is looked up, never tagged. Uses `snapshot::unpack`,
//! `image` lookups and this module's `Error`.

use std::io::Read;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use nix::errno::Errno;
use nix::fcntl::{OFlag, OpenHow, ResolveFlag, openat2};
use nix::sys::stat::{Mode, SFlag, fstat};

use super::checkpoint::{ConfigDump, Externals, NET_KEY, criu};
use super::seal::SealKey;
use super::{Bundle, ContainerService, Error, MonitorConfig, image, invalid, random_id, runtime};

/// The config key that turns restore through CreateContainer on.
pub(super) const RESTORE_KEY: &str = "checkpoint.restore_from_archive";
/// The most a small member (`config.dump`, `spec.dump`, `crius.json`, `descriptors.json`) may
/// hold: what crius writes is a few KiB.
pub(super) const SMALL_MEMBER: u64 = 4 << 20;
/// The members that hold JSON, each at most `SMALL_MEMBER` bytes.
const SMALL_MEMBERS: [&str; 5] = [
    "config.dump",
    "spec.dump",
    "crius.json",
    "descriptors.json",
    "deleted.files",
];
/// How deep the unpacked tree may go (criu's images are one directory).
const MAX_DEPTH: usize = 8;

/// A bad archive, for `archive`.
pub(super) fn bad(archive: &Path, reason: impl Into<String>) -> Error {
    Error::BadArchive {
        archive: archive.to_path_buf(),
        reason: reason.into(),
    }
}

/// An archive unpacked into a private directory, removed when dropped unless `adopt` moved it
/// into a container's bundle.
#[derive(Debug)]
pub(super) struct Unpacked {
    archive: PathBuf,
    dir: Mutex<Option<PathBuf>>,
}

impl Unpacked {
    /// The archive's path, as given.
    pub(super) fn archive(&self) -> &Path {
        &self.archive
    }

    /// Where it is unpacked now (`None` once adopted).
    pub(super) fn dir(&self) -> Option<PathBuf> {
        self.dir.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Moves the unpacked tree to `to` (on the same file system), which then owns it.
    pub(super) fn adopt(&self, to: &Path) -> Result<(), Error> {
        let mut dir = self.dir.lock().unwrap_or_else(|p| p.into_inner());
        let Some(from) = dir.as_ref() else {
            return Err(bad(&self.archive, "already unpacked for another container"));
        };
        std::fs::rename(from, to).map_err(super::io_err(to))?;
        *dir = None;
        Ok(())
    }
}

impl Drop for Unpacked {
    fn drop(&mut self) {
        if let Some(d) = self.dir.get_mut().unwrap_or_else(|p| p.into_inner()).take()
            && let Err(e) = std::fs::remove_dir_all(&d)
        {
            tracing::warn!(dir = %d.display(), error = %e, "removing an unpacked checkpoint");
        }
    }
}

/// Unpacks `archive` into a new private directory below `parent`, and checks its tree.
pub(super) fn unpack(archive: &Path, parent: &Path, key: &SealKey) -> Result<Unpacked, Error> {
    use std::os::unix::fs::OpenOptionsExt;
    let unpacked = private_dir(archive, parent)?;
    // Non-blocking: a FIFO put at the path after `is_archive` looked must not hold this thread.
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(archive)
        .map_err(super::io_err(archive))?;
    let meta = f.metadata().map_err(super::io_err(archive))?;
    if !meta.file_type().is_file() {
        return Err(bad(archive, "is not a regular file"));
    }
    unpack_into(f, unpacked, key)
}

/// Unpacks the regular file `f` (the archive `unpacked` names) into `unpacked`'s directory, and
/// checks the tree, then its seal.
pub(super) fn unpack_into(
    f: std::fs::File,
    unpacked: Unpacked,
    key: &SealKey,
) -> Result<Unpacked, Error> {
    let archive = unpacked.archive.clone();
    let archive = archive.as_path();
    let dir = unpacked
        .dir()
        .ok_or_else(|| bad(archive, "already unpacked for another container"))?;
    let stats = crate::snapshot::unpack::unpack(
        std::io::BufReader::new(f),
        &dir,
        &crate::snapshot::UnpackOptions::default(),
    )
    .map_err(|e| bad(archive, e.to_string()))?;
    if let Some(l) = stats.lower_links.first() {
        return Err(bad(
            archive,
            format!("{}: a hard link to a file the archive lacks", l.shown),
        ));
    }
    check_tree(archive, &dir, Path::new(""), 0)?;
    // The small members are bounded whether or not this restore reads them.
    for name in SMALL_MEMBERS {
        if let Ok(m) = std::fs::symlink_metadata(dir.join(name))
            && m.len() > SMALL_MEMBER
        {
            return Err(bad(
                archive,
                format!(
                    "{name}: {} bytes, more than the {SMALL_MEMBER} allowed",
                    m.len()
                ),
            ));
        }
    }
    // Before any member is read: only what a crius holding the key dumped goes on.
    super::seal::check(&dir, key).map_err(|why| bad(archive, why.to_string()))?;
    Ok(unpacked)
}

/// A new private directory below `parent` (made 0700 if missing) for `archive`'s members,
/// removed when the answer is dropped.
pub(super) fn private_dir(archive: &Path, parent: &Path) -> Result<Unpacked, Error> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(parent)
        .map_err(super::io_err(parent))?;
    let name = random_id().map_err(super::io_err(Path::new("getrandom")))?;
    let dir = parent.join(name);
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .map_err(super::io_err(&dir))?;
    Ok(Unpacked {
        archive: archive.to_path_buf(),
        dir: Mutex::new(Some(dir)),
    })
}

/// Refuses anything in the unpacked tree but directories and regular files.
fn check_tree(archive: &Path, dir: &Path, shown: &Path, depth: usize) -> Result<(), Error> {
    if depth > MAX_DEPTH {
        return Err(bad(
            archive,
            format!("{}: deeper than {MAX_DEPTH} directories", shown.display()),
        ));
    }
    for entry in std::fs::read_dir(dir).map_err(super::io_err(dir))? {
        let entry = entry.map_err(super::io_err(dir))?;
        let name = shown.join(entry.file_name());
        // The entry's own type: a link is not followed.
        let kind = entry.file_type().map_err(super::io_err(&entry.path()))?;
        if kind.is_dir() {
            check_tree(archive, &entry.path(), &name, depth + 1)?;
        } else if !kind.is_file() {
            return Err(bad(
                archive,
                format!("{}: {}", name.display(), not_regular(kind)),
            ));
        }
    }
    Ok(())
}

fn not_regular(kind: std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if kind.is_symlink() {
        "is a symbolic link (links are refused)"
    } else if kind.is_fifo() {
        "is a FIFO (only regular files are read)"
    } else if kind.is_char_device() || kind.is_block_device() {
        "is a device node (or whiteout)"
    } else if kind.is_socket() {
        "is a socket"
    } else {
        "is not a regular file"
    }
}

/// Opens `name` below `dir` for reading: no link followed on the way or at the end, never
/// blocking on a FIFO or device, and only when it is a regular file of at most `limit` bytes.
pub(super) fn open_member(
    archive: &Path,
    dir: &Path,
    name: &str,
    limit: Option<u64>,
) -> Result<std::fs::File, Error> {
    let root = nix::fcntl::open(
        dir,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW,
        Mode::empty(),
    )
    .map_err(|e| super::io_err(dir)(e.into()))?;
    open_member_at(archive, root.as_fd(), name, limit)
}

/// `open_member` below the directory handle `root`.
pub(super) fn open_member_at(
    archive: &Path,
    root: BorrowedFd<'_>,
    name: &str,
    limit: Option<u64>,
) -> Result<std::fs::File, Error> {
    let how = OpenHow::new()
        .flags(
            OFlag::O_RDONLY
                | OFlag::O_NONBLOCK
                | OFlag::O_NOFOLLOW
                | OFlag::O_NOCTTY
                | OFlag::O_CLOEXEC,
        )
        .resolve(
            ResolveFlag::RESOLVE_BENEATH
                | ResolveFlag::RESOLVE_NO_SYMLINKS
                | ResolveFlag::RESOLVE_NO_MAGICLINKS
                | ResolveFlag::RESOLVE_NO_XDEV,
        );
    let fd = openat2(root, name, how).map_err(|e| {
        let why = match e {
            Errno::ELOOP | Errno::EXDEV => {
                "is a link or leads out of the archive (refused)".to_string()
            }
            Errno::ENOENT => "is missing".to_string(),
            e => std::io::Error::from(e).to_string(),
        };
        bad(archive, format!("{name}: {why}"))
    })?;
    let st = fstat(&fd).map_err(|e| bad(archive, format!("{name}: {e}")))?;
    if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT != SFlag::S_IFREG {
        return Err(bad(archive, format!("{name}: is not a regular file")));
    }
    if let Some(limit) = limit
        && st.st_size as u64 > limit
    {
        return Err(bad(
            archive,
            format!(
                "{name}: {} bytes, more than the {limit} allowed",
                st.st_size
            ),
        ));
    }
    Ok(std::fs::File::from(fd))
}

/// Reads the small member `name` below `dir` whole, at most `SMALL_MEMBER` bytes.
pub(super) fn read_member(archive: &Path, dir: &Path, name: &str) -> Result<Vec<u8>, Error> {
    let f = open_member(archive, dir, name, Some(SMALL_MEMBER))?;
    let mut text = Vec::new();
    // Bounded again while reading: the size checked is the size read.
    f.take(SMALL_MEMBER + 1)
        .read_to_end(&mut text)
        .map_err(|e| bad(archive, format!("{name}: {e}")))?;
    if text.len() as u64 > SMALL_MEMBER {
        return Err(bad(archive, format!("{name}: grew while read")));
    }
    Ok(text)
}

/// What the container was made from (`config.dump`), from an unpacked archive.
pub(super) fn archive_config(archive: &Path, dir: &Path) -> Result<ConfigDump, Error> {
    let text = read_member(archive, dir, "config.dump")?;
    serde_json::from_slice(&text).map_err(|e| bad(archive, format!("config.dump: {e}")))
}

impl ContainerService {
    /// For CreateContainer from `archive`: the checks that come before it is read (restore on,
    /// criu installed, no terminal), the archive unpacked, and the image its container was made
    /// of, by the first of its names present here (looked up only: restore tags nothing).
    pub(super) async fn checkpoint_image(
        &self,
        archive: &Path,
        tty: bool,
    ) -> Result<(std::sync::Arc<image::Image>, Unpacked), Error> {
        let Some(parent) = self.inner.restore_dir.clone() else {
            return Err(Error::RestoreOff {
                archive: archive.to_path_buf(),
                key: RESTORE_KEY,
            });
        };
        if criu().is_none() {
            return Err(Error::NoCriu {
                archive: archive.to_path_buf(),
            });
        }
        if tty {
            return Err(invalid(
                "config.tty",
                "a container with a terminal cannot be restored",
            ));
        }
        let (a, key) = (archive.to_path_buf(), self.seal_key()?);
        let (unpacked, dump) = tokio::task::spawn_blocking(move || {
            let u = unpack(&a, &parent, &key)?;
            let dir = u.dir().ok_or_else(|| bad(&a, "not unpacked"))?;
            let dump = archive_config(&a, &dir)?;
            Ok::<_, Error>((u, dump))
        })
        .await
        .map_err(|e| bad(archive, e.to_string()))??;
        Ok((self.dump_image(archive, &dump)?, unpacked))
    }

    /// The image the checkpointed container was made of, by the first of its names present
    /// here (looked up only: restore tags nothing).
    pub(super) fn dump_image(
        &self,
        archive: &Path,
        dump: &ConfigDump,
    ) -> Result<std::sync::Arc<image::Image>, Error> {
        for name in [
            &dump.rootfs_image_ref,
            &dump.rootfs_image_name,
            &dump.rootfs_image,
        ] {
            if !name.is_empty()
                && let Some(i) = self.inner.images.lookup(name)?
            {
                return Ok(i);
            }
        }
        Err(Error::ImageNotFound {
            image: format!(
                "{} (of checkpoint {})",
                dump.rootfs_image,
                archive.display()
            ),
        })
    }

    /// Moves the unpacked archive into the new container's bundle (`restore/`) and unpacks its
    /// `rootfs-diff.tar`, by the confined unpacker, into the writable layer (empty, not yet
    /// mounted).
    pub(super) async fn unpack_archive(
        &self,
        unpacked: &Unpacked,
        b: &Bundle,
    ) -> Result<(), Error> {
        let archive = unpacked.archive().to_path_buf();
        let dir = b.dir.join("restore");
        unpacked.adopt(&dir)?;
        let upper = b.layer.join("upper");
        tokio::task::spawn_blocking(move || {
            let diff = match open_member(&archive, &dir, "rootfs-diff.tar", None) {
                Ok(f) => f,
                // A container that changed no file has none.
                Err(_) if std::fs::symlink_metadata(dir.join("rootfs-diff.tar")).is_err() => {
                    return Ok(());
                }
                Err(e) => return Err(e),
            };
            crate::snapshot::unpack::unpack(
                std::io::BufReader::new(diff),
                &upper,
                &crate::snapshot::UnpackOptions::default(),
            )
            .map(drop)
            .map_err(|e| bad(&archive, format!("rootfs-diff.tar: {e}")))
        })
        .await
        .map_err(|e| bad(unpacked.archive(), e.to_string()))?
    }

    /// How criu is to restore the unpacked archive into the new container (`oci`, `monitor`).
    pub(super) fn restore_config(
        &self,
        archive: &Path,
        b: &Bundle,
        oci: &oci_spec::runtime::Spec,
        monitor: &MonitorConfig,
    ) -> Result<runtime::RestoreConfig, Error> {
        let dir = b.dir.join("restore");
        let read = |name: &str| read_member(archive, &dir, name);
        let ext: Externals = serde_json::from_slice(&read("crius.json")?)
            .map_err(|e| bad(archive, format!("crius.json: {e}")))?;
        let stdio: Vec<String> = serde_json::from_slice(&read("descriptors.json")?)
            .map_err(|e| bad(archive, format!("descriptors.json: {e}")))?;
        // The stdio pipes' names as the dump saw them (`pipe:[N]`), nothing more.
        if stdio.len() > 3 || stdio.iter().any(|s| s.len() > 64) {
            return Err(bad(
                archive,
                "descriptors.json: more than 3 descriptors, or one longer than 64 bytes",
            ));
        }
        // criu reads its images from a directory of regular files (the tree was checked when
        // it was unpacked), never through a link.
        let images = dir.join("checkpoint");
        if !std::fs::symlink_metadata(&images).is_ok_and(|m| m.file_type().is_dir()) {
            return Err(bad(archive, "checkpoint/: missing, or not a directory"));
        }
        let mut mounts = Vec::new();
        for key in &ext.mounts {
            let m = oci
                .mounts()
                .as_deref()
                .unwrap_or_default()
                .iter()
                .find(|m| m.destination() == Path::new(key));
            let masked = || {
                oci.linux()
                    .as_ref()
                    .and_then(|l| l.masked_paths().as_ref())
                    .is_some_and(|p| p.iter().any(|p| p == key))
            };
            let source = match m {
                Some(m) if m.typ().as_deref() == Some("cgroup2") => monitor.cgroup.clone(),
                Some(m) => m.source().clone(),
                None if masked() => Some(PathBuf::from("/dev/null")),
                None => None,
            };
            let Some(source) = source else {
                return Err(invalid(
                    "config.mounts",
                    format!("the checkpoint has a mount at {key} that this container lacks"),
                ));
            };
            mounts.push((key.clone(), source));
        }
        let net = match (&ext.net, monitor.join.iter().find(|n| n.kind == "net")) {
            // The key is crius's own: nothing else of the archive's reaches criu's arguments.
            (Some(key), Some(_)) if key != NET_KEY => {
                return Err(bad(archive, "crius.json: an unknown network key"));
            }
            (Some(key), Some(ns)) => Some((key.clone(), ns.path.clone())),
            (None, None) => None,
            (Some(_), None) => {
                return Err(invalid(
                    "sandbox_config",
                    "the checkpoint was in a pod network; this pod uses the node's",
                ));
            }
            (None, Some(_)) => {
                return Err(invalid(
                    "sandbox_config",
                    "the checkpoint used the node's network; this pod has its own",
                ));
            }
        };
        Ok(runtime::RestoreConfig {
            images,
            log: b.dir.join("restore.log"),
            pid_file: b.dir.join("restore.pid"),
            mounts,
            net,
            stdio,
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// A GNU header with the numeric fields a tar reader needs.
    fn header() -> tar::Header {
        let mut h = tar::Header::new_gnu();
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(0);
        h
    }

    fn tar_of(members: &[(&str, &[u8])]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (name, data) in members {
            let mut h = header();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            b.append_data(&mut h, name, *data).unwrap();
        }
        b.into_inner().unwrap()
    }

    fn message(e: Error) -> String {
        e.to_string()
    }

    #[test]
    fn a_small_regular_member_is_read() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("config.dump"), b"{}").unwrap();
        let a = Path::new("/a.tar");
        assert_eq!(read_member(a, d.path(), "config.dump").unwrap(), b"{}");
    }

    #[test]
    fn links_fifos_devices_and_big_members_are_refused_at_once() {
        let d = tempfile::tempdir().unwrap();
        let a = Path::new("/a.tar");
        std::os::unix::fs::symlink("/dev/zero", d.path().join("descriptors.json")).unwrap();
        nix::unistd::mkfifo(
            &d.path().join("crius.json"),
            Mode::from_bits_truncate(0o600),
        )
        .unwrap();
        std::fs::create_dir(d.path().join("real")).unwrap();
        std::fs::write(d.path().join("real/x"), b"x").unwrap();
        std::os::unix::fs::symlink("real", d.path().join("via")).unwrap();
        let big = std::fs::File::create(d.path().join("spec.dump")).unwrap();
        big.set_len(SMALL_MEMBER + 1).unwrap();
        let started = std::time::Instant::now();
        let e = message(read_member(a, d.path(), "descriptors.json").unwrap_err());
        assert!(e.contains("descriptors.json") && e.contains("link"), "{e}");
        // A FIFO with no writer: refused, not waited on.
        let e = message(read_member(a, d.path(), "crius.json").unwrap_err());
        assert!(
            e.contains("crius.json") && e.contains("not a regular"),
            "{e}"
        );
        let e = message(read_member(a, d.path(), "via/x").unwrap_err());
        assert!(e.contains("link"), "{e}");
        let e = message(read_member(a, d.path(), "spec.dump").unwrap_err());
        assert!(e.contains("more than"), "{e}");
        let e = message(read_member(a, d.path(), "real").unwrap_err());
        assert!(e.contains("not a regular"), "{e}");
        let e = message(read_member(a, d.path(), "../etc/passwd").unwrap_err());
        assert!(e.contains("../etc/passwd"), "{e}");
        let e = message(read_member(a, d.path(), "gone").unwrap_err());
        assert!(e.contains("missing"), "{e}");
        assert!(started.elapsed() < std::time::Duration::from_secs(2));
        // A tree with any of them is refused whole.
        let e = message(check_tree(a, d.path(), Path::new(""), 0).unwrap_err());
        assert!(e.contains("refused") || e.contains("FIFO"), "{e}");
    }

    #[test]
    fn an_archive_is_unpacked_privately_and_removed_when_dropped() {
        let d = tempfile::tempdir().unwrap();
        let a = d.path().join("a.tar");
        // As a dump writes it: the files, then the seal over them.
        let work = d.path().join("work");
        std::fs::create_dir_all(work.join("checkpoint")).unwrap();
        std::fs::write(work.join("config.dump"), b"{}").unwrap();
        std::fs::write(work.join("checkpoint/core-1.img"), b"core").unwrap();
        super::super::seal::seal(&work, &key()).unwrap();
        let tar = super::super::checkpoint::archive_into(&work, Vec::new()).unwrap();
        std::fs::write(&a, tar).unwrap();
        let parent = d.path().join("restore");
        let u = unpack(&a, &parent, &key()).unwrap();
        let dir = u.dir().unwrap();
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        assert_eq!(
            read_member(&a, &dir, "checkpoint/core-1.img").unwrap(),
            b"core"
        );
        drop(u);
        assert_eq!(std::fs::read_dir(&parent).unwrap().count(), 0);
        // Adopted, it is the new owner's.
        let u = unpack(&a, &parent, &key()).unwrap();
        let to = d.path().join("bundle-restore");
        u.adopt(&to).unwrap();
        drop(u);
        assert!(to.join("config.dump").is_file());
        // Under another node's key, or unsealed, it is refused and nothing is left.
        let e = unpack(&a, &parent, &SealKey::from_bytes(&[9; 32])).unwrap_err();
        assert!(e.to_string().contains("seal does not match"), "{e}");
        let e = unpack_err(tar_of(&[("config.dump", b"{}")]));
        assert!(e.contains("no crius.seal"), "{e}");
    }

    fn key() -> SealKey {
        SealKey::from_bytes(&[7; 32])
    }

    fn unpack_err(tar: Vec<u8>) -> String {
        let d = tempfile::tempdir().unwrap();
        let a = d.path().join("a.tar");
        std::fs::write(&a, tar).unwrap();
        let parent = d.path().join("restore");
        let e = unpack(&a, &parent, &key()).unwrap_err().to_string();
        // Nothing is left of a refused archive.
        assert_eq!(std::fs::read_dir(&parent).unwrap().count(), 0, "{e}");
        e
    }

    #[test]
    fn links_and_sparse_members_in_an_archive_are_refused() {
        // A symlinked rootfs-diff.tar and a checkpoint/ that is a link to a host directory.
        for (name, target) in [("rootfs-diff.tar", "/etc/passwd"), ("checkpoint", "/etc")] {
            let mut b = tar::Builder::new(Vec::new());
            let mut h = header();
            h.set_entry_type(tar::EntryType::Symlink);
            h.set_size(0);
            h.set_mode(0o777);
            b.append_link(&mut h, name, target).unwrap();
            let e = unpack_err(b.into_inner().unwrap());
            assert!(e.contains(name) && e.contains("link"), "{e}");
        }
        // A FIFO member.
        let mut b = tar::Builder::new(Vec::new());
        let mut h = header();
        h.set_entry_type(tar::EntryType::Fifo);
        h.set_size(0);
        h.set_mode(0o644);
        b.append_data(&mut h, "crius.json", &[][..]).unwrap();
        let e = unpack_err(b.into_inner().unwrap());
        assert!(e.contains("crius.json") && e.contains("FIFO"), "{e}");
        // config.dump as a 6 GiB GNU sparse member of a few KiB (one byte of data at its end):
        // refused, not filled in.
        let size: u64 = 6 << 30;
        let mut h = header();
        h.set_entry_type(tar::EntryType::GNUSparse);
        h.set_size(1);
        h.set_mode(0o644);
        h.set_path("config.dump").unwrap();
        let g = h.as_gnu_mut().unwrap();
        g.set_real_size(size);
        g.sparse[0]
            .offset
            .copy_from_slice(format!("{:011o}\0", size - 1).as_bytes());
        g.sparse[0]
            .numbytes
            .copy_from_slice(format!("{:011o}\0", 1).as_bytes());
        h.set_cksum();
        let mut b = tar::Builder::new(Vec::new());
        b.append(&h, &b"x"[..]).unwrap();
        let raw = b.into_inner().unwrap();
        let big = vec![b' '; (SMALL_MEMBER + 1) as usize];
        let e = unpack_err(tar_of(&[("deleted.files", &big)]));
        assert!(
            e.contains("deleted.files") && e.contains("more than"),
            "{e}"
        );
        let started = std::time::Instant::now();
        let e = unpack_err(raw);
        assert!(e.contains("config.dump") && e.contains("sparse"), "{e}");
        assert!(started.elapsed() < std::time::Duration::from_secs(2));
    }
}
