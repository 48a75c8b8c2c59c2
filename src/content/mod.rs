//! content: the content-addressed blob store (manifests, configs) and the ingest files layers
//! stream through. Small blobs are written atomically once verified, so a file under
//! `blobs/sha256/` is always complete and what its name says. A layer's compressed bytes go to
//! an ingest file as they arrive, hashed as they are written, so an interrupted pull resumes
//! where it stopped; once verified and the layer committed the ingest file is dropped, because
//! layers are kept unpacked, not as blobs (as CRI-O keeps them): each byte reaches the disk
//! once, since the ingest file's pages usually go before write-back would take them. Ingest
//! files outlive a crash. It owns the `Digest` type the modules above share; it uses `atomic`.

use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::{Digest as _, Sha256};

use crate::atomic;

/// Errors of the content store, each naming the blob it concerns.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid digest {digest:?}: {reason}")]
    InvalidDigest {
        digest: String,
        reason: &'static str,
    },
    #[error("blob {digest}: expected {expected} bytes, got {actual}")]
    SizeMismatch {
        digest: Digest,
        expected: u64,
        actual: u64,
    },
    #[error("blob {expected}: content has digest {actual}")]
    DigestMismatch { expected: Digest, actual: Digest },
    #[error("blob {digest} not found in the content store")]
    NotFound { digest: Digest },
    #[error("content store {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// A sha256 content digest, `sha256:<64 lowercase hex>`. Other algorithms are refused: every
/// registry serves sha256, and one algorithm keeps verification simple.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest {
    hex: String,
}

impl Digest {
    /// The digest of `data`.
    pub fn of(data: &[u8]) -> Digest {
        Digest::from_hasher(Sha256::new_with_prefix(data))
    }

    pub fn from_hasher(hasher: Sha256) -> Digest {
        Digest {
            hex: hex::encode(hasher.finalize()),
        }
    }

    /// The 64 hex characters without the algorithm prefix.
    pub fn hex(&self) -> &str {
        &self.hex
    }

    /// Parses 64 lowercase hex characters (no prefix).
    pub fn from_hex(hex: &str) -> Result<Digest, Error> {
        if hex.len() != 64 {
            return Err(Error::InvalidDigest {
                digest: hex.to_string(),
                reason: "sha256 digests have 64 hex characters",
            });
        }
        if !hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return Err(Error::InvalidDigest {
                digest: hex.to_string(),
                reason: "only lowercase hex characters are allowed",
            });
        }
        Ok(Digest {
            hex: hex.to_string(),
        })
    }
}

impl FromStr for Digest {
    type Err = Error;
    fn from_str(s: &str) -> Result<Digest, Error> {
        match s.split_once(':') {
            Some(("sha256", hex)) => Digest::from_hex(hex),
            Some((_, _)) => Err(Error::InvalidDigest {
                digest: s.to_string(),
                reason: "only sha256 digests are supported",
            }),
            None => Err(Error::InvalidDigest {
                digest: s.to_string(),
                reason: "a digest is algorithm:hex",
            }),
        }
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{}", self.hex)
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{}", self.hex)
    }
}

impl Serialize for Digest {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Digest {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Digest, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// The blob store rooted at `<root>/content`.
#[derive(Debug, Clone)]
pub struct Store {
    blobs: PathBuf,
    ingest: PathBuf,
}

/// How long an abandoned ingest file is kept for a pull to resume it.
const INGEST_MAX_AGE: Duration = Duration::from_secs(24 * 3600);

impl Store {
    /// Opens (creating if needed) the store and drops ingest files too old to be resumed.
    pub fn open(root: &Path) -> Result<Store, Error> {
        let store = Store {
            blobs: root.join("blobs").join("sha256"),
            ingest: root.join("ingest"),
        };
        for dir in [&store.blobs, &store.ingest] {
            fs::create_dir_all(dir).map_err(io_err(dir))?;
        }
        store.drop_stale_ingests(INGEST_MAX_AGE)?;
        // Small blobs are written whole (`put`): a killed write leaves its temporary file.
        atomic::sweep(&store.blobs);
        Ok(store)
    }

    fn drop_stale_ingests(&self, max_age: Duration) -> Result<(), Error> {
        let now = SystemTime::now();
        for entry in fs::read_dir(&self.ingest).map_err(io_err(&self.ingest))? {
            let entry = entry.map_err(io_err(&self.ingest))?;
            let path = entry.path();
            let modified = entry.metadata().and_then(|m| m.modified()).ok();
            let stale = match modified {
                Some(t) => now.duration_since(t).unwrap_or_default() > max_age,
                None => true,
            };
            let resumable = path
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| Digest::from_hex(n).is_ok());
            if stale || !resumable {
                tracing::info!(path = %path.display(), "removing abandoned ingest file");
                fs::remove_file(&path).map_err(io_err(&path))?;
            }
        }
        Ok(())
    }

    pub fn blob_path(&self, digest: &Digest) -> PathBuf {
        self.blobs.join(digest.hex())
    }

    pub fn contains(&self, digest: &Digest) -> bool {
        self.blob_path(digest).is_file()
    }

    /// Size of a committed blob.
    pub fn size(&self, digest: &Digest) -> Option<u64> {
        fs::metadata(self.blob_path(digest)).ok().map(|m| m.len())
    }

    /// Reads a committed blob and checks it against its digest (it is small: manifests, configs).
    pub fn read(&self, digest: &Digest) -> Result<Vec<u8>, Error> {
        let path = self.blob_path(digest);
        let data = match fs::read(&path) {
            Ok(data) => data,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(Error::NotFound {
                    digest: digest.clone(),
                });
            }
            Err(e) => return Err(io_err(&path)(e)),
        };
        let actual = Digest::of(&data);
        if &actual != digest {
            return Err(Error::DigestMismatch {
                expected: digest.clone(),
                actual,
            });
        }
        Ok(data)
    }

    /// Commits a blob held in memory, after checking its digest.
    pub fn put(&self, digest: &Digest, data: &[u8]) -> Result<(), Error> {
        let actual = Digest::of(data);
        if &actual != digest {
            return Err(Error::DigestMismatch {
                expected: digest.clone(),
                actual,
            });
        }
        if self.contains(digest) {
            return Ok(());
        }
        let path = self.blob_path(digest);
        atomic::write(&path, data, 0o644).map_err(io_err(&path))
    }

    /// Starts or resumes writing the blob `digest` of `size` bytes. The caller must make sure
    /// only one writer per digest runs at a time (the image puller shares work per digest).
    pub fn ingest(&self, digest: &Digest, size: u64) -> Result<Ingest, Error> {
        let path = self.ingest.join(digest.hex());
        let file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .mode(0o600)
            .open(&path)
            .map_err(io_err(&path))?;
        let mut existing = file.metadata().map_err(io_err(&path))?.len();
        if existing > size {
            // Longer than the blob can be: not ours to resume.
            file.set_len(0).map_err(io_err(&path))?;
            existing = 0;
        }
        Ok(Ingest {
            file,
            path,
            digest: digest.clone(),
            size,
            existing,
            hasher: Sha256::new(),
            hashed: 0,
        })
    }

    /// Removes the ingest file of a layer that is already unpacked (left by a crash between
    /// its commit and the file's removal). Missing files are fine.
    pub fn drop_ingest(&self, digest: &Digest) {
        let path = self.ingest.join(digest.hex());
        match fs::remove_file(&path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                tracing::warn!(path = %path.display(), error = %e, "removing a used ingest file");
            }
            _ => {}
        }
    }

    /// Removes a blob (garbage collection). Missing blobs are fine.
    pub fn remove(&self, digest: &Digest) -> Result<(), Error> {
        let path = self.blob_path(digest);
        atomic::remove(&path).map_err(io_err(&path))
    }

    /// Every committed blob's digest.
    pub fn list(&self) -> Result<Vec<Digest>, Error> {
        let mut out = Vec::new();
        for entry in fs::read_dir(&self.blobs).map_err(io_err(&self.blobs))? {
            let entry = entry.map_err(io_err(&self.blobs))?;
            if let Some(d) = entry
                .file_name()
                .to_str()
                .and_then(|n| Digest::from_hex(n).ok())
            {
                out.push(d);
            }
        }
        Ok(out)
    }

    /// Bytes and files held by committed blobs.
    pub fn usage(&self) -> Result<(u64, u64), Error> {
        let mut bytes = 0;
        let mut files = 0;
        for entry in fs::read_dir(&self.blobs).map_err(io_err(&self.blobs))? {
            let entry = entry.map_err(io_err(&self.blobs))?;
            bytes += entry.metadata().map(|m| m.len()).unwrap_or(0);
            files += 1;
        }
        Ok((bytes, files))
    }
}

/// A blob being written. Bytes already on disk from an interrupted attempt are replayed through
/// `replay` (hashed, not written again); new bytes go through `append`.
pub struct Ingest {
    file: File,
    path: PathBuf,
    digest: Digest,
    size: u64,
    existing: u64,
    hasher: Sha256,
    hashed: u64,
}

impl Ingest {
    /// Bytes of the blob already on disk from an earlier attempt.
    pub fn existing(&self) -> u64 {
        self.existing
    }

    /// Forgets an earlier attempt (the registry would not resume it).
    pub fn restart(&mut self) -> Result<(), Error> {
        self.file.set_len(0).map_err(io_err(&self.path))?;
        self.existing = 0;
        self.hasher = Sha256::new();
        self.hashed = 0;
        Ok(())
    }

    /// A reader over the bytes already on disk; everything read from it must be passed to
    /// `replayed` so the hash covers it.
    pub fn existing_reader(&self) -> Result<impl Read + use<>, Error> {
        let f = File::open(&self.path).map_err(io_err(&self.path))?;
        Ok(f.take(self.existing))
    }

    /// Accounts for bytes replayed from disk.
    pub fn replayed(&mut self, data: &[u8]) -> Result<(), Error> {
        self.account(data)
    }

    /// Appends newly downloaded bytes.
    pub fn append(&mut self, data: &[u8]) -> Result<(), Error> {
        self.account(data)?;
        self.file.write_all(data).map_err(io_err(&self.path))?;
        Ok(())
    }

    fn account(&mut self, data: &[u8]) -> Result<(), Error> {
        self.hashed += data.len() as u64;
        if self.hashed > self.size {
            return Err(Error::SizeMismatch {
                digest: self.digest.clone(),
                expected: self.size,
                actual: self.hashed,
            });
        }
        self.hasher.update(data);
        Ok(())
    }

    pub fn written(&self) -> u64 {
        self.hashed
    }

    /// The blob's size, as its descriptor gives it.
    pub fn expected(&self) -> u64 {
        self.size
    }

    /// Checks size and digest. On a mismatch the ingest file goes (its bytes can never become
    /// this blob); when both match it stays until what was made of it is committed
    /// (`Verified::remove`), so a failure before that does not cost the download.
    pub fn verify(self) -> Result<Verified, Error> {
        let check = if self.hashed != self.size {
            Err(Error::SizeMismatch {
                digest: self.digest.clone(),
                expected: self.size,
                actual: self.hashed,
            })
        } else {
            let actual = Digest::from_hasher(self.hasher);
            if actual != self.digest {
                Err(Error::DigestMismatch {
                    expected: self.digest.clone(),
                    actual,
                })
            } else {
                Ok(())
            }
        };
        if let Err(e) = check {
            let _ = fs::remove_file(&self.path);
            return Err(e);
        }
        Ok(Verified { path: self.path })
    }

    /// Gives up on the blob for good (its bytes were proven wrong).
    pub fn discard(self) {
        let _ = fs::remove_file(&self.path);
    }
}

/// An ingest file whose bytes matched their digest, kept until the layer made of them is
/// committed; dropped without `remove` (a failure, a crash), it is there for the next pull.
pub struct Verified {
    path: PathBuf,
}

impl Verified {
    /// Removes the file. Removed before its pages are written back, it usually never reaches
    /// the disk. Failing to remove it fails nothing: the next pull of the layer drops it.
    pub fn remove(self) {
        if let Err(e) = fs::remove_file(&self.path) {
            tracing::warn!(path = %self.path.display(), error = %e, "removing a used ingest file");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        (dir, store)
    }

    #[test]
    fn digest_parsing() {
        let d = Digest::of(b"hello");
        assert_eq!(
            d.to_string(),
            "sha256:2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"
        );
        assert_eq!(d.to_string().parse::<Digest>().unwrap(), d);
        assert!("sha512:abcd".parse::<Digest>().is_err());
        assert!("sha256:abcd".parse::<Digest>().is_err());
        assert!(
            "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"
                .parse::<Digest>()
                .is_err()
        );
        let upper = d.to_string().to_uppercase().replace("SHA256", "sha256");
        assert!(upper.parse::<Digest>().is_err());
    }

    #[test]
    fn verify_checks_digest_and_size_and_drops_the_ingest() {
        let (_dir, store) = store();
        let data = b"some layer bytes";
        let digest = Digest::of(data);

        // wrong size
        let mut ing = store.ingest(&digest, data.len() as u64 + 1).unwrap();
        ing.append(data).unwrap();
        assert!(matches!(ing.verify(), Err(Error::SizeMismatch { .. })));
        assert!(!store.contains(&digest));

        // too many bytes are refused as they arrive
        let mut ing = store.ingest(&digest, 4).unwrap();
        assert!(matches!(ing.append(data), Err(Error::SizeMismatch { .. })));
        ing.discard();

        // wrong content
        let other = Digest::of(b"other");
        let mut ing = store.ingest(&other, data.len() as u64).unwrap();
        ing.append(data).unwrap();
        assert!(matches!(ing.verify(), Err(Error::DigestMismatch { .. })));
        assert!(!store.contains(&other));

        // right: verified, and nothing is kept (the layer was unpacked as it came)
        let mut ing = store.ingest(&digest, data.len() as u64).unwrap();
        ing.append(data).unwrap();
        let verified = ing.verify().unwrap();
        assert_eq!(
            fs::read_dir(&store.ingest).unwrap().count(),
            1,
            "kept until the layer is committed"
        );
        verified.remove();
        assert!(!store.contains(&digest));
        assert!(store.list().unwrap().is_empty());
        assert_eq!(fs::read_dir(&store.ingest).unwrap().count(), 0);

        // a verified file left by a crash goes when the layer is found unpacked
        let mut ing = store.ingest(&digest, data.len() as u64).unwrap();
        ing.append(data).unwrap();
        drop(ing.verify().unwrap());
        store.drop_ingest(&digest);
        assert_eq!(fs::read_dir(&store.ingest).unwrap().count(), 0);
    }

    #[test]
    fn resume_replays_existing_bytes() {
        let (dir, store) = store();
        let data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        let digest = Digest::of(&data);
        {
            let mut ing = store.ingest(&digest, data.len() as u64).unwrap();
            ing.append(&data[..4000]).unwrap();
            // dropped without commit: a crash mid-download
        }
        // reopen the store as a restarted daemon would: the ingest file stays for resuming
        let store = Store::open(dir.path()).unwrap();
        let mut ing = store.ingest(&digest, data.len() as u64).unwrap();
        assert_eq!(ing.existing(), 4000);
        let mut old = Vec::new();
        ing.existing_reader()
            .unwrap()
            .read_to_end(&mut old)
            .unwrap();
        ing.replayed(&old).unwrap();
        ing.append(&data[4000..]).unwrap();
        ing.verify().unwrap().remove();
    }

    #[test]
    fn stale_and_foreign_ingests_are_dropped() {
        let (dir, store) = store();
        fs::write(store.ingest.join("not-a-digest"), b"x").unwrap();
        let d = Digest::of(b"x");
        fs::write(store.ingest.join(d.hex()), b"x").unwrap();
        let store = Store::open(dir.path()).unwrap();
        let names: Vec<_> = fs::read_dir(&store.ingest)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from(d.hex())]);
        store.drop_stale_ingests(Duration::ZERO).unwrap();
        assert_eq!(fs::read_dir(&store.ingest).unwrap().count(), 0);
    }

    #[test]
    fn corrupt_committed_blob_is_detected_on_read() {
        let (_dir, store) = store();
        let digest = Digest::of(b"good");
        store.put(&digest, b"good").unwrap();
        fs::write(store.blob_path(&digest), b"evil").unwrap();
        assert!(matches!(
            store.read(&digest),
            Err(Error::DigestMismatch { .. })
        ));
        assert!(store.put(&Digest::of(b"a"), b"b").is_err());
    }
}
