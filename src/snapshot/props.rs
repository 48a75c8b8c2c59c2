//! Property tests of the unpacker: random layers with hostile names, link targets, whiteouts,
//! modes and sizes never write outside the layer directory, never panic, and, when the input is
//! benign, give exactly the tree a reference model says.

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use proptest::prelude::*;
use tar::EntryType;

use super::copyup::copy_up;
use super::unpack::tests::Layer;
use super::unpack::{UnpackError, UnpackOptions, unpack};

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// A path component, hostile ones included.
fn component() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => Just("a".to_string()),
        4 => Just("b".to_string()),
        2 => Just("c".to_string()),
        2 => Just("..".to_string()),
        1 => Just(".".to_string()),
        1 => Just("".to_string()),
        1 => Just(".wh.a".to_string()),
        1 => Just(".wh..wh..opq".to_string()),
        1 => Just("x".repeat(40)),
    ]
}

fn path() -> impl Strategy<Value = String> {
    (any::<bool>(), prop::collection::vec(component(), 1..4))
        .prop_map(|(abs, parts)| format!("{}{}", if abs { "/" } else { "" }, parts.join("/")))
        .prop_filter("tar names fit 100 bytes", |p| {
            !p.is_empty() && p.len() < 100
        })
}

#[derive(Debug, Clone)]
enum Hostile {
    File(String, Vec<u8>, u32),
    Dir(String, u32),
    Symlink(String, String),
    Hardlink(String, String),
    Fifo(String),
}

fn hostile() -> impl Strategy<Value = Hostile> {
    let mode = prop_oneof![
        Just(0o644u32),
        Just(0o755),
        Just(0o4755),
        Just(0o000),
        Just(0o7777)
    ];
    prop_oneof![
        3 => (path(), prop::collection::vec(any::<u8>(), 0..64), mode.clone())
            .prop_map(|(p, d, m)| Hostile::File(p, d, m)),
        2 => (path(), mode).prop_map(|(p, m)| Hostile::Dir(p, m)),
        2 => (path(), prop_oneof![path(), Just("/".to_string()), Just("../../..".to_string())])
            .prop_map(|(p, t)| Hostile::Symlink(p, t)),
        2 => (path(), path()).prop_map(|(p, t)| Hostile::Hardlink(p, t)),
        1 => path().prop_map(Hostile::Fifo),
    ]
}

fn build(entries: &[Hostile]) -> Vec<u8> {
    let mut l = Layer::new();
    for e in entries {
        match e {
            // Whiteouts (`.wh.` names) need CAP_MKNOD: without root they stay plain names.
            Hostile::File(p, d, m) if is_root() || !p.contains(".wh.") => {
                l.entry(p, EntryType::Regular, d, None, *m);
            }
            Hostile::File(..) => {}
            Hostile::Dir(p, m) => {
                l.entry(&format!("{p}/"), EntryType::Directory, b"", None, *m);
            }
            Hostile::Symlink(p, t) => {
                l.symlink(p, t);
            }
            Hostile::Hardlink(p, t) => {
                l.hardlink(p, t);
            }
            Hostile::Fifo(p) => {
                l.entry(p, EntryType::Fifo, b"", None, 0o644);
            }
        }
    }
    l.bytes()
}

/// Every path below `dir` with its kind, size and mode, not following symlinks.
fn tree(dir: &Path) -> BTreeMap<String, (String, u64, u32)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let m = std::fs::symlink_metadata(e.path()).unwrap();
            let rel = e.path().strip_prefix(dir).unwrap().display().to_string();
            let kind = if m.is_dir() {
                stack.push(e.path());
                "dir".to_string()
            } else if m.file_type().is_symlink() {
                format!("link:{}", std::fs::read_link(e.path()).unwrap().display())
            } else if m.is_file() {
                format!(
                    "file:{}",
                    String::from_utf8_lossy(&std::fs::read(e.path()).unwrap())
                )
            } else {
                "special".to_string()
            };
            out.insert(rel, (kind, m.len(), m.permissions().mode() & 0o7777));
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Whatever the layer holds, nothing outside the layer directory changes, and unpacking
    /// ends in a result or a named refusal, never a panic.
    #[test]
    fn hostile_layers_stay_inside(entries in prop::collection::vec(hostile(), 1..12)) {
        let tmp = tempfile::tempdir().unwrap();
        let layer = tmp.path().join("l/layer");
        let outside = tmp.path().join("l/outside");
        std::fs::create_dir_all(&layer).unwrap();
        std::fs::create_dir_all(outside.join("a/b")).unwrap();
        std::fs::write(outside.join("a/b/c"), b"sentinel").unwrap();
        let before = tree(tmp.path());
        let lower = tmp.path().join("l/outside");
        let result = unpack(&build(&entries)[..], &layer, &UnpackOptions::default())
            .and_then(|s| copy_up(&layer, &s.lower_links, std::slice::from_ref(&lower)).map(|_| ()));
        if let Err(e) = &result {
            // Every refusal names the entry and why.
            let text = e.to_string();
            prop_assert!(!text.is_empty());
            if let UnpackError::Rejected { path, reason } = e {
                prop_assert!(!path.is_empty() && !reason.is_empty(), "{text}");
            }
        }
        let after: BTreeMap<_, _> = tree(tmp.path())
            .into_iter()
            .filter(|(p, _)| !p.starts_with("l/layer"))
            .collect();
        let before: BTreeMap<_, _> =
            before.into_iter().filter(|(p, _)| !p.starts_with("l/layer")).collect();
        prop_assert_eq!(before, after);
    }

    /// Benign layers (plain names, files and directories, overwrites, hardlinks to what the
    /// layer holds) give the tree of a simple model: the last entry for a name wins.
    #[test]
    fn benign_layers_match_the_model(
        entries in prop::collection::vec(
            (prop::sample::select(vec!["d1/f1", "d1/f2", "d2/f1", "f1", "d1/d3/f4"]),
             prop::collection::vec(any::<u8>(), 0..32),
             prop::sample::select(vec![0o644u32, 0o600, 0o755]),
             any::<bool>()),
            1..16,
        )
    ) {
        let tmp = tempfile::tempdir().unwrap();
        let mut l = Layer::new();
        let mut model: BTreeMap<String, (Vec<u8>, u32, Option<String>)> = BTreeMap::new();
        for (name, data, mode, link) in &entries {
            // A hardlink to a file written before, else a plain file.
            let target = model.keys().find(|k| k.as_str() != *name).cloned();
            match (link, target) {
                (true, Some(t)) => {
                    l.hardlink(name, &t);
                    let (d, m, _) = model[&t].clone();
                    // Both names now share one inode: the target's content and mode.
                    model.insert(name.to_string(), (d, m, Some(t)));
                }
                _ => {
                    l.entry(name, EntryType::Regular, data, None, *mode);
                    model.insert(name.to_string(), (data.clone(), *mode, None));
                }
            }
        }
        unpack(&l.bytes()[..], tmp.path(), &UnpackOptions::default()).unwrap();
        for (name, (data, mode, _)) in &model {
            let p = tmp.path().join(name);
            prop_assert_eq!(&std::fs::read(&p).unwrap(), data, "{}", name);
            prop_assert_eq!(std::fs::metadata(&p).unwrap().mode() & 0o7777, *mode, "{}", name);
        }
        let files = tree(tmp.path()).into_iter().filter(|(_, (k, ..))| k != "dir").count();
        prop_assert_eq!(files, model.len());
    }
}
