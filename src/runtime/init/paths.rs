//! Paths the init guards by descriptor: no mount may land in `/proc` but the files lxcfs emulates
//! (CVE-2025-52881, CVE-2019-16884: a volume there would receive the runtime's procfs writes);
//! masked paths get the host's `/dev/null`, taken and checked before `pivot_root`, or an empty
//! read-only tmpfs (CVE-2025-31133: never `/dev/null` by name from the container's `/dev`); and
//! read-only paths a read-only copy of their own mount. Each target is opened once, inside the
//! root without magic links, and the mount goes onto that open file with the new mount API, so
//! nothing the container can change is walked twice.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{OFlag, OpenHow, ResolveFlag, openat2};
use nix::sys::stat::{SFlag, makedev};

use super::InitError;
use crate::runtime::mounts::PROC_MOUNTABLE;
use crate::runtime::procfs::{self, ProcRef};
use crate::runtime::step::step as fail;
use crate::sys;

/// Refuses a mount target that lies on procfs, unless it is one of the files lxcfs emulates;
/// `root` is the rootfs's real path, `step` names the mount.
pub(super) fn refuse_into_proc(
    proc: ProcRef<'_>,
    root: &Path,
    target: &OwnedFd,
    step: &str,
) -> Result<(), InitError> {
    if !procfs::on_procfs(target).map_err(fail(step))? {
        return Ok(());
    }
    let at = proc.fd_target(target.as_raw_fd()).map_err(fail(step))?;
    let inside = at
        .strip_prefix(root)
        .map(|p| format!("/{}", p.display()))
        .unwrap_or_else(|_| at.display().to_string());
    if PROC_MOUNTABLE.contains(&inside.as_str()) {
        return Ok(());
    }
    Err(InitError {
        step: step.into(),
        detail: format!(
            "it lands in /proc ({inside}), where only the files lxcfs emulates may be mounted"
        ),
    })
}

/// `count` detached copies of the host's `/dev/null`, each checked to be the 1:3 character
/// device; made before `pivot_root`, while the host's tree is the one resolved.
pub(super) fn null_mounts(count: usize) -> Result<Vec<OwnedFd>, InitError> {
    let step = "the host's /dev/null for masks";
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        let tree = sys::open_tree_clone(Path::new("/dev/null"), false).map_err(fail(step))?;
        let st = nix::sys::stat::fstat(tree.as_fd()).map_err(fail(step))?;
        let kind = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT;
        if kind != SFlag::S_IFCHR || st.st_rdev != makedev(1, 3) {
            return Err(InitError {
                step: step.into(),
                detail: "it is not the null device (1:3)".into(),
            });
        }
        out.push(tree);
    }
    Ok(out)
}

/// Opens `path` inside the new root (after `pivot_root`), following only the root's own links.
fn open_target(path: &str) -> Result<Option<OwnedFd>, InitError> {
    match openat2(
        nix::fcntl::AT_FDCWD,
        path,
        OpenHow::new()
            .flags(OFlag::O_PATH | OFlag::O_CLOEXEC)
            .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS),
    ) {
        Ok(fd) => Ok(Some(fd)),
        Err(Errno::ENOENT) => Ok(None),
        Err(e) => Err(fail(path)(e)),
    }
}

/// Masks each path: a directory under an empty read-only tmpfs, anything else under one of
/// `nulls` (from [`null_mounts`]).
pub(super) fn mask(paths: &[String], nulls: Vec<OwnedFd>) -> Result<(), InitError> {
    let mut nulls = nulls.into_iter();
    for path in paths {
        let step = format!("mask {path}");
        let Some(target) = open_target(path)? else {
            continue;
        };
        let st = nix::sys::stat::fstat(target.as_fd()).map_err(fail(&step))?;
        let cover = if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR {
            sys::new_mount("tmpfs", &[], sys::MOUNT_ATTR_RDONLY).map_err(fail(&step))?
        } else {
            nulls.next().ok_or_else(|| InitError {
                step: step.clone(),
                detail: "no /dev/null left".into(),
            })?
        };
        sys::move_mount(&cover, &target).map_err(fail(&step))?;
    }
    Ok(())
}

/// Makes `path` read-only: a read-only copy of the mount tree there, put over it.
pub(super) fn read_only(path: &str) -> Result<(), InitError> {
    let step = format!("read-only {path}");
    let Some(target) = open_target(path)? else {
        return Ok(());
    };
    let tree = sys::open_tree_at(&target, true).map_err(fail(&step))?;
    sys::mount_setattr(&tree, sys::MOUNT_ATTR_RDONLY, None, true).map_err(fail(&step))?;
    sys::move_mount(&tree, &target).map_err(fail(&step))
}
