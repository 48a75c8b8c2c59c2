//! atomic: state files that are either old or new, never torn. A write goes to a temporary file in
//! the same directory, is fsynced, renamed over the target, and the directory is fsynced. Used by
//! every module that keeps state on disk; it uses only `std`, `serde_json` and `fault`.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;
use serde::de::DeserializeOwned;

/// Writes `data` to `path` atomically with the given mode.
pub fn write(path: &Path, data: &[u8], mode: u32) -> io::Result<()> {
    write_with(path, mode, |f| f.write_all(data))
}

/// Writes `path` atomically with the given mode, its content written by `fill` (for content
/// too large to hold in memory first).
pub fn write_with(
    path: &Path,
    mode: u32,
    fill: impl FnOnce(&mut File) -> io::Result<()>,
) -> io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "path has no file name"))?;
    // One name per write, not per process: two writes of the same file at once (two pulls
    // storing the same manifest) must not share, truncate and rename each other's file.
    static WRITES: AtomicU64 = AtomicU64::new(0);
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(
        ".tmp{}-{}",
        std::process::id(),
        WRITES.fetch_add(1, Ordering::Relaxed)
    ));
    let tmp = dir.join(tmp_name);
    let result = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&tmp)?;
        fill(&mut f)?;
        f.sync_all()?;
        crate::fault::point("state.write.before");
        fs::rename(&tmp, path)?;
        sync_dir(dir)?;
        crate::fault::point("state.write.after");
        Ok(())
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Serializes `value` as JSON and writes it atomically (mode 0600).
pub fn write_json<T: Serialize + ?Sized>(path: &Path, value: &T) -> io::Result<()> {
    let data = serde_json::to_vec(value).map_err(io::Error::other)?;
    write(path, &data, 0o600)
}

/// Reads a JSON state file; `Ok(None)` when it does not exist.
pub fn read_json<T: DeserializeOwned>(path: &Path) -> io::Result<Option<T>> {
    match fs::read(path) {
        Ok(data) => serde_json::from_slice(&data).map(Some).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: {e}", path.display()),
            )
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// fsyncs a directory so renames and unlinks in it are durable.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Removes a file, treating "already gone" as success, and makes the removal durable.
pub fn remove(path: &Path) -> io::Result<()> {
    crate::fault::point("state.remove.before");
    match fs::remove_file(path) {
        Ok(()) => sync_dir(path.parent().unwrap_or(Path::new("."))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// Removes the temporary files of writes a killed process left in `dir` (never those of a
/// writer that still runs: monitors write their exit records while the daemon restarts).
/// Returns how many went.
pub fn sweep(dir: &Path) -> usize {
    let mut removed = 0;
    for entry in fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = entry.file_name();
        let Some(pid) = temp_writer(&name.to_string_lossy()) else {
            continue;
        };
        if Path::new("/proc").join(pid.to_string()).exists() {
            continue;
        }
        if fs::remove_file(entry.path()).is_ok() {
            removed += 1;
        }
    }
    removed
}

/// The pid of the writer of a temporary file named as `write` names them (`.NAME.tmpPID-N`,
/// or `.NAME.tmpPID` as earlier versions did).
fn temp_writer(name: &str) -> Option<u32> {
    let rest = name.strip_prefix('.')?;
    let (_, tail) = rest.rsplit_once(".tmp")?;
    let pid = match tail.split_once('-') {
        Some((pid, n)) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => pid,
        Some(_) => return None,
        None => tail,
    };
    pid.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sweep_takes_only_dead_writers_temp_files() {
        let dir = tempfile::tempdir().unwrap();
        let dead = dir.path().join(".state.json.tmp999999999");
        let live = dir
            .path()
            .join(format!(".other.json.tmp{}", std::process::id()));
        for p in [&dead, &live] {
            fs::write(p, b"{").unwrap();
        }
        write_json(&dir.path().join("state.json"), &1).unwrap();
        assert_eq!(sweep(dir.path()), 1);
        assert!(!dead.exists() && live.exists());
        assert!(dir.path().join("state.json").exists());
        assert_eq!(temp_writer(".a.tmp12"), Some(12));
        assert_eq!(temp_writer(".a.tmp12-7"), Some(12));
        assert_eq!(temp_writer(".a.tmp12-"), None);
        assert_eq!(temp_writer(".a.tmp12-x"), None);
        assert_eq!(temp_writer("a.tmp12"), None);
        assert_eq!(temp_writer(".a.tmpx"), None);
    }

    #[test]
    fn concurrent_writes_of_one_file_each_land() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("blob");
        std::thread::scope(|s| {
            for t in 0..8u8 {
                let path = &path;
                s.spawn(move || {
                    for _ in 0..50 {
                        write(path, &[t; 4096], 0o644).unwrap();
                    }
                });
            }
        });
        let data = fs::read(&path).unwrap();
        assert!(data.len() == 4096 && data.iter().all(|b| *b == data[0]));
        assert_eq!(
            fs::read_dir(dir.path()).unwrap().count(),
            1,
            "no temp file left"
        );
    }

    #[test]
    fn write_then_read_json() {
        let dir = tempdir();
        let path = dir.join("state.json");
        assert_eq!(read_json::<Vec<u32>>(&path).unwrap(), None);
        write_json(&path, &vec![1u32, 2, 3]).unwrap();
        assert_eq!(read_json::<Vec<u32>>(&path).unwrap(), Some(vec![1, 2, 3]));
        write_json(&path, &vec![4u32]).unwrap();
        assert_eq!(read_json::<Vec<u32>>(&path).unwrap(), Some(vec![4]));
        // no temporary file is left behind
        assert_eq!(fs::read_dir(&dir).unwrap().count(), 1);
        remove(&path).unwrap();
        remove(&path).unwrap();
        fs::remove_dir_all(dir).unwrap();
    }

    fn tempdir() -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("crius-atomic-{}", std::process::id()));
        fs::create_dir_all(&d).unwrap();
        d
    }
}
