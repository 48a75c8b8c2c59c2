//! mounttable: what the kernel's mount table shows under a directory, and removing a tree
//! that may hold mounts without reaching through one. Used by the runtime's layers (sandbox and
//! container directories) and by the agent (a pod's volumes); it uses only `std` and `nix`.

use std::io;
use std::path::{Path, PathBuf};

/// Mount points at or below `dir`, from /proc/self/mountinfo, deepest first.
pub fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    mounts_in(&[dir])
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
/// first, and if any cannot be, the tree is left alone, so a removal can never reach through a
/// mount into what it shows (image layers behind an idmapped mount, a host volume).
pub fn remove_tree(dir: &Path) -> io::Result<()> {
    remove_trees(&[dir])
}

/// `remove_tree` of each directory, reading the mount table once for all of them (it is long
/// on a busy node, and reading it is most of what removing a container's files costs).
pub fn remove_trees(dirs: &[&Path]) -> io::Result<()> {
    let mounted = mounts_in(dirs);
    for m in &mounted {
        // Every mount stacked on the point goes (EINVAL: none is left there).
        loop {
            match nix::mount::umount2(m, nix::mount::MntFlags::MNT_DETACH) {
                Ok(()) => continue,
                Err(nix::errno::Errno::EINVAL | nix::errno::Errno::ENOENT) => break,
                Err(e) => {
                    return Err(io::Error::other(format!(
                        "still mounted below it: {} ({e})",
                        m.display()
                    )));
                }
            }
        }
    }
    for dir in dirs {
        match std::fs::remove_dir_all(dir) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            r => r?,
        }
    }
    Ok(())
}

/// Mount points at or below any of `dirs`, deepest first, from one read of the mount table.
fn mounts_in(dirs: &[&Path]) -> Vec<PathBuf> {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|p| {
            dirs.iter()
                .any(|d| Path::new(p).starts_with(d) || p.contains('\\'))
        })
        .map(|p| PathBuf::from(unescape_mountinfo(p)))
        .filter(|p| dirs.iter().any(|d| p.starts_with(d)))
        .collect();
    out.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes() {
        assert_eq!(unescape_mountinfo("/a\\040b\\134c"), "/a b\\c");
    }
}

#[cfg(test)]
mod trees {
    use super::*;

    #[test]
    fn a_tree_with_stacked_mounts_goes_without_reaching_through_them() {
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("keep"), b"x").unwrap();
        let d = tempfile::tempdir().unwrap();
        let (a, b) = (d.path().join("a"), d.path().join("b/c"));
        std::fs::create_dir_all(&a).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        for _ in 0..2 {
            nix::mount::mount(
                Some(outside.path()),
                &a,
                None::<&str>,
                nix::mount::MsFlags::MS_BIND,
                None::<&str>,
            )
            .unwrap();
        }
        remove_trees(&[&a, &d.path().join("b")]).unwrap();
        assert!(!a.exists() && !b.exists());
        assert!(
            outside.path().join("keep").exists(),
            "reached through a mount"
        );
    }
}
