//! The seal on crius's checkpoint archives. criu trusts its image files entirely: they say the
//! restored tree's credentials, capabilities, namespaces, mounts and the files it opens, and
//! criu applies them as root. So every archive crius writes carries `crius.seal`, an
//! HMAC-SHA256 under a key only this node's crius holds (`<root>/checkpoint.key`, 32 random
//! bytes, 0600, made on first use) over every file and directory in it (path, size, SHA-256),
//! and a restore checks the seal after the confined unpack and before any member is read or
//! criu runs: what was not dumped by a crius holding the key is never restored. Nodes meant to
//! restore each other's checkpoints share the key file. Uses `ring` and this module's `Error`.

use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use ring::{digest, hmac};

use super::Error;

/// The seal's file in the archive's top directory.
pub const SEAL: &str = "crius.seal";
/// The key file's name in the data root.
pub const KEY_FILE: &str = "checkpoint.key";
const KEY_BYTES: usize = 32;

/// The node's sealing key.
pub struct SealKey(hmac::Key);

fn key_err(path: &Path, why: impl Into<String>) -> Error {
    Error::Io {
        path: path.to_path_buf(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, why.into()),
    }
}

impl SealKey {
    /// A key from its bytes (tests, and nodes given one).
    pub fn from_bytes(bytes: &[u8; KEY_BYTES]) -> SealKey {
        SealKey(hmac::Key::new(hmac::HMAC_SHA256, bytes))
    }

    /// The key at `path`, made (32 random bytes, 0600) when there is none. A key that is not
    /// 32 bytes, or that others than root can read, is refused rather than used.
    pub fn load_or_make(path: &Path) -> Result<SealKey, Error> {
        let bytes = match std::fs::symlink_metadata(path) {
            Ok(m) => {
                if !m.file_type().is_file()
                    || m.uid() != nix::unistd::geteuid().as_raw()
                    || m.mode() & 0o077 != 0
                {
                    return Err(key_err(
                        path,
                        "the checkpoint key must be a regular file of the daemon's user, mode 0600",
                    ));
                }
                std::fs::read(path).map_err(super::io_err(path))?
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let mut key = [0u8; KEY_BYTES];
                getrandom::fill(&mut key).map_err(|e| key_err(path, format!("getrandom: {e}")))?;
                crate::atomic::write(path, &key, 0o600).map_err(super::io_err(path))?;
                key.to_vec()
            }
            Err(e) => return Err(super::io_err(path)(e)),
        };
        if bytes.len() != KEY_BYTES {
            return Err(key_err(
                path,
                format!(
                    "the checkpoint key is {} bytes, not {KEY_BYTES}",
                    bytes.len()
                ),
            ));
        }
        Ok(SealKey(hmac::Key::new(hmac::HMAC_SHA256, &bytes)))
    }
}

/// What the seal covers: every directory and regular file below `dir` but the seal itself, in
/// name order, each as its kind, path, size and SHA-256. Anything else in the tree is an error
/// (a restore has refused it already; a dump makes none).
fn manifest(dir: &Path) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::new();
    let mut todo = vec![PathBuf::new()];
    while let Some(rel) = todo.pop() {
        let mut names: Vec<_> = std::fs::read_dir(dir.join(&rel))?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<Result<_, _>>()?;
        names.sort();
        // Reversed onto the stack, so directories come out in name order.
        let mut below = Vec::new();
        for n in names {
            let r = rel.join(&n);
            if r == Path::new(SEAL) {
                continue;
            }
            let m = std::fs::symlink_metadata(dir.join(&r))?;
            let path = r.as_os_str().as_encoded_bytes();
            if m.file_type().is_dir() {
                out.extend_from_slice(b"d\0");
                out.extend_from_slice(path);
                out.push(0);
                below.push(r);
            } else if m.file_type().is_file() {
                out.extend_from_slice(b"f\0");
                out.extend_from_slice(path);
                out.push(0);
                out.extend_from_slice(&m.len().to_le_bytes());
                out.extend_from_slice(file_sha256(&dir.join(&r))?.as_ref());
            } else {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("{}: neither a directory nor a regular file", r.display()),
                ));
            }
        }
        todo.extend(below.into_iter().rev());
    }
    Ok(out)
}

/// A regular file's SHA-256, read without following a link or blocking on a FIFO.
fn file_sha256(path: &Path) -> std::io::Result<digest::Digest> {
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)?;
    let mut ctx = digest::Context::new(&digest::SHA256);
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        ctx.update(&buf[..n]);
    }
    Ok(ctx.finish())
}

/// Seals the dump's work directory: writes `crius.seal` over everything else in it.
pub fn seal(dir: &Path, key: &SealKey) -> Result<(), Error> {
    let m = manifest(dir).map_err(super::io_err(dir))?;
    let tag = hmac::sign(&key.0, &m);
    let path = dir.join(SEAL);
    std::fs::write(&path, hex::encode(tag.as_ref())).map_err(super::io_err(&path))?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644))
        .map_err(super::io_err(&path))
}

/// Why an unpacked archive's seal does not hold.
#[derive(Debug, thiserror::Error)]
pub(super) enum Broken {
    #[error(
        "it has no {SEAL}: only archives a crius holding this node's checkpoint key dumped are \
         restored"
    )]
    Missing,
    #[error("{SEAL}: not a seal (64 hexadecimal digits)")]
    NotASeal,
    #[error("{SEAL}: not hexadecimal")]
    NotHex,
    #[error("reading the archive to check its seal: {0}")]
    Unreadable(#[source] std::io::Error),
    #[error(
        "its seal does not match: the archive was changed after its dump, or dumped under \
         another checkpoint key than this node's ({KEY_FILE})"
    )]
    Mismatch,
}

/// Checks the seal of an unpacked archive (`dir`, a tree of directories and regular files):
/// why not, when it does not hold.
pub(super) fn check(dir: &Path, key: &SealKey) -> Result<(), Broken> {
    let path = dir.join(SEAL);
    let text = match std::fs::symlink_metadata(&path) {
        Ok(m) if m.file_type().is_file() && m.len() == 2 * 32 => {
            std::fs::read(&path).map_err(Broken::Unreadable)?
        }
        Ok(_) => return Err(Broken::NotASeal),
        Err(_) => return Err(Broken::Missing),
    };
    let tag = hex::decode(&text).map_err(|_| Broken::NotHex)?;
    let m = manifest(dir).map_err(Broken::Unreadable)?;
    hmac::verify(&key.0, &m, &tag).map_err(|_| Broken::Mismatch)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn key(byte: u8) -> SealKey {
        SealKey::from_bytes(&[byte; KEY_BYTES])
    }

    fn tree() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("checkpoint")).unwrap();
        std::fs::write(d.path().join("checkpoint/core-1.img"), b"core").unwrap();
        std::fs::write(d.path().join("spec.dump"), b"{}").unwrap();
        d
    }

    #[test]
    fn a_sealed_tree_checks_and_any_change_breaks_it() {
        let d = tree();
        seal(d.path(), &key(1)).unwrap();
        check(d.path(), &key(1)).unwrap();
        // Another node's key.
        assert!(
            check(d.path(), &key(2))
                .unwrap_err()
                .to_string()
                .contains("another")
        );
        // A byte changed, a file added, a directory added, a file renamed.
        let changes: [&dyn Fn(&Path); 4] = [
            &|p| std::fs::write(p.join("checkpoint/core-1.img"), b"Core").unwrap(),
            &|p| std::fs::write(p.join("checkpoint/mountpoints-1.img"), b"").unwrap(),
            &|p| std::fs::create_dir(p.join("extra")).unwrap(),
            &|p| std::fs::rename(p.join("spec.dump"), p.join("spec.dum")).unwrap(),
        ];
        for change in changes {
            let d = tree();
            seal(d.path(), &key(1)).unwrap();
            change(d.path());
            let e = check(d.path(), &key(1)).unwrap_err().to_string();
            assert!(e.contains("does not match"), "{e}");
        }
    }

    #[test]
    fn an_unsealed_or_malformed_seal_is_refused() {
        let d = tree();
        assert!(
            check(d.path(), &key(1))
                .unwrap_err()
                .to_string()
                .contains("no crius.seal")
        );
        std::fs::write(d.path().join(SEAL), "zz".repeat(32)).unwrap();
        assert!(
            check(d.path(), &key(1))
                .unwrap_err()
                .to_string()
                .contains("not hexadecimal")
        );
        std::fs::write(d.path().join(SEAL), "00").unwrap();
        assert!(
            check(d.path(), &key(1))
                .unwrap_err()
                .to_string()
                .contains("not a seal")
        );
    }

    #[test]
    fn a_key_is_made_once_and_a_loose_one_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join(KEY_FILE);
        SealKey::load_or_make(&p).unwrap();
        let first = std::fs::read(&p).unwrap();
        assert_eq!(first.len(), KEY_BYTES);
        SealKey::load_or_make(&p).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), first, "the key is kept");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(SealKey::load_or_make(&p).is_err(), "a key others can read");
        std::fs::write(&p, b"short").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(SealKey::load_or_make(&p).is_err());
    }
}
