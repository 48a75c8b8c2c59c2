//! Mounting inside a container's rootfs before `pivot_root`, safely: every destination is
//! resolved with `openat2(RESOLVE_IN_ROOT)`, so a symlink in the image (`/etc/hosts -> /etc/shadow`
//! or `-> ../../host`) resolves inside the rootfs, never on the host; the mount then goes onto the
//! resolved file through `/proc/self/fd/N`; a walk never follows a link of procfs. Also parses
//! OCI mount options into flags, and says which destinations under `/proc` may be mounted.

use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{OFlag, OpenHow, openat, openat2};
use nix::mount::{MsFlags, mount};
use nix::sys::stat::{Mode, mkdirat};

/// Destinations under `/proc` a mount may have: the files lxcfs emulates (the list runc allows).
/// Anything else there would take the runtime's procfs writes (CVE-2025-52881).
pub const PROC_MOUNTABLE: [&str; 10] = [
    "/proc/cpuinfo",
    "/proc/diskstats",
    "/proc/meminfo",
    "/proc/stat",
    "/proc/swaps",
    "/proc/uptime",
    "/proc/loadavg",
    "/proc/slabinfo",
    "/proc/sys/kernel/ns_last_pid",
    "/proc/sys/crypto/fips_enabled",
];

/// Whether a volume may be mounted at `dest` (clean and absolute) as far as `/proc` goes: not
/// on `/proc` itself nor under it, but for [`PROC_MOUNTABLE`].
pub fn proc_destination_allowed(dest: &str) -> bool {
    !(dest == "/proc" || dest.starts_with("/proc/")) || PROC_MOUNTABLE.contains(&dest)
}

/// Mount flags, propagation and filesystem data parsed from OCI mount options.
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    pub flags: MsFlags,
    pub propagation: MsFlags,
    pub data: Vec<String>,
    /// `rro`: read-only recursively (mount_setattr).
    pub recursive_ro: bool,
    /// Flags of the recursive forms (`rnosuid`, `rnodev`, `rnoexec`), set on every mount of a
    /// bind's tree (mount_setattr), not only its top.
    pub recursive: MsFlags,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            flags: MsFlags::empty(),
            propagation: MsFlags::empty(),
            data: Vec::new(),
            recursive_ro: false,
            recursive: MsFlags::empty(),
        }
    }
}

impl Options {
    pub fn parse<S: AsRef<str>>(opts: &[S]) -> Options {
        let mut o = Options::default();
        for opt in opts {
            let opt = opt.as_ref();
            let (set, clear) = match opt {
                "ro" => (MsFlags::MS_RDONLY, MsFlags::empty()),
                "rw" => (MsFlags::empty(), MsFlags::MS_RDONLY),
                "nosuid" => (MsFlags::MS_NOSUID, MsFlags::empty()),
                "suid" => (MsFlags::empty(), MsFlags::MS_NOSUID),
                "nodev" => (MsFlags::MS_NODEV, MsFlags::empty()),
                "dev" => (MsFlags::empty(), MsFlags::MS_NODEV),
                "noexec" => (MsFlags::MS_NOEXEC, MsFlags::empty()),
                "exec" => (MsFlags::empty(), MsFlags::MS_NOEXEC),
                "sync" => (MsFlags::MS_SYNCHRONOUS, MsFlags::empty()),
                "async" => (MsFlags::empty(), MsFlags::MS_SYNCHRONOUS),
                "dirsync" => (MsFlags::MS_DIRSYNC, MsFlags::empty()),
                "remount" => (MsFlags::MS_REMOUNT, MsFlags::empty()),
                "mand" => (MsFlags::MS_MANDLOCK, MsFlags::empty()),
                "nomand" => (MsFlags::empty(), MsFlags::MS_MANDLOCK),
                "atime" => (MsFlags::empty(), MsFlags::MS_NOATIME),
                "noatime" => (MsFlags::MS_NOATIME, MsFlags::empty()),
                "diratime" => (MsFlags::empty(), MsFlags::MS_NODIRATIME),
                "nodiratime" => (MsFlags::MS_NODIRATIME, MsFlags::empty()),
                "bind" => (MsFlags::MS_BIND, MsFlags::empty()),
                "rbind" => (MsFlags::MS_BIND | MsFlags::MS_REC, MsFlags::empty()),
                "relatime" => (MsFlags::MS_RELATIME, MsFlags::empty()),
                "norelatime" => (MsFlags::empty(), MsFlags::MS_RELATIME),
                "strictatime" => (MsFlags::MS_STRICTATIME, MsFlags::empty()),
                "nostrictatime" => (MsFlags::empty(), MsFlags::MS_STRICTATIME),
                "private" | "rprivate" | "shared" | "rshared" | "slave" | "rslave"
                | "unbindable" | "runbindable" => {
                    o.propagation = propagation(opt).unwrap_or(MsFlags::empty());
                    continue;
                }
                "rro" => {
                    o.recursive_ro = true;
                    (MsFlags::MS_RDONLY, MsFlags::empty())
                }
                "rrw" => continue,
                other => match recursive_form(other) {
                    Some(flag) => {
                        o.recursive.insert(flag);
                        (flag, MsFlags::empty())
                    }
                    None => {
                        o.data.push(other.to_string());
                        continue;
                    }
                },
            };
            o.flags.insert(set);
            o.flags.remove(clear);
        }
        o
    }
}

/// The flag of a recursive attribute option (`rnoexec` is `noexec` on the whole tree), as
/// runc names them.
pub fn recursive_form(opt: &str) -> Option<MsFlags> {
    Some(match opt {
        "rnosuid" => MsFlags::MS_NOSUID,
        "rnodev" => MsFlags::MS_NODEV,
        "rnoexec" => MsFlags::MS_NOEXEC,
        _ => return None,
    })
}

/// Sets the recursive forms' attributes on every mount of a detached tree.
pub fn set_recursive(tree: &OwnedFd, opts: &Options) -> io::Result<()> {
    let attrs = mount_attrs(opts.recursive);
    if attrs == 0 {
        return Ok(());
    }
    crate::sys::mount_setattr(tree, attrs, None, true)
}

pub use crate::sys::{
    MOUNT_ATTR_NODEV as ATTR_NODEV, MOUNT_ATTR_NOEXEC as ATTR_NOEXEC,
    MOUNT_ATTR_NOSUID as ATTR_NOSUID, MOUNT_ATTR_RDONLY as ATTR_RDONLY,
};

/// A detached copy of the mount tree at `source` (recursive for `rbind`) made into an idmapped
/// mount through the user namespace at `userns` (its handle), with extra mount attributes
/// (`sys::MOUNT_ATTR_*`) on top or on the whole tree. It must be made by a process of the host's
/// user namespace; a process in the container's may attach it with [`attach`].
pub fn idmapped(
    source: &Path,
    userns: &Path,
    recursive: bool,
    attrs: u64,
    attrs_recursive: bool,
) -> io::Result<OwnedFd> {
    let ns = std::fs::File::open(userns)?;
    let tree = crate::sys::open_tree_clone(source, recursive)?;
    crate::sys::mount_setattr(&tree, 0, Some(ns.as_fd()), recursive).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!(
                "idmapped mount of {}: {e} (does its filesystem support idmapped mounts?)",
                source.display()
            ),
        )
    })?;
    if attrs != 0 {
        crate::sys::mount_setattr(&tree, attrs, None, attrs_recursive)?;
    }
    Ok(tree)
}

/// Attaches a detached mount (from [`idmapped`]) on the directory `target`.
pub fn attach(tree: &OwnedFd, target: &Path) -> io::Result<()> {
    let t: OwnedFd = nix::fcntl::open(target, OFlag::O_PATH | OFlag::O_CLOEXEC, Mode::empty())?;
    crate::sys::move_mount(tree, &t)
}

/// Gives a detached tree `propagation` (`MS_SLAVE | MS_REC` and the like), before it is
/// attached: nothing is looked up by path again.
fn tree_propagation(tree: &OwnedFd, propagation: MsFlags) -> io::Result<()> {
    if propagation.is_empty() {
        return Ok(());
    }
    let kind = propagation & !MsFlags::MS_REC;
    crate::sys::mount_set_propagation(tree, kind.bits(), propagation.contains(MsFlags::MS_REC))
}

/// Attaches a detached mount on an open target (from [`target`]) with `propagation`.
pub fn attach_at(tree: &OwnedFd, target: &OwnedFd, propagation: MsFlags) -> io::Result<()> {
    tree_propagation(tree, propagation)?;
    crate::sys::move_mount(tree, target)
}

/// Mounts an overlay of `lowers` (topmost first; none: an empty directory made in `layer`)
/// under a writable `layer/upper` (with `layer/work`) at `target`: a container's or a pause
/// image's root filesystem.
/// With `label`, every file in it shows that SELinux label (`context=`).
pub fn overlay(
    target: &Path,
    lowers: &[PathBuf],
    layer: &Path,
    flags: MsFlags,
    label: Option<&str>,
) -> io::Result<()> {
    let (upper, work) = (layer.join("upper"), layer.join("work"));
    for d in [target, upper.as_path(), work.as_path()] {
        std::fs::create_dir_all(d)?;
    }
    let lower = if lowers.is_empty() {
        let empty = layer.join("empty");
        std::fs::create_dir_all(&empty)?;
        empty.display().to_string()
    } else {
        lowers
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(":")
    };
    let opts = overlay_options(&lower, Some((&upper, &work)), label);
    if opts.len() > MOUNT_DATA_MAX {
        return overlay_by_layer(
            target,
            lowers,
            Some((&upper, &work)),
            flags,
            label,
            opts.len(),
        );
    }
    mount(
        Some("overlay"),
        target,
        Some("overlay"),
        flags,
        Some(opts.as_str()),
    )
    .map_err(|e| io::Error::other(format!("mounting overlay: {e}")))
}

/// Mounts the layers `lowers` (topmost first, at least one) read-only at `target` with `flags`
/// (`MS_NODEV` and the like): an image's root filesystem with nothing to write to (an image
/// volume). One layer is bound as it is; more are an overlay without an upper directory.
pub fn overlay_readonly(target: &Path, lowers: &[PathBuf], flags: MsFlags) -> io::Result<()> {
    std::fs::create_dir_all(target)?;
    match lowers {
        [] => Err(io::Error::other("no layers")),
        [one] => {
            let tree = crate::sys::open_tree_clone(one, false)?;
            let mut attrs = ATTR_RDONLY;
            if flags.contains(MsFlags::MS_NODEV) {
                attrs |= ATTR_NODEV;
            }
            if flags.contains(MsFlags::MS_NOSUID) {
                attrs |= ATTR_NOSUID;
            }
            crate::sys::mount_setattr(&tree, attrs, None, false)?;
            attach(&tree, target)
        }
        many => {
            let lower = many
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(":");
            let needed = "lowerdir=".len() + lower.len();
            if needed > MOUNT_DATA_MAX {
                return overlay_by_layer(
                    target,
                    many,
                    None,
                    flags | MsFlags::MS_RDONLY,
                    None,
                    needed,
                );
            }
            mount(
                Some("overlay"),
                target,
                Some("overlay"),
                flags | MsFlags::MS_RDONLY,
                Some(format!("lowerdir={lower}").as_str()),
            )
            .map_err(|e| io::Error::other(format!("mounting a read-only overlay: {e}")))
        }
    }
}

/// An overlay's mount(2) options: its lower directories (joined by `:`), the upper and work
/// directories when it has them, and the SELinux context.
fn overlay_options(lower: &str, upper: Option<(&Path, &Path)>, label: Option<&str>) -> String {
    let mut opts = format!("lowerdir={lower}");
    if let Some((u, w)) = upper {
        opts.push_str(&format!(
            ",upperdir={},workdir={}",
            u.display(),
            w.display()
        ));
    }
    if let Some(l) = label {
        opts.push_str(&format!(",context=\"{l}\""));
    }
    opts
}

/// The most option text mount(2) takes: the kernel copies one page and cuts the rest, which
/// for an overlay of many layers turns into a lower directory that is not found.
const MOUNT_DATA_MAX: usize = 4095;

/// An overlay whose options outgrow one page (an image of some 60 layers or more): the lower
/// layers go to the kernel one at a time (`lowerdir+`, Linux 6.8), the mount is made detached
/// and attached at `target`. An older kernel gets them as short names of descriptors this
/// process holds (`by_descriptors`), which fit some 200 layers in a page. Past that the refusal
/// names the limit (`ErrorKind::InvalidInput`).
fn overlay_by_layer(
    target: &Path,
    lowers: &[PathBuf],
    upper: Option<(&Path, &Path)>,
    flags: MsFlags,
    label: Option<&str>,
    needed: usize,
) -> io::Result<()> {
    let paths: Vec<String> = lowers.iter().map(|p| p.display().to_string()).collect();
    let mut options: Vec<(&str, &str)> = paths.iter().map(|p| ("lowerdir+", p.as_str())).collect();
    let upper_dirs = upper.map(|(u, w)| (u.display().to_string(), w.display().to_string()));
    if let Some((u, w)) = &upper_dirs {
        options.push(("upperdir", u.as_str()));
        options.push(("workdir", w.as_str()));
    }
    if let Some(l) = label {
        options.push(("context", l));
    }
    let mut attrs = 0;
    for (flag, attr) in [
        (MsFlags::MS_RDONLY, crate::sys::MOUNT_ATTR_RDONLY),
        (MsFlags::MS_NOSUID, crate::sys::MOUNT_ATTR_NOSUID),
        (MsFlags::MS_NODEV, crate::sys::MOUNT_ATTR_NODEV),
        (MsFlags::MS_NOEXEC, crate::sys::MOUNT_ATTR_NOEXEC),
    ] {
        if flags.contains(flag) {
            attrs |= attr;
        }
    }
    match crate::sys::new_mount("overlay", &options, attrs) {
        Ok(tree) => attach(&tree, target),
        Err(one_at_a_time) => by_descriptors(target, lowers, upper, flags, label).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{} layers: their overlay options take {needed} bytes, more than the {} \
                     mount(2) takes; giving them one at a time (lowerdir+, Linux 6.8 or \
                     later) failed ({one_at_a_time}), and as descriptors: {e}",
                    lowers.len(),
                    MOUNT_DATA_MAX + 1
                ),
            )
        }),
    }
}

/// An overlay whose lower layers are named by descriptors this process holds open while it
/// mounts (`/proc/self/fd/N`: 17 bytes or so a layer, whatever the layer's path), for kernels
/// without `lowerdir+`. The kernel resolves each name when the mount is made; the overlay then
/// holds the layers themselves.
pub(crate) fn by_descriptors(
    target: &Path,
    lowers: &[PathBuf],
    upper: Option<(&Path, &Path)>,
    flags: MsFlags,
    label: Option<&str>,
) -> io::Result<()> {
    let held: Vec<OwnedFd> = lowers
        .iter()
        .map(|l| {
            nix::fcntl::open(
                l,
                OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
                Mode::empty(),
            )
            .map_err(io::Error::from)
        })
        .collect::<io::Result<_>>()?;
    let lower = held
        .iter()
        .map(|fd| format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .collect::<Vec<_>>()
        .join(":");
    let opts = overlay_options(&lower, upper, label);
    if opts.len() > MOUNT_DATA_MAX {
        return Err(io::Error::other(format!(
            "they take {} bytes even so",
            opts.len()
        )));
    }
    mount(
        Some("overlay"),
        target,
        Some("overlay"),
        flags,
        Some(opts.as_str()),
    )
    .map_err(io::Error::from)
}

/// Whether `rro` mounts work here (the kernel has `mount_setattr`); asked once.
pub fn recursive_read_only_supported() -> bool {
    static SUPPORTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SUPPORTED.get_or_init(crate::sys::has_mount_setattr)
}

/// `rslave` and friends as flags.
pub fn propagation(name: &str) -> Option<MsFlags> {
    Some(match name {
        "private" => MsFlags::MS_PRIVATE,
        "rprivate" => MsFlags::MS_PRIVATE | MsFlags::MS_REC,
        "shared" => MsFlags::MS_SHARED,
        "rshared" => MsFlags::MS_SHARED | MsFlags::MS_REC,
        "slave" => MsFlags::MS_SLAVE,
        "rslave" => MsFlags::MS_SLAVE | MsFlags::MS_REC,
        "unbindable" => MsFlags::MS_UNBINDABLE,
        "runbindable" => MsFlags::MS_UNBINDABLE | MsFlags::MS_REC,
        _ => return None,
    })
}

/// Opens `path` inside `root` as an `O_PATH` handle, creating what is missing: directories, and
/// the last component as a directory (`dir`) or an empty file. Symlinks are followed as if `root`
/// were `/` (an absolute target restarts from the root, `..` stops at it), so a dangling
/// `/etc/resolv.conf -> /run/systemd/resolve/stub-resolv.conf` in an image gets its target
/// created inside the rootfs, and nothing can ever be reached or created outside it.
pub fn target(root: &OwnedFd, path: &str, dir: bool) -> io::Result<OwnedFd> {
    use std::collections::VecDeque;
    const MAX_LINKS: usize = 40;
    let open_here = |at: &OwnedFd, name: &OsStr| -> nix::Result<OwnedFd> {
        openat(
            at.as_fd(),
            name,
            OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
    };
    let reopen = |fd: &OwnedFd| -> io::Result<OwnedFd> {
        Ok(openat2(
            fd.as_fd(),
            ".",
            OpenHow::new().flags(OFlag::O_PATH | OFlag::O_CLOEXEC),
        )?)
    };
    let split = |p: &Path| -> VecDeque<std::ffi::OsString> {
        p.components()
            .filter_map(|c| match c {
                Component::Normal(s) => Some(s.to_os_string()),
                Component::ParentDir => Some("..".into()),
                _ => None,
            })
            .collect()
    };
    let mut todo = split(Path::new(path));
    // The directories walked so far, root first, so ".." can step back without leaving the root.
    let mut stack: Vec<OwnedFd> = vec![reopen(root)?];
    let mut links = 0;
    while let Some(comp) = todo.pop_front() {
        let last = todo.is_empty();
        let here = stack.last().ok_or_else(|| io::Error::other("empty walk"))?;
        if comp == ".." {
            if stack.len() > 1 {
                stack.pop();
            }
            continue;
        }
        let fd = match open_here(here, &comp) {
            Ok(fd) => fd,
            Err(Errno::ENOENT) => {
                let parent = openat2(
                    here.as_fd(),
                    ".",
                    OpenHow::new().flags(OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC),
                )?;
                if last && !dir {
                    match openat(
                        parent.as_fd(),
                        comp.as_os_str(),
                        OFlag::O_CREAT
                            | OFlag::O_EXCL
                            | OFlag::O_WRONLY
                            | OFlag::O_CLOEXEC
                            | OFlag::O_NOFOLLOW,
                        Mode::from_bits_truncate(0o644),
                    ) {
                        Ok(_) | Err(Errno::EEXIST) => {}
                        Err(e) => return Err(e.into()),
                    }
                } else {
                    match mkdirat(
                        parent.as_fd(),
                        comp.as_os_str(),
                        Mode::from_bits_truncate(0o755),
                    ) {
                        Ok(()) | Err(Errno::EEXIST) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
                open_here(here, &comp)?
            }
            Err(e) => return Err(e.into()),
        };
        let st = nix::sys::stat::fstat(fd.as_fd())?;
        let kind =
            nix::sys::stat::SFlag::from_bits_truncate(st.st_mode) & nix::sys::stat::SFlag::S_IFMT;
        if kind == nix::sys::stat::SFlag::S_IFLNK {
            // procfs's links (`self`, `fd/N`) lead to the walker's own process, and from
            // there to whatever it holds open: a mount or a working directory must not.
            if crate::runtime::procfs::on_procfs(&fd)? {
                return Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!(
                        "{}: a link in /proc, which the runtime does not follow",
                        comp.to_string_lossy()
                    ),
                ));
            }
            links += 1;
            if links > MAX_LINKS {
                return Err(io::Error::from_raw_os_error(libc::ELOOP));
            }
            let target = nix::fcntl::readlinkat(here.as_fd(), comp.as_os_str())?;
            let target = PathBuf::from(target);
            let mut next = split(&target);
            next.extend(todo);
            todo = next;
            if target.is_absolute() {
                stack.truncate(1);
            }
            continue;
        }
        if last {
            return Ok(fd);
        }
        if kind != nix::sys::stat::SFlag::S_IFDIR {
            return Err(io::Error::from_raw_os_error(libc::ENOTDIR));
        }
        stack.push(fd);
    }
    // An empty path, or one that ended in ".." or a symlink to a directory: the current directory.
    reopen(stack.last().ok_or_else(|| io::Error::other("empty walk"))?)
}

/// The mount point of the mount holding `path`'s parent directory (from `/proc/self/mountinfo`:
/// the longest mount point that contains it; the last one listed wins, as it is on top).
pub fn mount_point_of(path: &Path) -> Option<PathBuf> {
    let parent = path.parent()?;
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let mut best: Option<PathBuf> = None;
    for line in info.lines() {
        let Some(mp) = line.split(' ').nth(4) else {
            continue;
        };
        // Octal escapes (\040 for a space) stay as they are: such paths never hold a rootfs.
        let mp = PathBuf::from(mp);
        if parent.starts_with(&mp)
            && best
                .as_ref()
                .is_none_or(|b| mp.components().count() >= b.components().count())
        {
            best = Some(mp);
        }
    }
    best
}

/// The path that reaches an open handle.
pub fn fd_path<F: AsRawFd>(fd: &F) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

/// Mounts a filesystem (`proc`, `tmpfs`, ...) on an open target.
pub fn mount_fs(kind: &str, source: &str, target: &OwnedFd, opts: &Options) -> io::Result<()> {
    let data = opts.data.join(",");
    let flags = opts.flags & !MsFlags::MS_BIND & !MsFlags::MS_REC;
    mount(
        Some(source),
        &fd_path(target),
        Some(kind),
        flags,
        if data.is_empty() {
            None
        } else {
            Some(data.as_str())
        },
    )?;
    if !opts.propagation.is_empty() {
        // The handle reaches the covered directory; walking its path reaches the new mount.
        set_propagation(&std::fs::read_link(fd_path(target))?, opts.propagation)?;
    }
    Ok(())
}

/// Sets the propagation of the mount at `real` (nothing to do for none).
fn set_propagation(real: &Path, propagation: MsFlags) -> io::Result<()> {
    if propagation.is_empty() {
        return Ok(());
    }
    mount(None::<&str>, real, None::<&str>, propagation, None::<&str>)?;
    Ok(())
}

/// The per-mount attributes (`MOUNT_ATTR_*`) among mount flags.
fn mount_attrs(flags: MsFlags) -> u64 {
    const MOUNT_ATTR_NOATIME: u64 = 0x10;
    const MOUNT_ATTR_STRICTATIME: u64 = 0x20;
    const MOUNT_ATTR_NODIRATIME: u64 = 0x80;
    let mut attrs = 0;
    for (flag, attr) in [
        (MsFlags::MS_RDONLY, ATTR_RDONLY),
        (MsFlags::MS_NOSUID, ATTR_NOSUID),
        (MsFlags::MS_NODEV, ATTR_NODEV),
        (MsFlags::MS_NOEXEC, ATTR_NOEXEC),
        (MsFlags::MS_NOATIME, MOUNT_ATTR_NOATIME),
        (MsFlags::MS_STRICTATIME, MOUNT_ATTR_STRICTATIME),
        (MsFlags::MS_NODIRATIME, MOUNT_ATTR_NODIRATIME),
    ] {
        if flags.contains(flag) {
            attrs |= attr;
        }
    }
    attrs
}

/// Bind-mounts `source` (a host path) on an open target: a detached copy of its tree is given
/// its flags and propagation and then attached onto the target itself, so no path inside the
/// rootfs is resolved again (a volume the container shares could have changed by then).
pub fn bind(source: &Path, target: &OwnedFd, opts: &Options) -> io::Result<()> {
    let tree = crate::sys::open_tree_clone(source, opts.flags.contains(MsFlags::MS_REC))?;
    let attrs = mount_attrs(opts.flags);
    if attrs != 0 {
        crate::sys::mount_setattr(&tree, attrs, None, opts.recursive_ro)?;
    }
    set_recursive(&tree, opts)?;
    attach_at(&tree, target, opts.propagation)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn option_parsing() {
        let o = Options::parse(&["rbind", "ro", "nosuid", "rslave", "mode=755", "size=64k"]);
        assert!(o.flags.contains(
            MsFlags::MS_BIND | MsFlags::MS_REC | MsFlags::MS_RDONLY | MsFlags::MS_NOSUID
        ));
        assert_eq!(o.propagation, MsFlags::MS_SLAVE | MsFlags::MS_REC);
        assert_eq!(o.data, vec!["mode=755", "size=64k"]);
        let o = Options::parse(&["ro", "rw"]);
        assert!(!o.flags.contains(MsFlags::MS_RDONLY));
        assert!(Options::parse(&["rro"]).recursive_ro);
        let r = Options::parse(&["rbind", "nosuid", "rnoexec", "rnodev"]);
        assert!(
            r.flags
                .contains(MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC | MsFlags::MS_NODEV)
        );
        assert_eq!(r.recursive, MsFlags::MS_NOEXEC | MsFlags::MS_NODEV);
        assert!(r.data.is_empty());
    }

    #[test]
    fn targets_stay_inside_the_root() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("root");
        let outside = tmp.path().join("outside");
        std::fs::create_dir_all(root.join("etc")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        // absolute and relative symlinks that would escape on the host
        std::os::unix::fs::symlink(&outside, root.join("etc/abs")).unwrap();
        std::os::unix::fs::symlink("../../outside", root.join("etc/rel")).unwrap();
        let rootfd: OwnedFd =
            nix::fcntl::open(&root, OFlag::O_PATH | OFlag::O_DIRECTORY, Mode::empty()).unwrap();
        target(&rootfd, "/etc/abs/hosts", false).unwrap();
        // a dangling symlink gets its target created inside the root (Ubuntu's resolv.conf)
        std::os::unix::fs::symlink(
            "/run/systemd/resolve/stub-resolv.conf",
            root.join("etc/resolv.conf"),
        )
        .unwrap();
        target(&rootfd, "/etc/resolv.conf", false).unwrap();
        assert!(root.join("run/systemd/resolve/stub-resolv.conf").is_file());
        // loops are refused
        std::os::unix::fs::symlink("loop2", root.join("loop1")).unwrap();
        std::os::unix::fs::symlink("loop1", root.join("loop2")).unwrap();
        assert!(target(&rootfd, "/loop1/x", true).is_err());
        target(&rootfd, "/etc/rel/x/y", true).unwrap();
        target(&rootfd, "/../../escape", true).unwrap();
        assert_eq!(
            std::fs::read_dir(&outside).unwrap().count(),
            0,
            "nothing was created outside"
        );
        // the symlinks were resolved inside the root instead
        assert!(
            root.join(outside.strip_prefix("/").unwrap())
                .join("hosts")
                .is_file()
        );
        assert!(root.join("escape").is_dir());
        // an existing file is opened, not recreated
        std::fs::write(root.join("etc/hostname"), "x").unwrap();
        target(&rootfd, "/etc/hostname", false).unwrap();
        assert_eq!(std::fs::read(root.join("etc/hostname")).unwrap(), b"x");
    }

    /// Two hundred layers whose paths would take 20 KB of options mount by descriptor names,
    /// as on a kernel without `lowerdir+`, and the overlay keeps them after the descriptors
    /// are closed.
    #[test]
    fn many_layers_by_descriptors() {
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        mount(
            Some("tmpfs"),
            tmp.path(),
            Some("tmpfs"),
            MsFlags::empty(),
            None::<&str>,
        )
        .unwrap();
        let deep = tmp
            .path()
            .join("a-directory-name-long-enough-to-matter-".repeat(2));
        let lowers: Vec<PathBuf> = (0..200)
            .map(|i| {
                let d = deep.join(format!("layer-{i:03}"));
                std::fs::create_dir_all(&d).unwrap();
                std::fs::write(d.join(format!("f{i}")), "x").unwrap();
                d
            })
            .collect();
        let (upper, work, target) = (
            tmp.path().join("upper"),
            tmp.path().join("work"),
            tmp.path().join("root"),
        );
        for d in [&upper, &work, &target] {
            std::fs::create_dir_all(d).unwrap();
        }
        let mounted = by_descriptors(
            &target,
            &lowers,
            Some((&upper, &work)),
            MsFlags::MS_NODEV,
            None,
        );
        let seen = mounted.is_ok()
            && target.join("f0").is_file()
            && target.join("f199").is_file()
            && std::fs::write(target.join("new"), "y").is_ok()
            && upper.join("new").is_file();
        let _ = nix::mount::umount2(&target, nix::mount::MntFlags::MNT_DETACH);
        nix::mount::umount2(tmp.path(), nix::mount::MntFlags::MNT_DETACH).unwrap();
        mounted.unwrap();
        assert!(seen, "the layers and the upper directory show through");
    }
}
