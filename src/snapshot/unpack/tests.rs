//! Tests of layer extraction: hostile names and links, whiteouts, attributes, limits.

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
fn whiteouts_hide_lower_layers_only() {
    if !is_root() {
        eprintln!("skipped: whiteouts need CAP_MKNOD and trusted xattrs (root)");
        return;
    }
    let c = case();
    let wh = |name: &str| (name.to_string(), EntryType::Regular);
    let mut l = Layer::new();
    for (name, kind) in [
        // Whited out, then made again with a file: an opaque directory.
        wh("again/.wh.dir"),
        ("again/dir/".to_string(), EntryType::Directory),
        // Whited out, then a file inside with no directory entry: the same.
        wh(".wh.implied"),
        ("implied/new".to_string(), EntryType::Regular),
        // This layer's directory, then its whiteout: it stays, opaque.
        ("kept/".to_string(), EntryType::Directory),
        wh(".wh.kept"),
        // This layer's file, then its whiteout: the file stays.
        ("file".to_string(), EntryType::Regular),
        wh(".wh.file"),
        // Whited out, then a file of the same name: the file.
        wh(".wh.swap"),
        ("swap".to_string(), EntryType::Regular),
    ] {
        let data: &[u8] = if kind == EntryType::Directory || name.contains(".wh.") {
            b""
        } else {
            b"x"
        };
        l.entry(&name, kind, data, None, 0o755);
    }
    l.file("again/dir/new", b"new");
    l.file("kept/mine", b"mine");
    run(&c, &l.bytes()).unwrap();
    let opaque = |p: &str| {
        let dir = File::open(c.layer.join(p)).unwrap();
        sys::fgetxattr(&dir, OPAQUE_XATTR).unwrap()
    };
    assert_eq!(opaque("again/dir"), Some(b"y".to_vec()));
    assert_eq!(opaque("implied"), Some(b"y".to_vec()));
    assert_eq!(opaque("kept"), Some(b"y".to_vec()));
    assert_eq!(opaque("again"), None);
    assert_eq!(
        std::fs::read(c.layer.join("again/dir/new")).unwrap(),
        b"new"
    );
    assert_eq!(std::fs::read(c.layer.join("implied/new")).unwrap(), b"x");
    assert_eq!(std::fs::read(c.layer.join("kept/mine")).unwrap(), b"mine");
    assert_eq!(std::fs::read(c.layer.join("file")).unwrap(), b"x");
    assert_eq!(std::fs::read(c.layer.join("swap")).unwrap(), b"x");
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
