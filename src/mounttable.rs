//! mounttable: what the kernel's mount table shows under a directory, and removing a tree
//! that may hold mounts without reaching through one. Used by the runtime's layers (sandbox and
//! container directories) and by the agent (a pod's volumes); it uses only `std` and `nix`.

use std::io;
use std::path::{Path, PathBuf};

/// Mount points at or below `dir`, from /proc/self/mountinfo, deepest first.
pub fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| PathBuf::from(unescape_mountinfo(p)))
        .filter(|p| p.starts_with(dir))
        .collect();
    out.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    out.dedup();
    out
}

/// mountinfo escapes space, tab, newline and backslash as octal.
fn unescape_mountinfo(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && let Ok(v) = u8::from_str_radix(&s[i + 1..i + 4], 8)
        {
            out.push(v);
            i += 4;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Removes a directory tree that may have had mounts in it: every mount below it is detached
/// first, and if any is still there the tree is left alone, so a removal can never reach through
/// a mount into what it shows (image layers behind an idmapped mount, a host volume).
pub fn remove_tree(dir: &Path) -> io::Result<()> {
    for m in mounts_under(dir) {
        let _ = nix::mount::umount2(&m, nix::mount::MntFlags::MNT_DETACH);
    }
    let left = mounts_under(dir);
    if !left.is_empty() {
        return Err(io::Error::other(format!(
            "still mounted below it: {}",
            left.iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        r => r,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes() {
        assert_eq!(unescape_mountinfo("/a\\040b\\134c"), "/a b\\c");
    }
}
