//! SELinux, kernel side: whether it is on, whether a context is valid in the loaded policy,
//! labelling the next exec of a thread (`/proc/thread-self/attr/exec`, as runc does) and files
//! (`security.selinux`), and the policy's container defaults (`lxc_contexts`). Which labels a
//! pod gets is `sandbox::security`'s business.

use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use crate::runtime::procfs::ProcRef;
use crate::sys;

const SELINUXFS: &str = "/sys/fs/selinux";
const XATTR: &[u8] = b"security.selinux";

/// Whether SELinux runs with a policy loaded.
pub fn enabled() -> bool {
    Path::new(SELINUXFS).join("enforce").exists()
}

/// Whether `context` is valid in the loaded policy (the kernel checks it).
pub fn valid(context: &str) -> bool {
    let Ok(mut f) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(Path::new(SELINUXFS).join("context"))
    else {
        return false;
    };
    f.write_all(context.as_bytes()).is_ok()
}

/// Labels what this thread (and a child forked from it) execs next; `None` clears it. Written
/// through the runtime's own procfs handle (see `procfs`).
pub fn set_exec_label(proc: ProcRef<'_>, context: Option<&str>) -> io::Result<()> {
    proc.write("thread-self/attr/exec", context.unwrap_or("").as_bytes())
}

/// The label of a running process.
pub fn process_label(pid: i32) -> io::Result<String> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/attr/current"))?;
    Ok(s.trim_end_matches(['\0', '\n']).to_string())
}

/// Labels `path` and everything below it on the same filesystem. The walk goes by descriptor
/// and never follows a symlink (it labels the link itself), so a container that shares the
/// directory cannot swap a part of it for a link and have the node's own files relabelled.
/// Files on a filesystem without labels are passed over, as containerd does.
pub fn relabel(path: &Path, context: &str) -> io::Result<()> {
    use nix::fcntl::{OFlag, open, openat};
    use nix::sys::stat::{Mode, SFlag, fstat};
    use std::os::fd::{AsFd, AsRawFd, OwnedFd};
    use std::rc::Rc;
    let with = |e: nix::Error| {
        io::Error::new(
            io::Error::from(e).kind(),
            format!("{}: {e}", path.display()),
        )
    };
    let handle = OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let top = open(path, handle, Mode::empty()).map_err(with)?;
    let dev = fstat(top.as_fd()).map_err(with)?.st_dev;
    // Entries still to label: the top one, open, then each by its directory (held open while
    // any of its entries are left) and name.
    enum Todo {
        Open(OwnedFd),
        Entry(Rc<OwnedFd>, std::ffi::OsString),
    }
    let mut todo = vec![Todo::Open(top)];
    while let Some(next) = todo.pop() {
        let fd = match next {
            Todo::Open(fd) => fd,
            Todo::Entry(dir, name) => {
                match openat(dir.as_fd(), name.as_os_str(), handle, Mode::empty()) {
                    Ok(fd) => fd,
                    // Gone meanwhile: nothing to label.
                    Err(nix::Error::ENOENT) => continue,
                    Err(e) => return Err(with(e)),
                }
            }
        };
        let st = fstat(fd.as_fd()).map_err(with)?;
        if st.st_dev != dev {
            continue;
        }
        let link = Path::new("/proc/self/fd").join(fd.as_raw_fd().to_string());
        let is_link = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFLNK;
        let labelled = if is_link {
            // A link's own label: through its handle the path ends at the link.
            sys::lsetxattr(&link, XATTR, context.as_bytes())
        } else {
            sys::setxattr(&link, XATTR, context.as_bytes())
        };
        match labelled {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => continue,
            Err(e) => return Err(io::Error::new(e.kind(), format!("{}: {e}", path.display()))),
        }
        if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT != SFlag::S_IFDIR {
            continue;
        }
        let dir = openat(
            fd.as_fd(),
            ".",
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(with)?;
        // One descriptor to list the directory, one to open its entries from later.
        let mut listing = nix::dir::Dir::from_fd(
            dir.try_clone()
                .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?,
        )
        .map_err(with)?;
        let dir = Rc::new(dir);
        for entry in listing.iter() {
            let entry = entry.map_err(with)?;
            let name = entry.file_name().to_bytes();
            if name == b"." || name == b".." {
                continue;
            }
            let name = std::ffi::OsStr::from_bytes(name).to_os_string();
            todo.push(Todo::Entry(dir.clone(), name));
        }
    }
    Ok(())
}

/// The policy's labels for containers, from its `lxc_contexts` (the file containerd and CRI-O
/// read): the process's and the files'. Fallbacks are the container-selinux names.
pub fn container_defaults() -> (String, String) {
    let mut process = "system_u:system_r:container_t:s0".to_string();
    let mut file = "system_u:object_r:container_file_t:s0".to_string();
    let kind = std::fs::read_to_string("/etc/selinux/config")
        .ok()
        .and_then(|c| {
            c.lines()
                .find_map(|l| l.trim().strip_prefix("SELINUXTYPE=").map(str::to_string))
        })
        .unwrap_or_else(|| "targeted".into());
    let path = Path::new("/etc/selinux")
        .join(kind.trim())
        .join("contexts/lxc_contexts");
    for line in std::fs::read_to_string(path).unwrap_or_default().lines() {
        let Some((k, v)) = line.split_once('=') else {
            continue;
        };
        let v = v.trim().trim_matches('"').to_string();
        match k.trim() {
            "process" => process = v,
            "file" => file = v,
            _ => {}
        }
    }
    (process, file)
}

/// A context's four parts: user, role, type and level (which may hold colons itself).
pub fn parts(context: &str) -> Option<[&str; 4]> {
    let mut it = context.splitn(4, ':');
    Some([it.next()?, it.next()?, it.next()?, it.next().unwrap_or("")])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contexts_split_in_four() {
        assert_eq!(
            parts("system_u:system_r:container_t:s0:c1,c2"),
            Some(["system_u", "system_r", "container_t", "s0:c1,c2"])
        );
        assert_eq!(parts("u:r:t"), Some(["u", "r", "t", ""]));
        assert_eq!(parts("u:r"), None);
    }
}
