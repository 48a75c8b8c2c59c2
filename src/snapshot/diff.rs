//! A writable layer's changes as a tar in OCI layer form, for a checkpoint's `rootfs-diff.tar`:
//! files, directories and links as they are in the overlay's upper directory, a whiteout (0/0
//! character device) as an empty `.wh.NAME`, an opaque directory as `DIR/.wh..wh..opq`. `unpack`
//! reads it back into a fresh upper directory with the same hostile-input rules as any layer.

use std::fs::{self, File};
use std::io::{self, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

use crate::sys;

/// Writes the changes held in `upper` to `out`; returns the paths the layer deletes (absolute in
/// the container's root), which CRI-O's archive layout lists in `deleted.files`.
pub fn write_diff<W: Write>(upper: &Path, out: W) -> io::Result<Vec<String>> {
    let mut tar = tar::Builder::new(out);
    tar.follow_symlinks(false);
    let mut deleted = Vec::new();
    add_dir(&mut tar, upper, Path::new(""), &mut deleted)?;
    tar.into_inner()?.flush()?;
    Ok(deleted)
}

fn add_dir<W: Write>(
    tar: &mut tar::Builder<W>,
    dir: &Path,
    rel: &Path,
    deleted: &mut Vec<String>,
) -> io::Result<()> {
    let mut names: Vec<_> = fs::read_dir(dir)?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<Result<_, _>>()?;
    // The same layer gives the same archive.
    names.sort();
    for name in names {
        let full = dir.join(&name);
        let path = rel.join(&name);
        let meta = fs::symlink_metadata(&full)?;
        let kind = meta.file_type();
        if kind.is_char_device() && meta.rdev() == 0 {
            let marker = rel.join(format!(".wh.{}", name.to_string_lossy()));
            empty_file(tar, &marker)?;
            deleted.push(format!("/{}", path.display()));
        } else if kind.is_dir() {
            tar.append_dir(&path, &full)?;
            let fd = File::open(&full)?;
            if sys::fgetxattr(&fd, b"trusted.overlay.opaque")?.as_deref() == Some(b"y") {
                empty_file(tar, &path.join(".wh..wh..opq"))?;
            }
            add_dir(tar, &full, &path, deleted)?;
        } else if kind.is_socket() {
            // A socket file is nothing without its process; CRIU restores bound ones itself.
            continue;
        } else {
            tar.append_path_with_name(&full, &path)?;
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

    #[test]
    fn a_layer_written_as_a_diff_unpacks_to_the_same_files() {
        let d = tempfile::tempdir().unwrap();
        let upper = d.path().join("upper");
        fs::create_dir_all(upper.join("etc/conf.d")).unwrap();
        fs::write(upper.join("etc/conf.d/a"), b"alpha").unwrap();
        fs::write(upper.join("count"), b"41\n").unwrap();
        std::os::unix::fs::symlink("count", upper.join("link")).unwrap();
        let mut out = Vec::new();
        let deleted = write_diff(&upper, &mut out).unwrap();
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
    }
}
