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
