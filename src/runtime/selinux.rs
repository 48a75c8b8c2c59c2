//! SELinux, kernel side: whether it is on, whether a context is valid in the loaded policy,
//! labelling the next exec of a thread (`/proc/thread-self/attr/exec`, as runc does) and files
//! (`security.selinux`), and the policy's container defaults (`lxc_contexts`). Which labels a
//! pod gets is `sandbox::security`'s business.

use std::io::{self, Write};
use std::path::Path;

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

/// Labels what this thread (and a child forked from it) execs next; `None` clears it.
pub fn set_exec_label(context: Option<&str>) -> io::Result<()> {
    std::fs::write("/proc/thread-self/attr/exec", context.unwrap_or(""))
}

/// The label of a running process.
pub fn process_label(pid: i32) -> io::Result<String> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/attr/current"))?;
    Ok(s.trim_end_matches(['\0', '\n']).to_string())
}

/// Labels `path` and everything below it (symlinks themselves, not what they point at).
pub fn relabel(path: &Path, context: &str) -> io::Result<()> {
    let with = |p: &Path, e: io::Error| io::Error::new(e.kind(), format!("{}: {e}", p.display()));
    sys::lsetxattr(path, XATTR, context.as_bytes()).map_err(|e| with(path, e))?;
    let meta = std::fs::symlink_metadata(path).map_err(|e| with(path, e))?;
    if meta.is_dir() {
        for entry in std::fs::read_dir(path).map_err(|e| with(path, e))? {
            let entry = entry.map_err(|e| with(path, e))?;
            relabel(&entry.path(), context)?;
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
