//! How much disk a layer directory holds (a container's writable layer): where the file system
//! keeps project quotas (ext4 or XFS mounted with `prjquota`), each layer gets a project ID
//! that everything below it inherits, and its bytes and inodes are read from the quota in one
//! call, however many files it has; elsewhere the directory is walked.

use std::fs::File;
use std::path::Path;
use std::sync::Mutex;

/// Project IDs crius gives layers start here (below are the operator's own projects).
const FIRST_PROJECT: u32 = 1 << 24;
/// How many IDs are tried for one layer before it is measured by walking instead.
const TRIES: u32 = 64;

/// Layer accounting for the layers below one directory.
pub struct LayerUsage {
    /// The layers' parent, open, when its file system keeps project quotas.
    quotas: Option<File>,
    /// Held while an ID is chosen and set: a layer's own directory is charged to its project
    /// at once, so an ID nothing is charged to is free.
    assigning: Mutex<()>,
}

impl LayerUsage {
    /// Accounting for layers below `root`, by quota when its file system keeps them.
    pub fn open(root: &Path) -> LayerUsage {
        let quotas = File::open(root)
            .ok()
            .filter(|f| crate::sys::project_usage(f, 0).is_ok());
        if quotas.is_some() {
            tracing::info!(dir = %root.display(), "writable layers are measured by project quota");
        }
        LayerUsage {
            quotas,
            assigning: Mutex::new(()),
        }
    }

    pub fn by_quota(&self) -> bool {
        self.quotas.is_some()
    }

    /// Gives the empty directory `dir` a project ID of its own, starting from one `seed` picks
    /// (a container's ID); none when there are no quotas here or no free ID was found.
    pub fn assign(&self, dir: &Path, seed: &str) -> std::io::Result<Option<u32>> {
        let Some(root) = &self.quotas else {
            return Ok(None);
        };
        let start = seed
            .bytes()
            .fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)));
        let span = u32::MAX - FIRST_PROJECT;
        let _one_at_a_time = self.assigning.lock().unwrap_or_else(|p| p.into_inner());
        for k in 0..TRIES {
            let id = FIRST_PROJECT + start.wrapping_add(k) % span;
            // Free when nothing on disk is charged to it (a removed layer's ID is free again).
            if crate::sys::project_usage(root, id)? != (0, 0) {
                continue;
            }
            let d = File::open(dir)?;
            crate::sys::set_project(&d, id)?;
            return Ok(Some(id));
        }
        Ok(None)
    }

    /// Bytes and inodes of layer `dir`: from its project's quota when it has one, else by a
    /// walk of the directory.
    pub fn measure(&self, dir: &Path, project: Option<u32>) -> (u64, u64) {
        if let (Some(root), Some(id)) = (&self.quotas, project)
            && let Ok(usage) = crate::sys::project_usage(root, id)
        {
            return usage;
        }
        walk(dir)
    }
}

/// How deep a walk goes (each level it goes down may hold its parent's descriptor), and how
/// many entries it counts: a container's comb of a million nested directories or its millions
/// of names would otherwise hold as many descriptors, or the walk, without end. What lies
/// beyond is not counted.
const MAX_DEPTH: usize = 512;
const MAX_ENTRIES: u64 = 4_000_000;

/// Bytes (allocated blocks) and inodes below `dir`, walked by descriptor (see `tree`): a
/// running container swapping a directory for a link to a host one sends it nowhere.
pub fn walk(dir: &Path) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    use std::rc::Rc;
    let (mut bytes, mut inodes) = (0u64, 0u64);
    let Ok(top) = super::tree::Dir::open(dir) else {
        return (0, 0);
    };
    // Directories still to walk, each by its parent (open while any is left), name and depth,
    // so the descriptors held stay few however wide the tree.
    type Pending = (Rc<super::tree::Dir>, std::ffi::OsString, usize);
    let mut todo: Vec<Pending> = Vec::new();
    let mut next = Some((top, 0));
    loop {
        if let Some((d, depth)) = next.take() {
            let d = Rc::new(d);
            for name in d.names().unwrap_or_default() {
                if inodes >= MAX_ENTRIES {
                    return (bytes, inodes);
                }
                let Ok(Some(e)) = d.entry(&name) else {
                    continue;
                };
                inodes += 1;
                bytes += e.meta.blocks() * 512;
                if e.meta.is_dir() && depth < MAX_DEPTH {
                    todo.push((d.clone(), name, depth + 1));
                }
            }
        }
        let Some((parent, name, depth)) = todo.pop() else {
            break;
        };
        next = parent
            .entry(&name)
            .ok()
            .flatten()
            .and_then(|e| e.open_dir().ok())
            .map(|d| (d, depth));
    }
    (bytes, inodes)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_walk_stops_at_its_depth() {
        let d = tempfile::tempdir().unwrap();
        let deep: std::path::PathBuf = std::iter::repeat_n("d", 600).collect();
        std::fs::create_dir_all(d.path().join(&deep)).unwrap();
        std::fs::write(d.path().join("f"), b"x").unwrap();
        let (_, inodes) = super::walk(d.path());
        // The file, and the directories down to the depth walked (their entries counted one
        // level further).
        assert_eq!(inodes, 1 + super::MAX_DEPTH as u64 + 1);
    }
}
