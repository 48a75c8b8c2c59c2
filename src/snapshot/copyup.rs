//! Hardlinks to files that only a lower layer holds. Some builders write a layer whose tar links
//! a name to a file an earlier layer added; GNU tar unpacks such a layer onto the merged root,
//! where the target is. Overlay layers cannot share an inode across layers, so the file is
//! copied up instead: content, owner, mode, extended attributes and modification time, from the
//! topmost lower layer that holds it, unless a whiteout or an opaque directory hides it there.
//! The layer being unpacked records such links (`LowerLink`) and this runs once its parent
//! snapshots are committed. Lower layers are crius's own snapshots, but a path through a
//! symlink in them is refused all the same: it would resolve differently in the merged view.

use std::ffi::OsString;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, OpenHow, openat, openat2};
use nix::sys::stat::{FileStat, Mode, SFlag, fchmod, fstat, fstatat, futimens};
use nix::sys::time::TimeSpec;
use nix::unistd::{Gid, Uid, fchown, linkat, symlinkat};

use super::LowerLink;
use super::unpack::{
    Dirs, OPAQUE_XATTR, UnpackError, UnpackStats, beneath, chown_nofollow, rejected,
};
use crate::sys;

fn kind(st: &FileStat) -> SFlag {
    SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT
}

fn is_whiteout(st: &FileStat) -> bool {
    kind(st) == SFlag::S_IFCHR && st.st_rdev == 0
}

/// Where a path stands in one layer.
enum Found {
    /// Not in this layer; look further down unless an opaque directory on the way said not to.
    Absent { opaque: bool },
    /// A whiteout on the path: the file was deleted here.
    Deleted,
    /// The file itself (not a directory), with its parent directory.
    File { dir: OwnedFd, stat: FileStat },
}

/// Looks `comps` up in the layer at `root`, directory by directory.
fn look_up(root: BorrowedFd<'_>, comps: &[OsString], shown: &str) -> Result<Found, UnpackError> {
    let Some((name, parents)) = comps.split_last() else {
        return Err(rejected(shown, "hardlink to the layer root"));
    };
    let how = || {
        OpenHow::new()
            .flags(OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC)
            .resolve(beneath())
    };
    let mut dir = openat2(root, ".", how()).map_err(|e| Dirs::map_err(e, shown))?;
    let mut opaque = false;
    for comp in parents {
        let st = match fstatat(dir.as_fd(), comp.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(Errno::ENOENT) => return Ok(Found::Absent { opaque }),
            Err(e) => return Err(Dirs::map_err(e, shown)),
        };
        match kind(&st) {
            _ if is_whiteout(&st) => return Ok(Found::Deleted),
            SFlag::S_IFDIR => {}
            SFlag::S_IFLNK => {
                return Err(rejected(shown, "hardlink target goes through a symlink"));
            }
            _ => return Ok(Found::Absent { opaque }),
        }
        dir = openat2(dir.as_fd(), comp.as_os_str(), how()).map_err(|e| Dirs::map_err(e, shown))?;
        // An opaque directory hides what layers below hold under it.
        let rd = opened_dir(dir.as_fd(), shown)?;
        if sys::fgetxattr(rd.as_fd(), OPAQUE_XATTR)
            .ok()
            .flatten()
            .is_some_and(|v| v == b"y")
        {
            opaque = true;
        }
    }
    match fstatat(dir.as_fd(), name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) if is_whiteout(&st) => Ok(Found::Deleted),
        Ok(st) if kind(&st) == SFlag::S_IFDIR => Err(rejected(shown, "hardlink to a directory")),
        Ok(stat) => Ok(Found::File { dir, stat }),
        Err(Errno::ENOENT) => Ok(Found::Absent { opaque }),
        Err(e) => Err(Dirs::map_err(e, shown)),
    }
}

/// A directory held by an `O_PATH` handle, opened for reading its attributes.
fn opened_dir(dir: BorrowedFd<'_>, shown: &str) -> Result<OwnedFd, UnpackError> {
    let how = OpenHow::new()
        .flags(OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC)
        .resolve(beneath());
    openat2(dir, ".", how).map_err(|e| Dirs::map_err(e, shown))
}

/// Makes every link of `links`, in order, in the layer at `dest` (unpacked, not yet
/// committed) from the layers `lowers` below it (topmost first). A name the layer itself wrote
/// later is left alone; a target the layer holds by now is linked as usual.
pub fn copy_up(
    dest: &Path,
    links: &[LowerLink],
    lowers: &[PathBuf],
) -> Result<UnpackStats, UnpackError> {
    let mut dirs = Dirs::open(dest)?;
    let roots: Vec<OwnedFd> = lowers
        .iter()
        .map(|l| {
            nix::fcntl::open(
                l,
                OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW,
                Mode::empty(),
            )
            .map_err(|e| UnpackError::Io {
                path: l.display().to_string(),
                source: e.into(),
            })
        })
        .collect::<Result<_, _>>()?;
    let mut stats = UnpackStats::default();
    for link in links {
        let shown = link.shown.as_str();
        let io = |source: io::Error| UnpackError::Io {
            path: shown.to_string(),
            source,
        };
        let Some((name, parents)) = link.name.split_last() else {
            return Err(rejected(shown, "hardlink at the layer root"));
        };
        // Written again later in the layer: that entry wins.
        if let Found::File { .. } = look_up(dirs.root.as_fd(), &link.name, shown)? {
            continue;
        }
        // The layer's own copy first, then the layers below, top down.
        let mut source = None;
        let mut hidden = false;
        for (i, root) in std::iter::once(&dirs.root).chain(&roots).enumerate() {
            match look_up(root.as_fd(), &link.target, shown)? {
                Found::File { dir, stat } => {
                    source = Some((i == 0, dir, stat));
                    break;
                }
                Found::Deleted => {
                    hidden = true;
                    break;
                }
                Found::Absent { opaque: true } => {
                    hidden = true;
                    break;
                }
                Found::Absent { opaque: false } => {}
            }
        }
        let Some((own, tdir, stat)) = source else {
            return Err(rejected(
                shown,
                if hidden {
                    "hardlink target was deleted by a whiteout"
                } else {
                    "hardlink target is in no layer"
                },
            ));
        };
        let tname = link
            .target
            .last()
            .map(OsString::as_os_str)
            .unwrap_or_default();
        let pfd = dirs.cleared_parent(parents, name, shown)?;
        if own {
            linkat(tdir.as_fd(), tname, pfd, name.as_os_str(), AtFlags::empty())
                .map_err(|e| io(e.into()))?;
            continue;
        }
        let copied = copy_file(tdir.as_fd(), tname, &stat, pfd, name, shown)?;
        stats.size += copied;
        stats.inodes += 1;
    }
    Ok(stats)
}

/// Copies the file `tname` in `tdir` (a lower layer's) to `name` in `dir`.
fn copy_file(
    tdir: BorrowedFd<'_>,
    tname: &std::ffi::OsStr,
    stat: &FileStat,
    dir: BorrowedFd<'_>,
    name: &std::ffi::OsStr,
    shown: &str,
) -> Result<u64, UnpackError> {
    let io = |source: io::Error| UnpackError::Io {
        path: shown.to_string(),
        source,
    };
    if kind(stat) == SFlag::S_IFLNK {
        // A link to a symlink is another symlink with the same target.
        let target = nix::fcntl::readlinkat(tdir, tname).map_err(|e| io(e.into()))?;
        symlinkat(target.as_os_str(), dir, name).map_err(|e| io(e.into()))?;
        chown_nofollow(dir, name, stat.st_uid, stat.st_gid).map_err(|e| io(e.into()))?;
        return Ok(0);
    }
    if kind(stat) != SFlag::S_IFREG {
        return Err(rejected(
            shown,
            "hardlink to a special file of a lower layer",
        ));
    }
    let from = openat(
        tdir,
        tname,
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| io(e.into()))?;
    let mut from = File::from(from);
    // The same file still: nothing replaced it between the look-up and the open.
    let now = fstat(&from).map_err(|e| io(e.into()))?;
    if (now.st_dev, now.st_ino) != (stat.st_dev, stat.st_ino) {
        return Err(rejected(shown, "hardlink target changed while copying"));
    }
    let to = openat(
        dir,
        name,
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o600),
    )
    .map_err(|e| io(e.into()))?;
    let mut to = File::from(to);
    let copied = io::copy(&mut from, &mut to).map_err(io)?;
    // Owner, then mode (chown clears set-id bits), then attributes (chown also clears
    // security.capability), as for any unpacked file.
    fchown(
        &to,
        Some(Uid::from_raw(stat.st_uid)),
        Some(Gid::from_raw(stat.st_gid)),
    )
    .map_err(|e| io(e.into()))?;
    fchmod(&to, Mode::from_bits_truncate(stat.st_mode & 0o7777)).map_err(|e| io(e.into()))?;
    for attr in sys::flistxattr(&from).map_err(io)? {
        if attr.starts_with(b"trusted.overlay.") {
            continue;
        }
        if let Some(value) = sys::fgetxattr(&from, &attr).map_err(io)?
            && let Err(e) = sys::fsetxattr(&to, &attr, &value)
            && e.raw_os_error() != Some(libc::EOPNOTSUPP)
        {
            return Err(io(e));
        }
    }
    let mtime = TimeSpec::new(stat.st_mtime, stat.st_mtime_nsec);
    futimens(&to, &mtime, &mtime).map_err(|e| io(e.into()))?;
    Ok(copied)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    use super::*;
    use crate::snapshot::unpack::tests::Layer;
    use crate::snapshot::unpack::{UnpackOptions, unpack};

    /// Unpacks `tar` as the layer above `lowers` (topmost first), copy-up included.
    fn layer(dir: &Path, tar: &[u8], lowers: &[PathBuf]) -> Result<UnpackStats, UnpackError> {
        std::fs::create_dir_all(dir).unwrap();
        let stats = unpack(tar, dir, &UnpackOptions::default())?;
        let up = copy_up(dir, &stats.lower_links, lowers)?;
        Ok(UnpackStats {
            size: stats.size + up.size,
            inodes: stats.inodes + up.inodes,
            lower_links: Vec::new(),
        })
    }

    fn rejected_with(r: Result<UnpackStats, UnpackError>, want: &str) {
        match r {
            Err(UnpackError::Rejected { reason, .. }) => assert!(reason.contains(want), "{reason}"),
            other => panic!("expected {want:?}, got {other:?}"),
        }
    }

    #[test]
    fn hardlinks_to_lower_files_are_copied_up() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: whiteouts need CAP_MKNOD and trusted xattrs (root)");
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let (l1, l2, l3) = (
            tmp.path().join("1"),
            tmp.path().join("2"),
            tmp.path().join("3"),
        );
        layer(
            &l1,
            &Layer::new()
                .file("usr/bin/tool", b"old")
                .file("etc/gone", b"x")
                .file("opaque/hidden", b"x")
                .bytes(),
            &[],
        )
        .unwrap();
        // The middle layer changes the tool, deletes one file, and makes a directory opaque.
        layer(
            &l2,
            &Layer::new()
                .file("usr/bin/tool", b"tool v2")
                .file("etc/.wh.gone", b"")
                .dir("opaque/")
                .file("opaque/.wh..wh..opq", b"")
                .bytes(),
            std::slice::from_ref(&l1),
        )
        .unwrap();
        std::fs::set_permissions(l2.join("usr/bin/tool"), PermissionsExt::from_mode(0o751))
            .unwrap();
        sys::fsetxattr(
            File::open(l2.join("usr/bin/tool")).unwrap(),
            b"user.crius",
            b"kept",
        )
        .ok();
        let lowers = [l2.clone(), l1.clone()];
        // Links to the middle layer's file, through an absolute target too; a link to a file
        // the layer writes later in its own tar is an ordinary link.
        let stats = layer(
            &l3,
            &Layer::new()
                .hardlink("usr/bin/alias", "/usr/bin/tool")
                .hardlink("deep/new/alias", "usr/bin/tool")
                .hardlink("mine-link", "mine")
                .file("mine", b"own")
                .bytes(),
            &lowers,
        )
        .unwrap();
        for alias in ["usr/bin/alias", "deep/new/alias"] {
            let p = l3.join(alias);
            assert_eq!(std::fs::read(&p).unwrap(), b"tool v2", "{alias}");
            let m = std::fs::metadata(&p).unwrap();
            assert_eq!(m.mode() & 0o7777, 0o751, "{alias}");
            let src = std::fs::metadata(l2.join("usr/bin/tool")).unwrap();
            assert_eq!(m.mtime(), src.mtime(), "{alias}");
            let kept = sys::fgetxattr(File::open(&p).unwrap(), b"user.crius").unwrap();
            let had = sys::fgetxattr(File::open(l2.join("usr/bin/tool")).unwrap(), b"user.crius")
                .unwrap();
            assert_eq!(kept, had, "{alias}");
        }
        assert_eq!(stats.size, 3 + 2 * b"tool v2".len() as u64);
        let mine = std::fs::metadata(l3.join("mine")).unwrap();
        assert_eq!(
            std::fs::metadata(l3.join("mine-link")).unwrap().ino(),
            mine.ino()
        );
        // Deleted or hidden by a layer in between: refused, naming why.
        rejected_with(
            layer(
                &tmp.path().join("4"),
                &Layer::new().hardlink("g", "etc/gone").bytes(),
                &lowers,
            ),
            "deleted",
        );
        rejected_with(
            layer(
                &tmp.path().join("5"),
                &Layer::new().hardlink("h", "opaque/hidden").bytes(),
                &lowers,
            ),
            "deleted",
        );
        rejected_with(
            layer(
                &tmp.path().join("6"),
                &Layer::new().hardlink("n", "nowhere").bytes(),
                &lowers,
            ),
            "in no layer",
        );
    }

    #[test]
    fn copy_up_never_follows_symlinks() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("secret"), b"host").unwrap();
        let l1 = tmp.path().join("1");
        layer(
            &l1,
            &Layer::new()
                .symlink("escape", &outside.display().to_string())
                .symlink("rel", "../..")
                .bytes(),
            &[],
        )
        .unwrap();
        let lowers = [l1.clone()];
        rejected_with(
            layer(
                &tmp.path().join("2"),
                &Layer::new().hardlink("x", "escape/secret").bytes(),
                &lowers,
            ),
            "symlink",
        );
        rejected_with(
            layer(
                &tmp.path().join("3"),
                &Layer::new().hardlink("y", "rel/outside/secret").bytes(),
                &lowers,
            ),
            "symlink",
        );
        // A link to the symlink itself is another symlink with the same target.
        layer(
            &tmp.path().join("4"),
            &Layer::new().hardlink("esc2", "escape").bytes(),
            &lowers,
        )
        .unwrap();
        assert_eq!(
            std::fs::read_link(tmp.path().join("4/esc2")).unwrap(),
            outside
        );
        assert_eq!(std::fs::read(outside.join("secret")).unwrap(), b"host");
    }
}
