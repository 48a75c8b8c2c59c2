//! snapshot: unpacked image layers, each an overlayfs lower directory keyed by its chain ID, and
//! the list of lower directories that stacks a chain for a container's rootfs. A layer is unpacked
//! into a private ingest directory and renamed into place only when complete and verified, so a
//! snapshot under its chain ID is always whole. Layers never need their parents mounted: OCI
//! whiteouts become overlay whiteouts (see `unpack`). How much disk a writable layer holds is
//! measured here too (`usage`: by project quota where the file system keeps them), and its
//! changes written as a layer tar for a checkpoint (`diff`). Uses
//! `content::Digest`, `atomic`, `sys`.

pub mod copyup;
pub mod diff;
pub mod lazy;
#[cfg(test)]
mod props;
mod tree;
pub mod unpack;
pub mod usage;

use std::ffi::OsString;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::atomic;
use crate::content::Digest;

/// A hardlink entry whose target was not in its own layer (yet): `unpack` records them,
/// `copyup` resolves them once the layers below are in place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LowerLink {
    pub name: Vec<OsString>,
    pub target: Vec<OsString>,
    /// The entry's name as the archive wrote it, for errors.
    pub shown: String,
}

pub use unpack::{UnpackError, UnpackOptions, UnpackStats};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("snapshot store {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("snapshot {chain_id} is missing (its image must be pulled again)")]
    Missing { chain_id: Digest },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// What is recorded next to each snapshot's `fs` directory.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Meta {
    pub chain_id: Digest,
    pub parent: Option<Digest>,
    pub diff_id: Digest,
    /// Bytes of regular file data in the layer.
    pub size: u64,
    /// Files, directories and links the layer created.
    pub inodes: u64,
}

/// The snapshot store rooted at `<root>/snapshots`.
#[derive(Debug, Clone)]
pub struct Snapshotter {
    root: PathBuf,
    ingest: PathBuf,
}

/// An unpack in progress; removed on drop unless committed.
pub struct Prepared {
    dir: PathBuf,
    committed: bool,
}

impl Prepared {
    /// The directory the layer is unpacked into.
    pub fn fs(&self) -> PathBuf {
        self.dir.join("fs")
    }
}

impl Drop for Prepared {
    fn drop(&mut self) {
        if !self.committed {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

impl Snapshotter {
    /// Opens the store; half-unpacked layers from a crash are removed (a pull redoes them from the
    /// content store's ingest file).
    pub fn open(root: &Path) -> Result<Snapshotter, Error> {
        let s = Snapshotter {
            root: root.to_path_buf(),
            ingest: root.join("ingest"),
        };
        if s.ingest.exists() {
            fs::remove_dir_all(&s.ingest).map_err(io_err(&s.ingest))?;
        }
        fs::create_dir_all(&s.ingest).map_err(io_err(&s.ingest))?;
        Ok(s)
    }

    fn dir(&self, chain_id: &Digest) -> PathBuf {
        self.root.join(chain_id.hex())
    }

    /// The lower directory of one snapshot.
    pub fn fs_dir(&self, chain_id: &Digest) -> PathBuf {
        self.dir(chain_id).join("fs")
    }

    pub fn exists(&self, chain_id: &Digest) -> bool {
        self.dir(chain_id).join("meta.json").is_file()
    }

    /// A fresh private directory to unpack a layer into.
    pub fn prepare(&self) -> Result<Prepared, Error> {
        let mut rnd = [0u8; 8];
        getrandom::fill(&mut rnd).map_err(|e| io_err(&self.ingest)(io::Error::other(e)))?;
        let dir = self.ingest.join(hex::encode(rnd));
        let fs_dir = dir.join("fs");
        fs::create_dir_all(&fs_dir).map_err(io_err(&fs_dir))?;
        Ok(Prepared {
            dir,
            committed: false,
        })
    }

    /// Makes an unpacked layer visible under its chain ID. If another pull committed the same
    /// chain first, ours is dropped.
    pub fn commit(&self, mut prepared: Prepared, meta: &Meta) -> Result<(), Error> {
        atomic::write_json(&prepared.dir.join("meta.json"), meta).map_err(io_err(&prepared.dir))?;
        let target = self.dir(&meta.chain_id);
        if self.exists(&meta.chain_id) {
            return Ok(());
        }
        if target.exists() {
            // A directory without meta.json is not a snapshot: a leftover we may replace.
            fs::remove_dir_all(&target).map_err(io_err(&target))?;
        }
        crate::fault::point("snapshot.commit.before");
        fs::rename(&prepared.dir, &target).map_err(io_err(&target))?;
        prepared.committed = true;
        atomic::sync_dir(&self.root).map_err(io_err(&self.root))?;
        crate::fault::point("snapshot.commit.after");
        Ok(())
    }

    pub fn meta(&self, chain_id: &Digest) -> Result<Meta, Error> {
        let path = self.dir(chain_id).join("meta.json");
        match atomic::read_json(&path).map_err(io_err(&path))? {
            Some(m) => Ok(m),
            None => Err(Error::Missing {
                chain_id: chain_id.clone(),
            }),
        }
    }

    /// Removes a snapshot. The meta file goes first so a crash never leaves a half-removed
    /// directory that looks whole.
    pub fn remove(&self, chain_id: &Digest) -> Result<(), Error> {
        let dir = self.dir(chain_id);
        let meta = dir.join("meta.json");
        atomic::remove(&meta).map_err(io_err(&meta))?;
        match fs::remove_dir_all(&dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_err(&dir)(e)),
        }
    }

    /// Every committed snapshot.
    pub fn list(&self) -> Result<Vec<Meta>, Error> {
        let mut out = Vec::new();
        for entry in fs::read_dir(&self.root).map_err(io_err(&self.root))? {
            let entry = entry.map_err(io_err(&self.root))?;
            let Some(chain) = entry
                .file_name()
                .to_str()
                .and_then(|n| Digest::from_hex(n).ok())
            else {
                continue;
            };
            match self.meta(&chain) {
                Ok(m) => out.push(m),
                Err(Error::Missing { .. }) => {
                    // A crash between meta removal and directory removal: finish the job.
                    let _ = fs::remove_dir_all(entry.path());
                }
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    /// The lower directories for a rootfs stacked on `top`, topmost first (overlayfs order).
    pub fn lowerdirs(&self, top: &Digest) -> Result<Vec<PathBuf>, Error> {
        let mut out = Vec::new();
        let mut next = Some(top.clone());
        while let Some(chain) = next {
            let meta = self.meta(&chain)?;
            out.push(self.fs_dir(&chain));
            next = meta.parent;
        }
        Ok(out)
    }

    /// Where snapshots live (for filesystem usage reports).
    pub fn root(&self) -> &Path {
        &self.root
    }
}

/// The chain IDs of a stack of layers: `chain[0] = diff[0]`,
/// `chain[i] = sha256(chain[i-1] + " " + diff[i])`.
pub fn chain_ids(diff_ids: &[Digest]) -> Vec<Digest> {
    let mut out: Vec<Digest> = Vec::with_capacity(diff_ids.len());
    for diff in diff_ids {
        let next = match out.last() {
            None => diff.clone(),
            Some(parent) => Digest::of(format!("{parent} {diff}").as_bytes()),
        };
        out.push(next);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_ids_follow_the_oci_definition() {
        let a = Digest::of(b"a");
        let b = Digest::of(b"b");
        let chains = chain_ids(&[a.clone(), b.clone()]);
        assert_eq!(chains[0], a);
        assert_eq!(chains[1], Digest::of(format!("{a} {b}").as_bytes()));
    }

    #[test]
    fn commit_list_lowerdirs_remove() {
        let dir = tempfile::tempdir().unwrap();
        let snaps = Snapshotter::open(dir.path()).unwrap();
        let diffs = [Digest::of(b"1"), Digest::of(b"2")];
        let chains = chain_ids(&diffs);
        for (i, chain) in chains.iter().enumerate() {
            let p = snaps.prepare().unwrap();
            fs::write(p.fs().join(format!("f{i}")), b"x").unwrap();
            let meta = Meta {
                chain_id: chain.clone(),
                parent: i.checked_sub(1).map(|j| chains[j].clone()),
                diff_id: diffs[i].clone(),
                size: 1,
                inodes: 1,
            };
            snaps.commit(p, &meta).unwrap();
        }
        assert_eq!(snaps.list().unwrap().len(), 2);
        let lowers = snaps.lowerdirs(&chains[1]).unwrap();
        assert_eq!(
            lowers,
            vec![snaps.fs_dir(&chains[1]), snaps.fs_dir(&chains[0])]
        );
        // an abandoned prepare leaves nothing
        drop(snaps.prepare().unwrap());
        assert_eq!(fs::read_dir(dir.path().join("ingest")).unwrap().count(), 0);
        snaps.remove(&chains[0]).unwrap();
        assert!(matches!(
            snaps.lowerdirs(&chains[1]),
            Err(Error::Missing { .. })
        ));
        snaps.remove(&chains[0]).unwrap();
    }
}
