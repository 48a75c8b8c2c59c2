//! Where plugins come from: the socket external plugins connect to, and the pre-installed
//! plugins started from the plugin directory, each handed one end of a socket pair as
//! descriptor 3 and told nothing else but its name and index.

use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::Path;

/// Listens on `path`: its directory is made (0700) and a stale socket (one nobody serves)
/// replaced. Also says
/// whether the directory was made here (it is removed again at the daemon's exit).
pub fn listen(path: &Path) -> io::Result<(tokio::net::UnixListener, bool)> {
    let mut made = false;
    if let Some(dir) = path.parent() {
        made = !dir.exists();
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
    }
    take_stale(path)?;
    Ok((tokio::net::UnixListener::bind(path)?, made))
}

/// Removes what is at `path` if it is a socket nobody serves. A socket that answers belongs to
/// a live process (another runtime's NRI, say), and anything but a socket is not ours: both
/// are refused, naming the path, rather than taken over.
fn take_stale(path: &Path) -> io::Result<()> {
    use std::os::unix::fs::FileTypeExt;
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    if !meta.file_type().is_socket() {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!("{} exists and is not a socket", path.display()),
        ));
    }
    if std::os::unix::net::UnixStream::connect(path).is_ok() {
        return Err(io::Error::new(
            io::ErrorKind::AddrInUse,
            format!(
                "{} is served by another process; not taking it over",
                path.display()
            ),
        ));
    }
    std::fs::remove_file(path)
}

/// A launched plugin: its name, index, our end of its socket and its process.
pub type Launched = (
    String,
    String,
    tokio::net::UnixStream,
    tokio::process::Child,
);

/// Starts every executable `IDX-NAME` in `dir` (none when it is missing). One that cannot be
/// started, or is badly named, is logged and skipped.
pub fn start_installed(dir: &Path) -> Vec<Launched> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut names: Vec<String> = entries
        .flatten()
        .filter(|e| {
            e.metadata()
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let mut started = Vec::new();
    for file in names {
        let Some((idx, name)) = file.split_once('-') else {
            tracing::warn!(
                plugin = file,
                "NRI: a plugin's file name is not IDX-NAME; skipped"
            );
            continue;
        };
        if let Err(e) = super::plugin::check_name(name, idx) {
            tracing::warn!(plugin = file, error = %e, "NRI: plugin skipped");
            continue;
        }
        match start(&dir.join(&file), name, idx) {
            Ok((stream, child)) => started.push((name.to_string(), idx.to_string(), stream, child)),
            Err(e) => tracing::warn!(plugin = file, error = %e, "NRI: starting a plugin"),
        }
    }
    started
}

fn start(
    program: &Path,
    name: &str,
    idx: &str,
) -> io::Result<(tokio::net::UnixStream, tokio::process::Child)> {
    let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
    let mut cmd = tokio::process::Command::new(program);
    cmd.env_clear()
        .env("NRI_PLUGIN_NAME", name)
        .env("NRI_PLUGIN_IDX", idx)
        .env("NRI_PLUGIN_SOCKET", "3")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    crate::sys::inherit_at(&mut cmd, theirs.as_fd(), 3);
    let child = cmd.spawn()?;
    drop(theirs);
    ours.set_nonblocking(true)?;
    Ok((tokio::net::UnixStream::from_std(ours)?, child))
}

/// A plugin's configuration: `IDX-NAME.conf`, else `NAME.conf`, else none.
pub fn plugin_config(dir: &Path, idx: &str, name: &str) -> String {
    [format!("{idx}-{name}.conf"), format!("{name}.conf")]
        .iter()
        .find_map(|f| std::fs::read_to_string(dir.join(f)).ok())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_served_socket_is_not_taken_over() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nri.sock");
        let other = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let err = listen(&path).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AddrInUse);
        assert!(err.to_string().contains("nri.sock"), "{err}");
        // The other process still serves it.
        let _c = std::os::unix::net::UnixStream::connect(&path).unwrap();
        assert!(other.accept().is_ok());
        // Once nobody serves it, it is stale and replaced.
        drop(other);
        let (_l, _) = listen(&path).unwrap();
        // A file that is not a socket is not ours to remove.
        let file = dir.path().join("plain");
        std::fs::write(&file, "x").unwrap();
        assert_eq!(
            listen(&file).unwrap_err().kind(),
            io::ErrorKind::AlreadyExists
        );
        assert!(file.exists());
    }
}
