//! Safe extraction of one layer tar into an empty directory, as an overlayfs lower layer.
//!
//! A layer is hostile until proven otherwise. Every path is resolved below the layer directory with
//! `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`, so no entry can write outside it: `..` is
//! refused outright, a leading `/` (in names and hardlink targets, as some builders write them)
//! means the layer's root, as it does for GNU tar and containerd, a path through a symlink
//! fails, hardlinks must point at a
//! file this layer already holds, files are created `O_EXCL | O_NOFOLLOW` after removing whatever
//! held the name. OCI whiteouts become overlay whiteouts: `.wh.NAME` a 0/0 character device,
//! `.wh..wh..opq` the `trusted.overlay.opaque=y` attribute; `trusted.overlay.*` attributes in the
//! tar itself are dropped, since they would steer overlayfs.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, OpenHow, ResolveFlag, openat, openat2};
use nix::sys::stat::{
    FchmodatFlags, Mode, SFlag, UtimensatFlags, fchmod, fchmodat, fstatat, futimens, makedev,
    mkdirat, mknodat, utimensat,
};
use nix::sys::time::TimeSpec;
use nix::unistd::{Gid, Uid, UnlinkatFlags, fchown, fchownat, linkat, symlinkat, unlinkat};
use tar::EntryType;

use super::LowerLink;
use crate::sys;

/// What a layer may contain beyond files, directories and links.
#[derive(Debug, Clone, Default)]
pub struct UnpackOptions {
    /// Create character and block device nodes found in layers. Off by default: a device node in
    /// an image could reach a host device if the rootfs were not `nodev`.
    pub allow_device_nodes: bool,
}

/// What a layer added to the disk, and the hardlinks it left for `copyup` (their targets are
/// in no earlier entry of the layer).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UnpackStats {
    pub size: u64,
    pub inodes: u64,
    pub lower_links: Vec<LowerLink>,
}

#[derive(Debug, thiserror::Error)]
pub enum UnpackError {
    #[error("layer entry {path:?} rejected: {reason}")]
    Rejected { path: String, reason: &'static str },
    #[error("layer entry {path:?}: {source}")]
    Io { path: String, source: io::Error },
    #[error("layer is not a valid tar archive: {0}")]
    Tar(io::Error),
}

const OPAQUE_MARKER: &str = ".wh..wh..opq";
const WHITEOUT_PREFIX: &str = ".wh.";
pub(super) const OPAQUE_XATTR: &[u8] = b"trusted.overlay.opaque";

pub(super) fn beneath() -> ResolveFlag {
    ResolveFlag::RESOLVE_BENEATH
        | ResolveFlag::RESOLVE_NO_SYMLINKS
        | ResolveFlag::RESOLVE_NO_MAGICLINKS
        | ResolveFlag::RESOLVE_NO_XDEV
}

/// Splits an archive path into its normal components, refusing `..`; a leading `/` is the
/// layer's root.
fn components(raw: &Path, shown: &str) -> Result<Vec<OsString>, UnpackError> {
    let mut out = Vec::new();
    for c in raw.components() {
        match c {
            Component::Normal(s) => out.push(s.to_os_string()),
            Component::CurDir | Component::RootDir => {}
            Component::Prefix(_) => return Err(rejected(shown, "path has a prefix")),
            Component::ParentDir => return Err(rejected(shown, "path contains \"..\"")),
        }
    }
    Ok(out)
}

pub(super) fn rejected(path: &str, reason: &'static str) -> UnpackError {
    UnpackError::Rejected {
        path: path.to_string(),
        reason,
    }
}

pub(super) fn join(comps: &[OsString]) -> PathBuf {
    comps.iter().collect()
}

/// Directory handles below the layer root, with the last parent cached: tar entries come
/// directory by directory, so most entries reuse it.
pub(super) struct Dirs {
    pub(super) root: OwnedFd,
    cached: Option<(Vec<OsString>, OwnedFd)>,
}

impl Dirs {
    /// The layer directory `dest`, itself not a symlink.
    pub(super) fn open(dest: &Path) -> Result<Dirs, UnpackError> {
        let root = nix::fcntl::open(
            dest,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW,
            Mode::empty(),
        )
        .map_err(|e| UnpackError::Io {
            path: dest.display().to_string(),
            source: e.into(),
        })?;
        Ok(Dirs { root, cached: None })
    }

    pub(super) fn map_err(err: Errno, shown: &str) -> UnpackError {
        match err {
            Errno::ELOOP | Errno::EXDEV => rejected(shown, "path goes through a symlink"),
            Errno::ENOTDIR => rejected(shown, "a parent of the path is not a directory"),
            e => UnpackError::Io {
                path: shown.to_string(),
                source: io::Error::from(e),
            },
        }
    }

    /// Opens (creating as needed, mode 0755) the directory `comps` below the root.
    pub(super) fn parent(
        &mut self,
        comps: &[OsString],
        shown: &str,
    ) -> Result<BorrowedFd<'_>, UnpackError> {
        if comps.is_empty() {
            return Ok(self.root.as_fd());
        }
        let hit = matches!(&self.cached, Some((c, _)) if c.as_slice() == comps);
        if !hit {
            let how = OpenHow::new()
                .flags(OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC)
                .resolve(beneath());
            let fd = match openat2(self.root.as_fd(), &join(comps), how) {
                Ok(fd) => fd,
                Err(Errno::ENOENT) => self.create(comps, shown)?,
                Err(e) => return Err(Self::map_err(e, shown)),
            };
            self.cached = Some((comps.to_vec(), fd));
        }
        match &self.cached {
            Some((_, fd)) => Ok(fd.as_fd()),
            None => Err(rejected(shown, "internal: parent cache empty")),
        }
    }

    fn create(&self, comps: &[OsString], shown: &str) -> Result<OwnedFd, UnpackError> {
        let how = || {
            OpenHow::new()
                .flags(OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC)
                .resolve(beneath())
        };
        let mut cur =
            openat2(self.root.as_fd(), ".", how()).map_err(|e| Self::map_err(e, shown))?;
        for comp in comps {
            match mkdirat(
                cur.as_fd(),
                comp.as_os_str(),
                Mode::from_bits_truncate(0o755),
            ) {
                Ok(()) | Err(Errno::EEXIST) => {}
                Err(e) => return Err(Self::map_err(e, shown)),
            }
            cur = openat2(cur.as_fd(), comp.as_os_str(), how())
                .map_err(|e| Self::map_err(e, shown))?;
        }
        Ok(cur)
    }

    /// Opens an existing directory for reading (to set its attributes).
    fn open_dir(&self, comps: &[OsString], shown: &str) -> Result<OwnedFd, UnpackError> {
        let path = if comps.is_empty() {
            PathBuf::from(".")
        } else {
            join(comps)
        };
        let how = OpenHow::new()
            .flags(OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC)
            .resolve(beneath());
        openat2(self.root.as_fd(), &path, how).map_err(|e| Self::map_err(e, shown))
    }

    pub(super) fn invalidate(&mut self) {
        self.cached = None;
    }

    /// The parent directory of `name` (a non-directory about to be made), with whatever held
    /// the name removed first (see `clear`).
    pub(super) fn cleared_parent(
        &mut self,
        parents: &[OsString],
        name: &OsStr,
        shown: &str,
    ) -> Result<BorrowedFd<'_>, UnpackError> {
        let pfd = self.parent(parents, shown)?;
        if clear(pfd, name, false, shown)? {
            self.invalidate();
        }
        self.parent(parents, shown)
    }
}

/// Sets the owner of `name` in `dir` itself, never what a symlink there points at.
pub(super) fn chown_nofollow(
    dir: BorrowedFd<'_>,
    name: &OsStr,
    uid: u32,
    gid: u32,
) -> nix::Result<()> {
    fchownat(
        dir,
        name,
        Some(Uid::from_raw(uid)),
        Some(Gid::from_raw(gid)),
        AtFlags::AT_SYMLINK_NOFOLLOW,
    )
}

/// Per-entry attributes, with PAX records applied.
struct Attrs {
    mode: u32,
    uid: u32,
    gid: u32,
    mtime: i64,
    xattrs: Vec<(Vec<u8>, Vec<u8>)>,
}

fn attrs<R: Read>(entry: &mut tar::Entry<'_, R>) -> Result<Attrs, io::Error> {
    let h = entry.header();
    let mut a = Attrs {
        mode: h.mode()? & 0o7777,
        uid: u32::try_from(h.uid()?).unwrap_or(u32::MAX),
        gid: u32::try_from(h.gid()?).unwrap_or(u32::MAX),
        mtime: i64::try_from(h.mtime()?).unwrap_or(0),
        xattrs: Vec::new(),
    };
    if let Some(exts) = entry.pax_extensions()? {
        for ext in exts {
            let ext = ext?;
            let key = ext.key_bytes();
            let value = ext.value_bytes();
            let num = || std::str::from_utf8(value).ok().map(str::trim);
            match key {
                b"uid" => a.uid = num().and_then(|v| v.parse().ok()).unwrap_or(a.uid),
                b"gid" => a.gid = num().and_then(|v| v.parse().ok()).unwrap_or(a.gid),
                b"mtime" => {
                    // "seconds[.fraction]"
                    if let Some(secs) = num().and_then(|v| v.split('.').next()?.parse().ok()) {
                        a.mtime = secs;
                    }
                }
                _ => {
                    if let Some(name) = key.strip_prefix(b"SCHILY.xattr.") {
                        a.xattrs.push((name.to_vec(), value.to_vec()));
                    }
                }
            }
        }
    }
    Ok(a)
}

fn timespec(secs: i64) -> TimeSpec {
    TimeSpec::new(secs, 0)
}

/// Unpacks the tar stream `reader` into the empty directory `dest`.
pub fn unpack<R: Read>(
    reader: R,
    dest: &Path,
    opts: &UnpackOptions,
) -> Result<UnpackStats, UnpackError> {
    let mut dirs = Dirs::open(dest)?;
    let mut stats = UnpackStats::default();
    let mut dir_times: Vec<(Vec<OsString>, i64)> = Vec::new();

    let mut archive = tar::Archive::new(reader);
    for entry in archive.entries().map_err(UnpackError::Tar)? {
        let mut entry = entry.map_err(UnpackError::Tar)?;
        let kind = entry.header().entry_type();
        if matches!(
            kind,
            EntryType::XGlobalHeader
                | EntryType::XHeader
                | EntryType::GNULongName
                | EntryType::GNULongLink
        ) {
            continue;
        }
        let raw = entry.path().map_err(UnpackError::Tar)?.into_owned();
        let shown = raw.display().to_string();
        let comps = components(&raw, &shown)?;
        let io = |source: io::Error| UnpackError::Io {
            path: shown.clone(),
            source,
        };
        let a = attrs(&mut entry).map_err(UnpackError::Tar)?;

        let Some((name, parents)) = comps.split_last() else {
            // The layer root itself ("./"): only its attributes matter.
            if kind == EntryType::Directory {
                let fd = dirs.open_dir(&[], &shown)?;
                set_attrs(fd.as_fd(), &a, &shown)?;
                dir_times.push((Vec::new(), a.mtime));
            }
            continue;
        };
        let name_bytes = name.as_bytes();

        if let Some(hidden) = name_bytes.strip_prefix(WHITEOUT_PREFIX.as_bytes()) {
            if name_bytes == OPAQUE_MARKER.as_bytes() {
                dirs.parent(parents, &shown)?;
                let fd = dirs.open_dir(parents, &shown)?;
                sys::fsetxattr(fd.as_fd(), OPAQUE_XATTR, b"y").map_err(io)?;
            } else if hidden.starts_with(WHITEOUT_PREFIX.as_bytes()) {
                // Other `.wh..wh.` names are AUFS bookkeeping with no meaning here.
            } else {
                let hidden = OsStr::from_bytes(hidden);
                if hidden.is_empty() || hidden == "." || hidden == ".." {
                    return Err(rejected(&shown, "whiteout names no file"));
                }
                let pfd = dirs.parent(parents, &shown)?;
                let removed_dir = clear(pfd, hidden, false, &shown)?;
                mknodat(pfd, hidden, SFlag::S_IFCHR, Mode::empty(), makedev(0, 0))
                    .map_err(|e| io(e.into()))?;
                if removed_dir {
                    dirs.invalidate();
                }
                stats.inodes += 1;
            }
            continue;
        }

        match kind {
            EntryType::Directory => {
                let pfd = dirs.parent(parents, &shown)?;
                let removed_dir = clear(pfd, name, true, &shown)?;
                match mkdirat(pfd, name.as_os_str(), Mode::from_bits_truncate(0o700)) {
                    Ok(()) | Err(Errno::EEXIST) => {}
                    Err(e) => return Err(io(e.into())),
                }
                if removed_dir {
                    dirs.invalidate();
                }
                let fd = dirs.open_dir(&comps, &shown)?;
                set_attrs(fd.as_fd(), &a, &shown)?;
                dir_times.push((comps.clone(), a.mtime));
            }
            EntryType::Regular | EntryType::Continuous => {
                let pfd = dirs.cleared_parent(parents, name, &shown)?;
                let fd = openat(
                    pfd,
                    name.as_os_str(),
                    OFlag::O_WRONLY
                        | OFlag::O_CREAT
                        | OFlag::O_EXCL
                        | OFlag::O_NOFOLLOW
                        | OFlag::O_CLOEXEC,
                    Mode::from_bits_truncate(0o600),
                )
                .map_err(|e| io(e.into()))?;
                let mut file = File::from(fd);
                let copied = io::copy(&mut entry, &mut file).map_err(UnpackError::Tar)?;
                stats.size += copied;
                set_attrs(file.as_fd(), &a, &shown)?;
                futimens(&file, &timespec(a.mtime), &timespec(a.mtime))
                    .map_err(|e| io(e.into()))?;
            }
            EntryType::Symlink => {
                let target = entry
                    .link_name_bytes()
                    .ok_or_else(|| rejected(&shown, "symlink without a target"))?
                    .into_owned();
                let pfd = dirs.cleared_parent(parents, name, &shown)?;
                // The target is stored as given: it is never followed while unpacking.
                symlinkat(OsStr::from_bytes(&target), pfd, name.as_os_str())
                    .map_err(|e| io(e.into()))?;
                chown_nofollow(pfd, name, a.uid, a.gid).map_err(|e| io(e.into()))?;
                utimensat(
                    pfd,
                    name.as_os_str(),
                    &timespec(a.mtime),
                    &timespec(a.mtime),
                    UtimensatFlags::NoFollowSymlink,
                )
                .map_err(|e| io(e.into()))?;
            }
            EntryType::Link => {
                let target_raw = entry
                    .link_name()
                    .map_err(UnpackError::Tar)?
                    .ok_or_else(|| rejected(&shown, "hardlink without a target"))?
                    .into_owned();
                let target = components(&target_raw, &shown)?;
                let Some((tname, tparents)) = target.split_last() else {
                    return Err(rejected(&shown, "hardlink to the layer root"));
                };
                // A target no earlier entry of this layer wrote is a lower layer's file: it is
                // copied up once the layers below are in place (see `copyup`).
                let lower = || LowerLink {
                    name: comps.clone(),
                    target: target.clone(),
                    shown: shown.clone(),
                };
                let tdir = if tparents.is_empty() {
                    dirs.open_dir(&[], &shown)?
                } else {
                    let how = OpenHow::new()
                        .flags(OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC)
                        .resolve(beneath());
                    match openat2(dirs.root.as_fd(), &join(tparents), how) {
                        Ok(fd) => fd,
                        Err(Errno::ENOENT) => {
                            stats.lower_links.push(lower());
                            continue;
                        }
                        Err(e) => return Err(Dirs::map_err(e, &shown)),
                    }
                };
                let tstat = match fstatat(
                    tdir.as_fd(),
                    tname.as_os_str(),
                    AtFlags::AT_SYMLINK_NOFOLLOW,
                ) {
                    Ok(st) => st,
                    Err(Errno::ENOENT) => {
                        stats.lower_links.push(lower());
                        continue;
                    }
                    Err(e) => return Err(io(e.into())),
                };
                if SFlag::from_bits_truncate(tstat.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR {
                    return Err(rejected(&shown, "hardlink to a directory"));
                }
                if comps == target {
                    continue; // a link to itself (its directory opened above): nothing to do
                }
                let pfd = dirs.cleared_parent(parents, name, &shown)?;
                linkat(
                    tdir.as_fd(),
                    tname.as_os_str(),
                    pfd,
                    name.as_os_str(),
                    AtFlags::empty(),
                )
                .map_err(|e| io(e.into()))?;
            }
            EntryType::Char | EntryType::Block | EntryType::Fifo => {
                let (sflag, dev) = match kind {
                    EntryType::Fifo => (SFlag::S_IFIFO, 0),
                    _ => {
                        if !opts.allow_device_nodes {
                            return Err(rejected(
                                &shown,
                                "device node in an image layer (allow with allow_device_nodes)",
                            ));
                        }
                        let h = entry.header();
                        let major = h.device_major().map_err(UnpackError::Tar)?.unwrap_or(0);
                        let minor = h.device_minor().map_err(UnpackError::Tar)?.unwrap_or(0);
                        let f = if kind == EntryType::Char {
                            SFlag::S_IFCHR
                        } else {
                            SFlag::S_IFBLK
                        };
                        (f, makedev(major.into(), minor.into()))
                    }
                };
                let pfd = dirs.cleared_parent(parents, name, &shown)?;
                mknodat(pfd, name.as_os_str(), sflag, Mode::empty(), dev)
                    .map_err(|e| io(e.into()))?;
                chown_nofollow(pfd, name, a.uid, a.gid).map_err(|e| io(e.into()))?;
                // The name was just created as a node, not a symlink, in a directory no one else
                // writes to, so following is moot.
                fchmodat(
                    pfd,
                    name.as_os_str(),
                    Mode::from_bits_truncate(a.mode),
                    FchmodatFlags::FollowSymlink,
                )
                .map_err(|e| io(e.into()))?;
            }
            EntryType::GNUSparse => return Err(rejected(&shown, "sparse files are not supported")),
            _ => return Err(rejected(&shown, "unsupported tar entry type")),
        }
        stats.inodes += 1;
    }

    // Directory times last, deepest first, once nothing more is created inside them.
    for (comps, mtime) in dir_times.iter().rev() {
        let shown = join(comps).display().to_string();
        if let Ok(fd) = dirs.open_dir(comps, &shown) {
            futimens(&fd, &timespec(*mtime), &timespec(*mtime)).map_err(|e| UnpackError::Io {
                path: shown,
                source: e.into(),
            })?;
        }
    }
    Ok(stats)
}

/// Makes `name` free for a new entry: removes a non-directory, or a directory unless the new
/// entry is a directory too (then it is kept and its attributes updated). Returns whether a
/// directory was removed (cached handles below it are stale).
pub(super) fn clear(
    dir: BorrowedFd<'_>,
    name: &OsStr,
    new_is_dir: bool,
    shown: &str,
) -> Result<bool, UnpackError> {
    let io = |e: Errno| UnpackError::Io {
        path: shown.to_string(),
        source: e.into(),
    };
    let st = match fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) => st,
        Err(Errno::ENOENT) => return Ok(false),
        Err(e) => return Err(io(e)),
    };
    let is_dir = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR;
    if !is_dir {
        unlinkat(dir, name, UnlinkatFlags::NoRemoveDir).map_err(io)?;
        return Ok(false);
    }
    if new_is_dir {
        return Ok(false);
    }
    // /proc/self/fd/N resolves to the directory we hold; remove_dir_all never follows symlinks
    // below it.
    let path = PathBuf::from(format!(
        "/proc/self/fd/{}",
        std::os::fd::AsRawFd::as_raw_fd(&dir)
    ))
    .join(name);
    std::fs::remove_dir_all(&path).map_err(|source| UnpackError::Io {
        path: shown.to_string(),
        source,
    })?;
    Ok(true)
}

/// Owner, then mode (chown clears set-id bits), then extended attributes (chown also clears
/// `security.capability`).
fn set_attrs(fd: BorrowedFd<'_>, a: &Attrs, shown: &str) -> Result<(), UnpackError> {
    let io = |source: io::Error| UnpackError::Io {
        path: shown.to_string(),
        source,
    };
    fchown(fd, Some(Uid::from_raw(a.uid)), Some(Gid::from_raw(a.gid))).map_err(|e| io(e.into()))?;
    fchmod(fd, Mode::from_bits_truncate(a.mode)).map_err(|e| io(e.into()))?;
    for (name, value) in &a.xattrs {
        if name.starts_with(b"trusted.overlay.") {
            tracing::debug!(path = shown, "dropping overlay attribute from layer");
            continue;
        }
        if let Err(e) = sys::fsetxattr(fd, name, value) {
            if e.raw_os_error() == Some(libc::EOPNOTSUPP) {
                tracing::debug!(path = shown, attr = %String::from_utf8_lossy(name), "filesystem does not support this attribute");
                continue;
            }
            return Err(io(e));
        }
    }
    Ok(())
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};

    fn is_root() -> bool {
        nix::unistd::geteuid().is_root()
    }

    /// A tar builder that writes names verbatim, so hostile names can be expressed.
    pub(crate) struct Layer(tar::Builder<Vec<u8>>);

    impl Layer {
        pub(crate) fn new() -> Layer {
            Layer(tar::Builder::new(Vec::new()))
        }
        pub(crate) fn entry(
            &mut self,
            name: &str,
            kind: EntryType,
            data: &[u8],
            link: Option<&str>,
            mode: u32,
        ) -> &mut Self {
            let mut h = tar::Header::new_gnu();
            let gnu = h.as_gnu_mut().unwrap();
            gnu.name[..name.len()].copy_from_slice(name.as_bytes());
            if let Some(l) = link {
                gnu.linkname[..l.len()].copy_from_slice(l.as_bytes());
            }
            h.set_entry_type(kind);
            h.set_size(data.len() as u64);
            h.set_mode(mode);
            h.set_uid(nix::unistd::geteuid().as_raw().into());
            h.set_gid(nix::unistd::getegid().as_raw().into());
            h.set_mtime(1_600_000_000);
            h.set_cksum();
            self.0.append(&h, data).unwrap();
            self
        }
        pub(crate) fn file(&mut self, name: &str, data: &[u8]) -> &mut Self {
            self.entry(name, EntryType::Regular, data, None, 0o644)
        }
        pub(crate) fn dir(&mut self, name: &str) -> &mut Self {
            self.entry(name, EntryType::Directory, b"", None, 0o755)
        }
        pub(crate) fn symlink(&mut self, name: &str, target: &str) -> &mut Self {
            self.entry(name, EntryType::Symlink, b"", Some(target), 0o777)
        }
        pub(crate) fn hardlink(&mut self, name: &str, target: &str) -> &mut Self {
            self.entry(name, EntryType::Link, b"", Some(target), 0o644)
        }
        pub(crate) fn bytes(&mut self) -> Vec<u8> {
            std::mem::replace(&mut self.0, tar::Builder::new(Vec::new()))
                .into_inner()
                .unwrap()
        }
    }

    struct Case {
        _tmp: tempfile::TempDir,
        layer: PathBuf,
        outside: PathBuf,
    }

    fn case() -> Case {
        let tmp = tempfile::tempdir().unwrap();
        let layer = tmp.path().join("layer");
        let outside = tmp.path().join("outside");
        std::fs::create_dir(&layer).unwrap();
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("target"), b"original").unwrap();
        Case {
            _tmp: tmp,
            layer,
            outside,
        }
    }

    fn run(c: &Case, tar: &[u8]) -> Result<UnpackStats, UnpackError> {
        unpack(tar, &c.layer, &UnpackOptions::default())
    }

    fn assert_rejected(result: Result<UnpackStats, UnpackError>, want: &str) {
        match result {
            Err(UnpackError::Rejected { reason, .. }) => {
                assert!(
                    reason.contains(want),
                    "reason {reason:?} should mention {want:?}"
                )
            }
            other => panic!("expected rejection ({want}), got {other:?}"),
        }
    }

    fn outside_untouched(c: &Case) {
        assert_eq!(
            std::fs::read(c.outside.join("target")).unwrap(),
            b"original"
        );
        assert_eq!(std::fs::read_dir(&c.outside).unwrap().count(), 1);
    }

    #[test]
    fn rejects_parent_dir_components() {
        let c = case();
        assert_rejected(
            run(&c, &Layer::new().file("../outside/target", b"evil").bytes()),
            "..",
        );
        assert_rejected(
            run(&c, &Layer::new().file("a/../../x", b"evil").bytes()),
            "..",
        );
        outside_untouched(&c);
    }

    #[test]
    fn absolute_paths_stay_in_the_layer() {
        let c = case();
        let name = format!("{}/target", c.outside.display());
        let tar = Layer::new()
            .file(&name, b"inside")
            .file("/etc/passwd", b"root")
            .hardlink("/etc/passwd-", "/etc/passwd")
            .bytes();
        run(&c, &tar).unwrap();
        outside_untouched(&c);
        let inside = c.layer.join(name.trim_start_matches('/'));
        assert_eq!(std::fs::read(inside).unwrap(), b"inside");
        let passwd = std::fs::metadata(c.layer.join("etc/passwd")).unwrap();
        let linked = std::fs::metadata(c.layer.join("etc/passwd-")).unwrap();
        use std::os::unix::fs::MetadataExt;
        assert_eq!((passwd.ino(), passwd.nlink()), (linked.ino(), 2));
    }

    #[test]
    fn rejects_writes_through_a_symlink() {
        let c = case();
        let outside = c.outside.display().to_string();
        let tar = Layer::new()
            .symlink("link", &outside)
            .file("link/target", b"evil")
            .bytes();
        assert_rejected(run(&c, &tar), "symlink");
        outside_untouched(&c);
    }

    #[test]
    fn rejects_relative_symlink_escape() {
        let c = case();
        let tar = Layer::new()
            .symlink("up", "..")
            .file("up/outside/target", b"evil")
            .bytes();
        assert_rejected(run(&c, &tar), "symlink");
        outside_untouched(&c);
    }

    #[test]
    fn rejects_directory_entry_through_symlink() {
        let c = case();
        let outside = c.outside.display().to_string();
        let tar = Layer::new()
            .symlink("link", &outside)
            .dir("link/newdir/")
            .bytes();
        assert_rejected(run(&c, &tar), "symlink");
        outside_untouched(&c);
    }

    #[test]
    fn rejects_hardlink_escapes() {
        let c = case();
        assert_rejected(
            run(&c, &Layer::new().hardlink("h", "../outside/target").bytes()),
            "..",
        );
        // An absolute target names the layer's own file, never the host's.
        let abs = format!("{}/target", c.outside.display());
        let stats = run(&c, &Layer::new().hardlink("h", &abs).bytes()).unwrap();
        assert_rejected(
            super::super::copyup::copy_up(&c.layer, &stats.lower_links, &[]),
            "in no layer",
        );
        let outside = c.outside.display().to_string();
        let tar = Layer::new()
            .symlink("link", &outside)
            .hardlink("h", "link/target")
            .bytes();
        assert_rejected(run(&c, &tar), "symlink");
        // A target this layer does not hold is left for the copy-up from lower layers, which
        // refuses it when no layer has it.
        let stats = run(&c, &Layer::new().hardlink("h2", "missing").bytes()).unwrap();
        assert_eq!(stats.lower_links.len(), 1);
        assert_rejected(
            super::super::copyup::copy_up(&c.layer, &stats.lower_links, &[]),
            "in no layer",
        );
        outside_untouched(&c);
    }

    #[test]
    fn rejects_device_nodes_unless_allowed() {
        let c = case();
        let tar = Layer::new()
            .entry("dev/sda", EntryType::Block, b"", None, 0o600)
            .bytes();
        assert_rejected(run(&c, &tar), "device node");
        let tar = Layer::new()
            .entry("null", EntryType::Char, b"", None, 0o666)
            .bytes();
        assert_rejected(run(&c, &tar), "device node");
    }

    #[test]
    fn rejects_whiteout_of_parent() {
        let c = case();
        assert_rejected(
            run(
                &c,
                &Layer::new()
                    .entry(".wh...", EntryType::Regular, b"", None, 0)
                    .bytes(),
            ),
            "whiteout",
        );
    }

    #[test]
    fn file_replaces_symlink_without_following_it() {
        let c = case();
        let target = format!("{}/target", c.outside.display());
        let tar = Layer::new()
            .symlink("f", &target)
            .file("f", b"inside")
            .bytes();
        run(&c, &tar).unwrap();
        outside_untouched(&c);
        assert_eq!(std::fs::read(c.layer.join("f")).unwrap(), b"inside");
    }

    #[test]
    fn regular_layer_contents() {
        let c = case();
        let tar = Layer::new()
            .dir("./")
            .dir("etc/")
            .file("etc/hostname", b"box\n")
            .entry("bin/tool", EntryType::Regular, b"#!/bin/sh\n", None, 0o755)
            .symlink("bin/sh", "tool")
            .hardlink("bin/tool2", "bin/tool")
            .entry("run/fifo", EntryType::Fifo, b"", None, 0o600)
            .dir("etc/") // a repeated directory keeps its contents
            .bytes();
        let stats = run(&c, &tar).unwrap();
        assert_eq!(stats.size, 14);
        let l = &c.layer;
        assert_eq!(std::fs::read(l.join("etc/hostname")).unwrap(), b"box\n");
        assert_eq!(
            std::fs::read_link(l.join("bin/sh")).unwrap(),
            PathBuf::from("tool")
        );
        let tool = std::fs::metadata(l.join("bin/tool")).unwrap();
        assert_eq!(tool.permissions().mode() & 0o7777, 0o755);
        assert_eq!(tool.nlink(), 2);
        assert_eq!(tool.mtime(), 1_600_000_000);
        assert!(
            std::fs::metadata(l.join("run/fifo"))
                .unwrap()
                .file_type()
                .is_fifo()
        );
        assert_eq!(
            std::fs::metadata(l.join("etc")).unwrap().mtime(),
            1_600_000_000
        );
        // the implicit parent "run" was created
        assert!(l.join("run").is_dir());
    }

    #[test]
    fn file_replaces_directory_and_directory_replaces_file() {
        let c = case();
        let tar = Layer::new()
            .dir("a/")
            .file("a/x", b"1")
            .file("a", b"now a file")
            .dir("b")
            .bytes();
        let tar2 = Layer::new()
            .file("b", b"x")
            .dir("b/")
            .file("b/y", b"2")
            .bytes();
        run(&c, &tar).unwrap();
        assert_eq!(std::fs::read(c.layer.join("a")).unwrap(), b"now a file");
        let c2 = case();
        run(&c2, &tar2).unwrap();
        assert_eq!(std::fs::read(c2.layer.join("b/y")).unwrap(), b"2");
    }

    #[test]
    fn whiteouts_become_overlay_whiteouts() {
        if !is_root() {
            eprintln!("skipped: whiteouts need CAP_MKNOD and trusted xattrs (root)");
            return;
        }
        let c = case();
        let tar = Layer::new()
            .entry("etc/.wh.passwd", EntryType::Regular, b"", None, 0o600)
            .entry(
                "var/cache/.wh..wh..opq",
                EntryType::Regular,
                b"",
                None,
                0o600,
            )
            .entry(".wh..wh.plnk", EntryType::Directory, b"", None, 0o700)
            .bytes();
        run(&c, &tar).unwrap();
        let wh = std::fs::symlink_metadata(c.layer.join("etc/passwd")).unwrap();
        assert!(wh.file_type().is_char_device());
        assert_eq!(wh.rdev(), 0);
        let dir = File::open(c.layer.join("var/cache")).unwrap();
        assert_eq!(
            sys::fgetxattr(&dir, OPAQUE_XATTR).unwrap(),
            Some(b"y".to_vec())
        );
        assert!(!c.layer.join(".wh..wh.plnk").exists());
        assert!(!c.layer.join("var/cache/.wh..wh..opq").exists());
    }

    #[test]
    fn ownership_setid_and_xattrs() {
        if !is_root() {
            eprintln!("skipped: ownership needs root");
            return;
        }
        let c = case();
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_ustar();
        h.set_path("usr/bin/su").unwrap();
        h.set_size(3);
        h.set_mode(0o4755);
        h.set_uid(0);
        h.set_gid(0);
        h.set_entry_type(EntryType::Regular);
        h.set_cksum();
        b.append_pax_extensions([
            ("SCHILY.xattr.user.note", &b"hi"[..]),
            ("SCHILY.xattr.trusted.overlay.redirect", &b"/etc"[..]),
            ("uid", &b"1234"[..]),
        ])
        .unwrap();
        b.append(&h, &b"elf"[..]).unwrap();
        let tar = b.into_inner().unwrap();
        run(&c, &tar).unwrap();
        let path = c.layer.join("usr/bin/su");
        let m = std::fs::metadata(&path).unwrap();
        assert_eq!(m.uid(), 1234);
        assert_eq!(m.permissions().mode() & 0o7777, 0o4755);
        let f = File::open(&path).unwrap();
        assert_eq!(
            sys::fgetxattr(&f, b"user.note").unwrap(),
            Some(b"hi".to_vec())
        );
        assert_eq!(
            sys::fgetxattr(&f, b"trusted.overlay.redirect").unwrap(),
            None
        );
    }

    #[test]
    fn garbage_is_not_a_tar() {
        let c = case();
        let junk = vec![0x55u8; 1024];
        assert!(matches!(run(&c, &junk), Err(UnpackError::Tar(_))));
    }
}
