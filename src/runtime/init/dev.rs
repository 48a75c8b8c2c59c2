//! The container's `/dev`: the spec's device nodes made inside the rootfs (or, in a user
//! namespace where nodes cannot be made, the host's own nodes bound in), and the standard links;
//! never through a link the image made `/dev`.

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{OFlag, OpenHow, openat2};
use nix::mount::{MsFlags, mount};
use nix::sys::stat::{Mode, SFlag, makedev, mknodat};
use nix::unistd::{Gid, Uid, UnlinkatFlags, symlinkat, unlinkat};
use oci_spec::runtime::{LinuxDeviceType, Spec};

use super::InitError;
use crate::runtime::mounts::{self};
use crate::runtime::step::step as fail;

/// A device node on the host with this type and number, for binding into a user namespace's
/// /dev, where nodes cannot be made.
fn host_node(kind: SFlag, rdev: u64) -> Option<PathBuf> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    fn walk(dir: &Path, kind: SFlag, rdev: u64, depth: u32) -> Option<PathBuf> {
        for e in std::fs::read_dir(dir).ok()?.flatten() {
            let p = e.path();
            let Ok(m) = std::fs::symlink_metadata(&p) else {
                continue;
            };
            let ft = m.file_type();
            if ft.is_dir() && depth < 4 && !p.ends_with("pts") && !p.ends_with("shm") {
                if let Some(found) = walk(&p, kind, rdev, depth + 1) {
                    return Some(found);
                }
            } else if m.rdev() == rdev
                && ((kind == SFlag::S_IFCHR && ft.is_char_device())
                    || (kind == SFlag::S_IFBLK && ft.is_block_device()))
            {
                return Some(p);
            }
        }
        None
    }
    walk(Path::new("/dev"), kind, rdev, 0)
}

/// Refuses a rootfs whose `/dev` is there but not a directory. Mounts and nodes are placed
/// through links inside the rootfs, so an image's `/dev -> /` would put the runtime's `/dev`
/// over the container's root, `/dev -> /etc` over its `/etc` (CVE-2026-41579). Links below a
/// directory `/dev` never count: the tmpfs mounted on it hides them.
pub(super) fn refuse_linked_dev(rootfd: &OwnedFd) -> Result<(), InitError> {
    let st = match nix::sys::stat::fstatat(
        rootfd.as_fd(),
        "dev",
        nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
    ) {
        Ok(st) => st,
        Err(Errno::ENOENT) => return Ok(()),
        Err(e) => return Err(fail("/dev")(e)),
    };
    let detail = match SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT {
        SFlag::S_IFDIR => return Ok(()),
        SFlag::S_IFLNK => {
            let to = nix::fcntl::readlinkat(rootfd.as_fd(), "dev").map_err(fail("/dev"))?;
            format!(
                "the image's /dev is a link (to {}); the container's /dev is made only on a \
                 directory",
                to.to_string_lossy()
            )
        }
        _ => "the image's /dev is not a directory".to_string(),
    };
    Err(InitError {
        step: "/dev".into(),
        detail,
    })
}

pub(super) fn populate_dev(spec: &Spec, rootfd: &OwnedFd, userns: bool) -> Result<(), InitError> {
    let dev = mounts::target(rootfd, "/dev", true).map_err(fail("open /dev"))?;
    let devdir = openat2(
        dev.as_fd(),
        ".",
        OpenHow::new().flags(OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC),
    )
    .map_err(fail("open /dev"))?;
    // The devices every container gets (runc's defaults).
    let defaults: [(&str, u64, u64); 6] = [
        ("null", 1, 3),
        ("zero", 1, 5),
        ("full", 1, 7),
        ("random", 1, 8),
        ("urandom", 1, 9),
        ("tty", 5, 0),
    ];
    for (name, major, minor) in defaults {
        make_node(
            &devdir,
            name,
            SFlag::S_IFCHR,
            0o666,
            makedev(major, minor),
            (0, 0),
            userns,
        )?;
    }
    let links = [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
        ("ptmx", "pts/ptmx"),
        ("core", "/proc/kcore"),
    ];
    for (name, target) in links {
        match symlinkat(target, devdir.as_fd(), name) {
            Ok(()) | Err(Errno::EEXIST) => {}
            Err(e) => return Err(fail(format!("/dev/{name}"))(e)),
        }
    }
    let Some(devices) = spec.linux().as_ref().and_then(|l| l.devices().clone()) else {
        return Ok(());
    };
    for d in devices {
        let path = d.path().display().to_string();
        let Some(rel) = path.strip_prefix("/dev/") else {
            return Err(InitError {
                step: format!("device {path}"),
                detail: "devices must be under /dev".into(),
            });
        };
        let kind = match d.typ() {
            LinuxDeviceType::B => SFlag::S_IFBLK,
            LinuxDeviceType::P => SFlag::S_IFIFO,
            _ => SFlag::S_IFCHR,
        };
        // Nested device paths (/dev/dri/card0) get their directories.
        let (dir, name) = match rel.rsplit_once('/') {
            Some((d, n)) => (
                {
                    let t = mounts::target(rootfd, &format!("/dev/{d}"), true)
                        .map_err(fail(format!("device {path}")))?;
                    openat2(
                        t.as_fd(),
                        ".",
                        OpenHow::new()
                            .flags(OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC),
                    )
                    .map_err(fail(format!("device {path}")))?
                },
                n.to_string(),
            ),
            None => (
                openat2(
                    devdir.as_fd(),
                    ".",
                    OpenHow::new().flags(OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC),
                )
                .map_err(fail(format!("device {path}")))?,
                rel.to_string(),
            ),
        };
        make_node(
            &dir,
            &name,
            kind,
            d.file_mode().unwrap_or(0o666),
            makedev(d.major() as u64, d.minor() as u64),
            (d.uid().unwrap_or(0), d.gid().unwrap_or(0)),
            userns,
        )?;
    }
    Ok(())
}

/// Makes a device node in the container's /dev; in a user namespace, where the kernel refuses
/// mknod, binds the host's node of the same number onto an empty file instead.
fn make_node(
    dir: &OwnedFd,
    name: &str,
    kind: SFlag,
    mode: u32,
    dev: u64,
    (uid, gid): (u32, u32),
    userns: bool,
) -> Result<(), InitError> {
    let step = format!("/dev/{name}");
    match unlinkat(dir.as_fd(), name, UnlinkatFlags::NoRemoveDir) {
        Ok(()) | Err(Errno::ENOENT) => {}
        Err(e) => return Err(fail(&step)(e)),
    }
    if userns {
        let host = host_node(kind, dev).ok_or_else(|| InitError {
            step: step.clone(),
            detail: "no device node with this number on the host to bind".into(),
        })?;
        let file: OwnedFd = nix::fcntl::openat(
            dir.as_fd(),
            name,
            OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_WRONLY | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o600),
        )
        .map_err(fail(&step))?;
        return mount(
            Some(&host),
            &mounts::fd_path(&file),
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(fail(format!("{step}: bind {}", host.display())));
    }
    // With no umask the node has its mode from the start: nothing is set by name afterwards,
    // where a container sharing this /dev could have swapped the node for a link to a host
    // file (CVE-2025-31133).
    let umask = nix::sys::stat::umask(Mode::empty());
    let made = mknodat(dir.as_fd(), name, kind, Mode::from_bits_truncate(mode), dev);
    nix::sys::stat::umask(umask);
    made.map_err(fail(&step))?;
    // The owner goes on through a handle of the node itself, checked to be the one made.
    let node: OwnedFd = nix::fcntl::openat(
        dir.as_fd(),
        name,
        OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(fail(&step))?;
    let st = nix::sys::stat::fstat(node.as_fd()).map_err(fail(&step))?;
    let is = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT;
    if is != kind || (kind != SFlag::S_IFIFO && st.st_rdev != dev) {
        return Err(InitError {
            step,
            detail: "replaced while it was made".into(),
        });
    }
    nix::unistd::fchownat(
        node.as_fd(),
        "",
        Some(Uid::from_raw(uid)),
        Some(Gid::from_raw(gid)),
        nix::fcntl::AtFlags::AT_EMPTY_PATH,
    )
    .map_err(fail(&step))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root_with(make: impl FnOnce(&Path)) -> Result<(), InitError> {
        let d = tempfile::tempdir().unwrap();
        make(d.path());
        let fd: OwnedFd = nix::fcntl::open(
            d.path(),
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .unwrap();
        refuse_linked_dev(&fd)
    }

    #[test]
    fn a_dev_that_is_a_link_is_refused() {
        assert!(root_with(|_| {}).is_ok());
        assert!(root_with(|r| std::fs::create_dir(r.join("dev")).unwrap()).is_ok());
        // Links below a directory /dev are hidden by the tmpfs mounted on it.
        assert!(
            root_with(|r| {
                std::fs::create_dir(r.join("dev")).unwrap();
                std::os::unix::fs::symlink("/", r.join("dev/pts")).unwrap();
            })
            .is_ok()
        );
        for to in ["/", "/etc", "../../.."] {
            let e =
                root_with(|r| std::os::unix::fs::symlink(to, r.join("dev")).unwrap()).unwrap_err();
            assert!(
                e.detail.contains(&format!("a link (to {to})")),
                "{}",
                e.detail
            );
        }
        let e = root_with(|r| std::fs::write(r.join("dev"), b"").unwrap()).unwrap_err();
        assert!(e.detail.contains("not a directory"), "{}", e.detail);
    }
}
