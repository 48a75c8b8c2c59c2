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
//! tar itself are dropped, since they would steer overlayfs. A whiteout hides the lower layers
//! only, as the OCI spec says: a directory of this layer's that it names, or one this layer makes
//! again after it, becomes opaque, so the lower files stay hidden and this layer's show.

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
                // ENOTDIR: perhaps a whiteout of this layer's on the way, made a directory again.
                Err(Errno::ENOENT | Errno::ENOTDIR) => self.create(comps, shown)?,
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
            // A parent this layer whited out is made again as an opaque directory (the OCI
            // whiteout hides the lower one, not what this layer puts there).
            let after_whiteout = is_whiteout_at(cur.as_fd(), comp);
            if after_whiteout {
                unlinkat(cur.as_fd(), comp.as_os_str(), UnlinkatFlags::NoRemoveDir)
                    .map_err(|e| Self::map_err(e, shown))?;
            }
            match mkdirat(
                cur.as_fd(),
                comp.as_os_str(),
                Mode::from_bits_truncate(0o755),
            ) {
                Ok(()) | Err(Errno::EEXIST) => {}
                Err(e) => return Err(Self::map_err(e, shown)),
            }
            if after_whiteout {
                let dir = openat2(
                    cur.as_fd(),
                    comp.as_os_str(),
                    OpenHow::new()
                        .flags(OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC)
                        .resolve(beneath()),
                )
                .map_err(|e| Self::map_err(e, shown))?;
                sys::fsetxattr(dir.as_fd(), OPAQUE_XATTR, b"y").map_err(|source| {
                    UnpackError::Io {
                        path: shown.to_string(),
                        source,
                    }
                })?;
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

/// Whether `name` in `dir` is an overlay whiteout (a 0/0 character device).
fn is_whiteout_at(dir: BorrowedFd<'_>, name: &OsStr) -> bool {
    fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW).is_ok_and(|st| {
        SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFCHR && st.st_rdev == 0
    })
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
    let mut u = Unpacker {
        dirs: Dirs::open(dest)?,
        stats: UnpackStats::default(),
        dir_times: Vec::new(),
        opts,
    };

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
        let a = attrs(&mut entry).map_err(UnpackError::Tar)?;

        let Some((name, parents)) = comps.split_last() else {
            // The layer root itself ("./"): only its attributes matter.
            if kind == EntryType::Directory {
                let fd = u.dirs.open_dir(&[], &shown)?;
                set_attrs(fd.as_fd(), &a, &shown)?;
                u.dir_times.push((Vec::new(), a.mtime));
            }
            continue;
        };
        let m = Member {
            comps: &comps,
            name,
            parents,
            shown: &shown,
            attrs: &a,
        };
        if let Some(hidden) = name.as_bytes().strip_prefix(WHITEOUT_PREFIX.as_bytes()) {
            u.whiteout(&m, hidden)?;
            continue;
        }
        if u.member(&mut entry, kind, &m)? {
            u.stats.inodes += 1;
        }
    }
    u.set_dir_times()?;
    Ok(u.stats)
}

/// One unpacking under way: the layer's directory handles, what it added so far, and the
/// directories whose times are set last.
struct Unpacker<'o> {
    dirs: Dirs,
    stats: UnpackStats,
    dir_times: Vec<(Vec<OsString>, i64)>,
    opts: &'o UnpackOptions,
}

/// A tar member below the layer root: its path's components (its name last, after its
/// parents'), the path as errors show it, and its attributes.
struct Member<'a> {
    comps: &'a [OsString],
    name: &'a OsString,
    parents: &'a [OsString],
    shown: &'a str,
    attrs: &'a Attrs,
}

impl Member<'_> {
    /// An I/O error on this member.
    fn io(&self, source: io::Error) -> UnpackError {
        UnpackError::Io {
            path: self.shown.to_string(),
            source,
        }
    }
}

impl Unpacker<'_> {
    /// Makes one member that is not a whiteout, by its kind; returns whether it counts as an
    /// inode of the layer (a hardlink to a lower layer's file, or to itself, does not).
    fn member<R: Read>(
        &mut self,
        entry: &mut tar::Entry<'_, R>,
        kind: EntryType,
        m: &Member<'_>,
    ) -> Result<bool, UnpackError> {
        match kind {
            EntryType::Directory => self.directory(m)?,
            EntryType::Regular | EntryType::Continuous => self.regular(entry, m)?,
            EntryType::Symlink => self.symlink(entry, m)?,
            EntryType::Link => return self.hardlink(entry, m),
            EntryType::Char | EntryType::Block | EntryType::Fifo => self.node(entry, kind, m)?,
            EntryType::GNUSparse => {
                return Err(rejected(m.shown, "sparse files are not supported"));
            }
            _ => return Err(rejected(m.shown, "unsupported tar entry type")),
        }
        Ok(true)
    }

    /// A whiteout member (`.wh.` and the `hidden` name): the opaque marker makes its directory
    /// opaque, AUFS bookkeeping is skipped, any other hides the lower layers' `hidden`.
    fn whiteout(&mut self, m: &Member<'_>, hidden: &[u8]) -> Result<(), UnpackError> {
        let (parents, shown) = (m.parents, m.shown);
        if m.name.as_bytes() == OPAQUE_MARKER.as_bytes() {
            self.dirs.parent(parents, shown)?;
            let fd = self.dirs.open_dir(parents, shown)?;
            sys::fsetxattr(fd.as_fd(), OPAQUE_XATTR, b"y").map_err(|e| m.io(e))?;
        } else if hidden.starts_with(WHITEOUT_PREFIX.as_bytes()) {
            // Other `.wh..wh.` names are AUFS bookkeeping with no meaning here.
        } else {
            let hidden = OsStr::from_bytes(hidden);
            if hidden.is_empty() || hidden == "." || hidden == ".." {
                return Err(rejected(shown, "whiteout names no file"));
            }
            // A whiteout hides the lower layers' file only (OCI): what this layer already
            // made under the name stays, a directory turning opaque so that the lower
            // directory's files stay hidden below it.
            let pfd = self.dirs.parent(parents, shown)?;
            match fstatat(pfd, hidden, AtFlags::AT_SYMLINK_NOFOLLOW) {
                Err(Errno::ENOENT) => {
                    mknodat(pfd, hidden, SFlag::S_IFCHR, Mode::empty(), makedev(0, 0))
                        .map_err(|e| m.io(e.into()))?;
                    self.stats.inodes += 1;
                }
                Err(e) => return Err(m.io(e.into())),
                Ok(st)
                    if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR =>
                {
                    let mut path = parents.to_vec();
                    path.push(hidden.to_os_string());
                    let fd = self.dirs.open_dir(&path, shown)?;
                    sys::fsetxattr(fd.as_fd(), OPAQUE_XATTR, b"y").map_err(|e| m.io(e))?;
                }
                Ok(_) => {}
            }
        }
        Ok(())
    }

    /// A directory: kept when it exists (its attributes updated), opaque when this layer
    /// whited it out before; its time is set last.
    fn directory(&mut self, m: &Member<'_>) -> Result<(), UnpackError> {
        let (name, shown) = (m.name, m.shown);
        let pfd = self.dirs.parent(m.parents, shown)?;
        // Made again after this layer's whiteout of it: only what follows shows.
        let after_whiteout = is_whiteout_at(pfd, name);
        let removed_dir = clear(pfd, name, true, shown)?;
        match mkdirat(pfd, name.as_os_str(), Mode::from_bits_truncate(0o700)) {
            Ok(()) | Err(Errno::EEXIST) => {}
            Err(e) => return Err(m.io(e.into())),
        }
        if removed_dir {
            self.dirs.invalidate();
        }
        let fd = self.dirs.open_dir(m.comps, shown)?;
        set_attrs(fd.as_fd(), m.attrs, shown)?;
        if after_whiteout {
            sys::fsetxattr(fd.as_fd(), OPAQUE_XATTR, b"y").map_err(|e| m.io(e))?;
        }
        self.dir_times.push((m.comps.to_vec(), m.attrs.mtime));
        Ok(())
    }

    /// A regular file, created anew (`O_EXCL | O_NOFOLLOW`) and filled from the tar stream.
    fn regular<R: Read>(
        &mut self,
        entry: &mut tar::Entry<'_, R>,
        m: &Member<'_>,
    ) -> Result<(), UnpackError> {
        let (name, a, shown) = (m.name, m.attrs, m.shown);
        let pfd = self.dirs.cleared_parent(m.parents, name, shown)?;
        let fd = openat(
            pfd,
            name.as_os_str(),
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o600),
        )
        .map_err(|e| m.io(e.into()))?;
        let mut file = File::from(fd);
        let copied = io::copy(entry, &mut file).map_err(UnpackError::Tar)?;
        self.stats.size += copied;
        set_attrs(file.as_fd(), a, shown)?;
        futimens(&file, &timespec(a.mtime), &timespec(a.mtime)).map_err(|e| m.io(e.into()))?;
        Ok(())
    }

    /// A symlink, its target stored as given (never followed while unpacking).
    fn symlink<R: Read>(
        &mut self,
        entry: &mut tar::Entry<'_, R>,
        m: &Member<'_>,
    ) -> Result<(), UnpackError> {
        let (name, a, shown) = (m.name, m.attrs, m.shown);
        let target = entry
            .link_name_bytes()
            .ok_or_else(|| rejected(shown, "symlink without a target"))?
            .into_owned();
        let pfd = self.dirs.cleared_parent(m.parents, name, shown)?;
        // The target is stored as given: it is never followed while unpacking.
        symlinkat(OsStr::from_bytes(&target), pfd, name.as_os_str()).map_err(|e| m.io(e.into()))?;
        chown_nofollow(pfd, name, a.uid, a.gid).map_err(|e| m.io(e.into()))?;
        utimensat(
            pfd,
            name.as_os_str(),
            &timespec(a.mtime),
            &timespec(a.mtime),
            UtimensatFlags::NoFollowSymlink,
        )
        .map_err(|e| m.io(e.into()))?;
        Ok(())
    }

    /// A hardlink to a file this layer already holds; one to a file no earlier member wrote is
    /// left for `copyup` (a lower layer's). Returns whether a link was made.
    fn hardlink<R: Read>(
        &mut self,
        entry: &mut tar::Entry<'_, R>,
        m: &Member<'_>,
    ) -> Result<bool, UnpackError> {
        let shown = m.shown;
        let target_raw = entry
            .link_name()
            .map_err(UnpackError::Tar)?
            .ok_or_else(|| rejected(shown, "hardlink without a target"))?
            .into_owned();
        let target = components(&target_raw, shown)?;
        let Some((tname, tparents)) = target.split_last() else {
            return Err(rejected(shown, "hardlink to the layer root"));
        };
        // A target no earlier entry of this layer wrote is a lower layer's file: it is
        // copied up once the layers below are in place (see `copyup`).
        let lower = || LowerLink {
            name: m.comps.to_vec(),
            target: target.clone(),
            shown: shown.to_string(),
        };
        let tdir = if tparents.is_empty() {
            self.dirs.open_dir(&[], shown)?
        } else {
            let how = OpenHow::new()
                .flags(OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC)
                .resolve(beneath());
            match openat2(self.dirs.root.as_fd(), &join(tparents), how) {
                Ok(fd) => fd,
                Err(Errno::ENOENT) => {
                    self.stats.lower_links.push(lower());
                    return Ok(false);
                }
                Err(e) => return Err(Dirs::map_err(e, shown)),
            }
        };
        let tstat = match fstatat(
            tdir.as_fd(),
            tname.as_os_str(),
            AtFlags::AT_SYMLINK_NOFOLLOW,
        ) {
            Ok(st) => st,
            Err(Errno::ENOENT) => {
                self.stats.lower_links.push(lower());
                return Ok(false);
            }
            Err(e) => return Err(m.io(e.into())),
        };
        if SFlag::from_bits_truncate(tstat.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR {
            return Err(rejected(shown, "hardlink to a directory"));
        }
        if m.comps == target.as_slice() {
            return Ok(false); // a link to itself (its directory opened above): nothing to do
        }
        let pfd = self.dirs.cleared_parent(m.parents, m.name, shown)?;
        linkat(
            tdir.as_fd(),
            tname.as_os_str(),
            pfd,
            m.name.as_os_str(),
            AtFlags::empty(),
        )
        .map_err(|e| m.io(e.into()))?;
        Ok(true)
    }

    /// A FIFO, or a character or block device node when the options allow them.
    fn node<R: Read>(
        &mut self,
        entry: &mut tar::Entry<'_, R>,
        kind: EntryType,
        m: &Member<'_>,
    ) -> Result<(), UnpackError> {
        let (name, a, shown) = (m.name, m.attrs, m.shown);
        let (sflag, dev) = match kind {
            EntryType::Fifo => (SFlag::S_IFIFO, 0),
            _ => {
                if !self.opts.allow_device_nodes {
                    return Err(rejected(
                        shown,
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
        let pfd = self.dirs.cleared_parent(m.parents, name, shown)?;
        mknodat(pfd, name.as_os_str(), sflag, Mode::empty(), dev).map_err(|e| m.io(e.into()))?;
        chown_nofollow(pfd, name, a.uid, a.gid).map_err(|e| m.io(e.into()))?;
        // The name was just created as a node, not a symlink, in a directory no one else
        // writes to, so following is moot.
        fchmodat(
            pfd,
            name.as_os_str(),
            Mode::from_bits_truncate(a.mode),
            FchmodatFlags::FollowSymlink,
        )
        .map_err(|e| m.io(e.into()))?;
        Ok(())
    }

    /// Directory times last, deepest first, once nothing more is created inside them.
    fn set_dir_times(&self) -> Result<(), UnpackError> {
        for (comps, mtime) in self.dir_times.iter().rev() {
            let shown = join(comps).display().to_string();
            if let Ok(fd) = self.dirs.open_dir(comps, &shown) {
                futimens(&fd, &timespec(*mtime), &timespec(*mtime)).map_err(|e| {
                    UnpackError::Io {
                        path: shown,
                        source: e.into(),
                    }
                })?;
            }
        }
        Ok(())
    }
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
pub(super) mod tests;
