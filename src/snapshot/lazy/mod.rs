//! lazy: eStargz layers a container can use before they are pulled. Each such layer gets a
//! directory of its own under `<root>/lazy`: its verified table of contents (`toc.json`), where
//! it came from (`source.json`), a sparse cache file the daemon fills with verified chunks, the
//! socket the daemon answers chunk requests on, and `mnt`, where the `crius lazyfs` helper serves
//! the layer over FUSE as an overlay lower directory. The helper is a process of its own, so a
//! running container keeps its files across a daemon restart; it ends when its mount is
//! detached and the last overlay over it goes. Uses `toc`, `fs`, `content::Digest`, `atomic`.

pub mod fs;
pub mod toc;

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

use crate::content::Digest;

#[derive(Debug, thiserror::Error)]
pub enum DirError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("no source.json")]
    NoSource,
    #[error(transparent)]
    Toc(#[from] toc::TocError),
    #[error("mounting: {0}")]
    Mount(std::io::Error),
}

/// What the served lazy layers may hold at once, in TOC nodes, chunks and `LAYER_WEIGHT`s: the
/// daemon and each layer's helper keep its tree in memory (some hundreds of bytes a node), and a
/// TOC of a few kilobytes compressed can name a million nodes (long names make their parents).
/// Past it, a layer is pulled whole.
pub const MAX_SERVED_WEIGHT: u64 = 1 << 22;
/// What a layer counts besides its tree: its helper process, FUSE mount and socket.
pub const LAYER_WEIGHT: u64 = 4096;

#[derive(Debug, thiserror::Error)]
#[error("serving it would take {want} more of the lazy layers' {limit} ({used} are held)")]
pub struct BudgetError {
    pub want: u64,
    pub used: u64,
    pub limit: u64,
}

/// The weight every served lazy layer holds (see `MAX_SERVED_WEIGHT`).
#[derive(Debug, Clone)]
pub struct Budget {
    used: Arc<AtomicU64>,
    limit: u64,
}

/// One layer's share of a `Budget`, given back when dropped.
#[derive(Debug)]
pub struct Held {
    used: Arc<AtomicU64>,
    weight: u64,
}

impl Budget {
    pub fn new(limit: u64) -> Budget {
        Budget {
            used: Arc::default(),
            limit,
        }
    }

    /// What serving `tree` weighs.
    pub fn weight(tree: &toc::Tree) -> u64 {
        (tree.nodes.len() as u64)
            .saturating_add(tree.chunks.len() as u64)
            .saturating_add(LAYER_WEIGHT)
    }

    /// `weight` more, if it fits.
    pub fn take(&self, weight: u64) -> Result<Held, BudgetError> {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(weight).filter(|n| *n <= self.limit)
            })
            .map_err(|used| BudgetError {
                want: weight,
                used,
                limit: self.limit,
            })?;
        Ok(Held {
            used: self.used.clone(),
            weight,
        })
    }

    /// `weight` more whether or not it fits: a layer already serving containers (after a
    /// restart) is counted, never refused.
    pub fn force(&self, weight: u64) -> Held {
        let _ = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                Some(used.saturating_add(weight))
            });
        Held {
            used: self.used.clone(),
            weight,
        }
    }

    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Acquire)
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let weight = self.weight;
        let _ = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                Some(used.saturating_sub(weight))
            });
    }
}

/// Where one lazy layer came from and where it sits in its image.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Source {
    /// The image reference it was pulled by (its repository serves the blob).
    pub reference: String,
    pub digest: Digest,
    pub size: u64,
    pub toc_offset: u64,
    pub chain_id: Digest,
    pub toc_digest: Digest,
    /// `image.allow_device_nodes` when it was pulled: the helper parses the TOC as it was.
    pub allow_devices: bool,
    /// Every chain of the images it was served for (their snapshots are kept while it is).
    #[serde(default)]
    pub image_chains: Vec<Digest>,
}

/// One lazy layer's directory.
#[derive(Debug, Clone)]
pub struct LazyDir {
    path: PathBuf,
}

impl LazyDir {
    pub fn new(path: PathBuf) -> LazyDir {
        LazyDir { path }
    }
    pub fn path(&self) -> &Path {
        &self.path
    }
    pub fn toc(&self) -> PathBuf {
        self.path.join("toc.json")
    }
    pub fn source(&self) -> PathBuf {
        self.path.join("source.json")
    }
    pub fn cache(&self) -> PathBuf {
        self.path.join("cache")
    }
    pub fn socket(&self) -> PathBuf {
        self.path.join("fetch.sock")
    }
    pub fn mnt(&self) -> PathBuf {
        self.path.join("mnt")
    }
    /// The helper's process ID, written by the daemon once it is ready.
    pub fn pid_file(&self) -> PathBuf {
        self.path.join("helper.pid")
    }

    /// The tree the directory's TOC describes, checked again.
    pub fn tree(&self) -> Result<(Source, toc::Tree), DirError> {
        let io = |path: PathBuf| move |source| DirError::Io { path, source };
        let source: Source = crate::atomic::read_json(&self.source())
            .map_err(io(self.source()))?
            .ok_or(DirError::NoSource)?;
        let json = std::fs::read(self.toc()).map_err(io(self.toc()))?;
        let tree = toc::Tree::parse(&json, source.toc_offset, source.allow_devices)?;
        Ok((source, tree))
    }
}

/// `crius lazyfs DIR`: mounts DIR's layer on DIR/mnt, says `ready` on stdout, and serves it
/// until the mount goes. Any other first line is why it could not.
pub fn main(dir: &Path) -> i32 {
    let dir = LazyDir::new(dir.to_path_buf());
    let mut out = std::io::stdout();
    let session = dir.tree().and_then(|(_, tree)| {
        let cache = File::open(dir.cache()).map_err(|source| DirError::Io {
            path: dir.cache(),
            source,
        })?;
        let served = fs::LazyFs::new(tree, cache, dir.socket());
        let options = [
            fuser::MountOption::FSName("crius-lazy".into()),
            fuser::MountOption::Subtype("estargz".into()),
            fuser::MountOption::RO,
            // Modes hold here as on a disk. Only the mounter (root: overlay reaches its
            // lowers with the mounter's credentials) may use it; set-id bits and devices
            // count through the overlay's own mount, never straight from this one.
            fuser::MountOption::DefaultPermissions,
            fuser::MountOption::NoSuid,
            fuser::MountOption::NoDev,
            fuser::MountOption::Exec,
        ];
        fuser::Session::new(served, dir.mnt(), &options).map_err(DirError::Mount)
    });
    let mut session = match session {
        Ok(s) => s,
        Err(e) => {
            let _ = writeln!(out, "{e}");
            return 1;
        }
    };
    if writeln!(out, "ready").and_then(|()| out.flush()).is_err() {
        return 1;
    }
    match session.run() {
        Ok(()) => 0,
        Err(_) => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_refuses_past_its_limit_and_takes_back_what_is_dropped() {
        let b = Budget::new(10);
        let six = b.take(6).unwrap();
        let err = b.take(5).unwrap_err();
        assert_eq!((err.want, err.used, err.limit), (5, 6, 10));
        assert!(b.take(u64::MAX).is_err(), "no overflow past the limit");
        let four = b.take(4).unwrap();
        assert_eq!(b.used(), 10);
        drop(six);
        assert_eq!(b.used(), 4);
        let forced = b.force(20);
        assert_eq!(b.used(), 24);
        assert!(b.take(1).is_err());
        drop((four, forced));
        assert_eq!(b.used(), 0);
    }

    #[test]
    fn a_small_toc_of_long_names_weighs_its_implicit_directories() {
        // 40 entries of 100 components each: 4 KB of JSON, 4,000 directories.
        let entries: Vec<serde_json::Value> = (0..40)
            .map(|i| {
                let name = format!("{i}/{}", vec!["d"; 99].join("/"));
                serde_json::json!({"name": name, "type": "dir"})
            })
            .collect();
        let json =
            serde_json::to_vec(&serde_json::json!({"version": 1, "entries": entries})).unwrap();
        let tree = toc::Tree::parse(&json, 1000, false).unwrap();
        assert_eq!(tree.nodes.len(), 1 + 40 * 100);
        assert_eq!(Budget::weight(&tree), 4001 + LAYER_WEIGHT);
    }
}
