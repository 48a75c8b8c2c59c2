//! A writable layer's changes as a tar in OCI layer form, for a checkpoint's `rootfs-diff.tar`:
//! files, directories and links as they are in the overlay's upper directory, a whiteout (0/0
//! character device) as an empty `.wh.NAME`, an opaque directory as `DIR/.wh..wh..opq`. `unpack`
//! reads it back into a fresh upper directory with the same hostile-input rules as any layer.

use std::collections::HashMap;
use std::io::{self, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use super::tree::{Dir, Entry};
use crate::sys;

/// Writes the changes held in `upper` to `out`; returns the paths the layer deletes (absolute in
/// the container's root), which CRI-O's archive layout lists in `deleted.files`. The container
/// may still be running: the layer is read by descriptor (see `tree`), so a name it swaps for a
/// link to a host file or directory adds the link, never the host's file.
///
/// The container's files are hostile in size too: a name linked many times is written once (then
/// as hard links to it), and the files' bytes may not pass `limit` (a sparse file of terabytes
/// costs the container nothing, and would fill the disk the diff is written to).
pub fn write_diff<W: Write>(upper: &Path, out: W, limit: u64) -> io::Result<Vec<String>> {
    let mut tar = tar::Builder::new(out);
    tar.follow_symlinks(false);
    let mut w = Walk {
        deleted: Vec::new(),
        linked: HashMap::new(),
        room: limit,
    };
    add_dir(&mut tar, &Dir::open(upper)?, Path::new(""), 0, &mut w)?;
    tar.into_inner()?.flush()?;
    Ok(w.deleted)
}

/// What a diff's walk carries along.
struct Walk {
    /// The paths the layer deletes.
    deleted: Vec<String>,
    /// Files with more than one name: the first name written, by device and inode.
    linked: HashMap<(u64, u64), PathBuf>,
    /// Bytes of file data still allowed.
    room: u64,
}

fn header(entry: &Entry) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_metadata_in_mode(&entry.meta, tar::HeaderMode::Complete);
    h
}

/// How deep a layer's directories may nest in a diff (each level holds a descriptor and a
/// stack frame; a container could nest them without end).
const MAX_DEPTH: usize = 512;

fn add_dir<W: Write>(
    tar: &mut tar::Builder<W>,
    dir: &Dir,
    rel: &Path,
    depth: usize,
    w: &mut Walk,
) -> io::Result<()> {
    if depth > MAX_DEPTH {
        return Err(io::Error::other(format!(
            "{}: directories nested deeper than {MAX_DEPTH}",
            rel.display()
        )));
    }
    // The same layer gives the same archive.
    for name in dir.names()? {
        let path = rel.join(&name);
        // Gone meanwhile, or a mount: nothing of the layer.
        let Some(entry) = dir.entry(&name)? else {
            continue;
        };
        let kind = entry.meta.file_type();
        if kind.is_char_device() && entry.meta.rdev() == 0 {
            let marker = rel.join(format!(".wh.{}", name.to_string_lossy()));
            empty_file(tar, &marker)?;
            w.deleted.push(format!("/{}", path.display()));
        } else if kind.is_dir() {
            let mut h = header(&entry);
            h.set_size(0);
            tar.append_data(&mut h, &path, io::empty())?;
            let sub = entry.open_dir()?;
            if sys::fgetxattr(sub.file()?, b"trusted.overlay.opaque")?.as_deref() == Some(b"y") {
                empty_file(tar, &path.join(".wh..wh..opq"))?;
            }
            add_dir(tar, &sub, &path, depth + 1, w)?;
        } else if kind.is_symlink() {
            let mut h = header(&entry);
            h.set_size(0);
            tar.append_link(&mut h, &path, entry.link_target()?)?;
        } else if kind.is_file() {
            let mut h = header(&entry);
            if entry.meta.nlink() > 1 {
                let key = (entry.meta.dev(), entry.meta.ino());
                if let Some(first) = w.linked.get(&key) {
                    h.set_entry_type(tar::EntryType::Link);
                    h.set_size(0);
                    tar.append_link(&mut h, &path, first)?;
                    continue;
                }
                w.linked.insert(key, path.clone());
            }
            let file = entry.open_file()?;
            // The size the handle has now: a file still being written is cut there.
            let len = file.metadata()?.len();
            w.room = w.room.checked_sub(len).ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::StorageFull,
                    format!(
                        "{}: {len} bytes pass the room left for the diff",
                        path.display()
                    ),
                )
            })?;
            h.set_size(len);
            tar.append_data(&mut h, &path, io::Read::take(file, len))?;
        } else if kind.is_socket() {
            // A socket file is nothing without its process; CRIU restores bound ones itself.
            continue;
        } else {
            // A device node or FIFO: its header alone.
            let mut h = header(&entry);
            h.set_size(0);
            tar.append_data(&mut h, &path, io::empty())?;
        }
    }
    Ok(())
}

fn empty_file<W: Write>(tar: &mut tar::Builder<W>, path: &Path) -> io::Result<()> {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_size(0);
    h.set_mode(0o644);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    tar.append_data(&mut h, path, io::empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::{UnpackOptions, unpack::unpack};
    use std::fs;

    #[test]
    fn a_layer_written_as_a_diff_unpacks_to_the_same_files() {
        let d = tempfile::tempdir().unwrap();
        let upper = d.path().join("upper");
        fs::create_dir_all(upper.join("etc/conf.d")).unwrap();
        fs::write(upper.join("etc/conf.d/a"), b"alpha").unwrap();
        fs::write(upper.join("count"), b"41\n").unwrap();
        std::os::unix::fs::symlink("count", upper.join("link")).unwrap();
        // A link to a file and a directory outside: the links themselves, nothing behind them.
        let outside = tempfile::tempdir().unwrap();
        fs::write(outside.path().join("secret"), b"host").unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret"), upper.join("out")).unwrap();
        std::os::unix::fs::symlink(outside.path(), upper.join("outdir")).unwrap();
        let mut out = Vec::new();
        let deleted = write_diff(&upper, &mut out, u64::MAX).unwrap();
        assert!(deleted.is_empty());
        let back = d.path().join("back");
        fs::create_dir(&back).unwrap();
        unpack(&out[..], &back, &UnpackOptions::default()).unwrap();
        assert_eq!(fs::read(back.join("etc/conf.d/a")).unwrap(), b"alpha");
        assert_eq!(fs::read(back.join("count")).unwrap(), b"41\n");
        assert_eq!(
            fs::read_link(back.join("link")).unwrap(),
            Path::new("count")
        );
        assert_eq!(
            fs::read_link(back.join("out")).unwrap(),
            outside.path().join("secret")
        );
        assert!(
            fs::symlink_metadata(back.join("outdir"))
                .unwrap()
                .is_symlink()
        );
        assert!(!String::from_utf8_lossy(&out).contains("host"));
    }

    #[test]
    fn a_file_of_many_names_is_written_once_and_room_is_bounded() {
        let d = tempfile::tempdir().unwrap();
        let upper = d.path().join("upper");
        fs::create_dir_all(&upper).unwrap();
        fs::write(upper.join("big"), vec![7u8; 1 << 20]).unwrap();
        for i in 0..20 {
            fs::hard_link(upper.join("big"), upper.join(format!("name{i}"))).unwrap();
        }
        let mut out = Vec::new();
        write_diff(&upper, &mut out, 2 << 20).unwrap();
        // One copy of the data, not 21.
        assert!(out.len() < (3 << 20) / 2, "{} bytes", out.len());
        let back = d.path().join("back");
        fs::create_dir(&back).unwrap();
        unpack(&out[..], &back, &UnpackOptions::default()).unwrap();
        let a = fs::metadata(back.join("big")).unwrap();
        let b = fs::metadata(back.join("name7")).unwrap();
        assert_eq!((a.ino(), a.len()), (b.ino(), 1 << 20));

        // A sparse file of a terabyte costs no blocks: refused at the room given, not written.
        fs::File::create(upper.join("sparse"))
            .unwrap()
            .set_len(1 << 40)
            .unwrap();
        let e = write_diff(&upper, io::sink(), 64 << 30).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::StorageFull, "{e}");
    }
}
