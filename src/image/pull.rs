//! One pull: resolve the manifest (verifying it against the digest it was asked or resolved by),
//! pick the platform from an index, fetch and verify the config (all three `pull_manifest`'s),
//! then download every layer in parallel. Each layer streams through one pass off the async
//! threads: bytes are hashed and appended to the content store's ingest file as they arrive,
//! decompressed, hashed again (diff ID) and unpacked into a private snapshot directory. The
//! snapshot is committed only when the digest, the size and the diff ID all match, and the
//! ingest file is dropped after it (layers are kept unpacked only); an interrupted download
//! stays in the ingest file and is resumed with a range request.

use std::io::{self, BufRead, BufReader, Read};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::{Buf, Bytes};
use sha2::{Digest as _, Sha256};
use tokio::sync::{OwnedMutexGuard, OwnedRwLockReadGuard};

use super::manifest::Compression;
use super::progress::Progress;
use super::pull_manifest::{Chosen, Resolved, resolve};
use super::registry::Session;
use super::{Credentials, Error, ImageConfig, Inner, Layer, Record, Reference};
use crate::content::{Digest, Ingest, Verified};
use crate::records::now_nanos;
use crate::snapshot::{Meta, Prepared, Snapshotter, copyup, unpack};

/// Pulls the image `reference` names: its manifest and config verified, every layer fetched
/// and unpacked (or, `may_lazy`, served lazily: see `lazy`), then its small blobs stored;
/// returns its record and config, and whether it was served lazily.
pub(super) async fn pull(
    inner: &Arc<Inner>,
    reference: &Reference,
    creds: Option<Credentials>,
    progress: &Arc<Progress>,
    pulling: &Arc<OwnedRwLockReadGuard<()>>,
    may_lazy: bool,
) -> Result<(Record, ImageConfig, Option<super::lazy::Mounted>), Error> {
    let resolved = resolve(inner, reference, creds.clone()).await?;
    let lazy = match may_lazy {
        true => super::lazy::serve(inner, &resolved, reference, &creds).await,
        false => None,
    };
    let Resolved {
        session,
        chosen,
        config_bytes,
        config,
        layers,
    } = resolved;
    if lazy.is_some() {
        let record = store_record(inner, reference, chosen, &config_bytes, layers)?;
        return Ok((record, config, lazy));
    }
    progress
        .layers_total
        .store(layers.len() as u64, std::sync::atomic::Ordering::Relaxed);
    progress.bytes_total.store(
        layers.iter().map(|l| l.size).sum(),
        std::sync::atomic::Ordering::Relaxed,
    );

    // Layers, all at once; the download semaphore bounds how many transfer.
    let landed = Arc::new(Landed::default());
    let jobs = layers.iter().enumerate().map(|(i, l)| {
        let parent = i.checked_sub(1).map(|p| layers[p].chain_id.clone());
        fetch_layer(inner, &session, l, parent, progress, &landed, pulling)
    });
    futures_util::future::try_join_all(jobs).await?;

    let record = store_record(inner, reference, chosen, &config_bytes, layers)?;
    Ok((record, config, None))
}

/// Everything verified: stores the small blobs (index, manifest, config) and builds the
/// image's record.
fn store_record(
    inner: &Arc<Inner>,
    reference: &Reference,
    chosen: Chosen,
    config_bytes: &[u8],
    layers: Vec<Layer>,
) -> Result<Record, Error> {
    let Chosen {
        index,
        digest: manifest_digest,
        bytes: manifest_bytes,
        manifest: m,
    } = chosen;
    if let Some((d, bytes)) = &index {
        inner.content.put(d, bytes)?;
    }
    inner.content.put(&manifest_digest, &manifest_bytes)?;
    inner.content.put(&m.config.digest, config_bytes)?;
    let pulled_by = index
        .as_ref()
        .map(|(d, _)| d.clone())
        .unwrap_or_else(|| manifest_digest.clone());
    Ok(Record {
        id: m.config.digest.clone(),
        repo_tags: reference.repo_tag().into_iter().collect(),
        repo_digests: vec![reference.repo_digest(&pulled_by)],
        manifest: manifest_digest,
        index: index.map(|(d, _)| d),
        config_size: m.config.size,
        size: m.config.size + layers.iter().map(|l| l.size).sum::<u64>(),
        layers,
        pulled_at: now_nanos(),
    })
}

async fn fetch_layer(
    inner: &Arc<Inner>,
    session: &Session<'_>,
    layer: &Layer,
    parent: Option<Digest>,
    progress: &Arc<Progress>,
    landed: &Arc<Landed>,
    pulling: &Arc<OwnedRwLockReadGuard<()>>,
) -> Result<(), Error> {
    let mut landing = Landing {
        landed: landed.clone(),
        chain: layer.chain_id.clone(),
        ok: false,
    };
    // One writer per layer, until its unpacker ends: when this pull is cancelled (the
    // client went away) the unpacker may still be committing, and the next pull of the layer
    // must not open the same ingest file under it.
    let held = Held {
        _layer: Arc::new(inner.layer_lock(&layer.digest).lock_owned().await),
        _pulling: pulling.clone(),
        landed: landed.clone(),
    };
    if inner.snapshots.exists(&layer.chain_id) {
        // A crash after the commit may have left the layer's verified ingest file.
        inner.content.drop_ingest(&layer.digest);
        landing.ok = true;
        progress.add_bytes(layer.size);
        progress.layer_done();
        return Ok(());
    }
    let mut resume = true;
    let mut retries = 0;
    let counted = LayerProgress {
        pull: progress.clone(),
        counted: Arc::new(AtomicU64::new(0)),
    };
    loop {
        // A download slot per attempt: a layer waiting to retry does not hold one.
        let slot = inner
            .downloads
            .acquire()
            .await
            .map_err(|_| Error::Download {
                digest: layer.digest.clone(),
                message: "daemon shutting down".into(),
            })?;
        let res = attempt(
            inner,
            session,
            layer,
            parent.clone(),
            &counted,
            resume,
            held.clone(),
        )
        .await;
        drop(slot);
        match res {
            // A broken connection: again after a pause, from what the ingest file holds.
            Err(Error::Network { message, .. }) if retries < NETWORK_RETRIES => {
                retries += 1;
                let wait = crate::image::registry::backoff(retries);
                tracing::info!(layer = %layer.digest, error = message, retry = retries, ?wait, "layer download interrupted; retrying");
                tokio::time::sleep(wait).await;
                resume = true;
            }
            // Bytes left by an earlier attempt may not have reached the disk before a crash:
            // a mismatch after resuming is retried once from the start.
            Err(Error::Content(crate::content::Error::DigestMismatch { .. }))
            | Err(Error::DigestMismatch { .. })
                if resume =>
            {
                tracing::info!(layer = %layer.digest, "resumed download did not verify; starting over");
                resume = false;
            }
            other => {
                if other.is_ok() {
                    landing.ok = true;
                    progress.layer_done();
                }
                return other;
            }
        }
    }
}

/// What a layer's unpacker holds until it ends, even if the pull that started it is dropped:
/// the layer's lock (one writer per ingest file) and the pull's share of the collection lock;
/// and where it tells the pull's other layers that it landed.
#[derive(Clone)]
struct Held {
    _layer: Arc<OwnedMutexGuard<()>>,
    _pulling: Arc<OwnedRwLockReadGuard<()>>,
    landed: Arc<Landed>,
}

/// How often a layer whose connection broke is tried again (each resuming).
const NETWORK_RETRIES: u32 = 4;

/// Where a layer's bytes come from inside the unpack thread.
enum Source {
    /// A blob a crius that kept layer blobs left in the content store (verified when it was
    /// committed).
    Local(std::fs::File),
    /// From the network through a channel, after replaying what the ingest file holds.
    Remote {
        ingest: Box<Ingest>,
        replay: Option<Box<dyn Read + Send>>,
        rx: tokio::sync::mpsc::Receiver<Result<Bytes, io::Error>>,
        cur: Bytes,
    },
}

/// A layer's share of the pull's progress: each byte counted once, however many attempts
/// deliver it (a resumed attempt replays what the ingest file holds).
#[derive(Clone)]
struct LayerProgress {
    pull: Arc<Progress>,
    counted: Arc<AtomicU64>,
}

struct BlobReader {
    source: Source,
    progress: LayerProgress,
    /// Bytes this attempt delivered.
    delivered: u64,
    /// The content store's own error, kept typed for the caller.
    failure: Option<crate::content::Error>,
    /// The connection's error, if it broke: the unpacker's complaint is only its echo.
    network: Option<String>,
}

impl LayerProgress {
    /// `n` more bytes delivered by an attempt that had delivered `delivered`.
    fn advance(&self, delivered: &mut u64, n: usize) {
        *delivered += n as u64;
        let before = self.counted.fetch_max(*delivered, Ordering::Relaxed);
        if *delivered > before {
            self.pull.add_bytes(*delivered - before);
        }
    }
}

impl Read for BlobReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match &mut self.source {
            Source::Local(f) => {
                let n = f.read(buf)?;
                self.progress.advance(&mut self.delivered, n);
                Ok(n)
            }
            Source::Remote {
                ingest,
                replay,
                rx,
                cur,
            } => {
                if let Some(r) = replay {
                    let n = r.read(buf)?;
                    if n > 0 {
                        if let Err(e) = ingest.replayed(&buf[..n]) {
                            let msg = e.to_string();
                            self.failure = Some(e);
                            return Err(io::Error::other(msg));
                        }
                        self.progress.advance(&mut self.delivered, n);
                        return Ok(n);
                    }
                    *replay = None;
                }
                while cur.is_empty() {
                    match rx.blocking_recv() {
                        Some(Ok(chunk)) => {
                            if let Err(e) = ingest.append(&chunk) {
                                let msg = e.to_string();
                                self.failure = Some(e);
                                return Err(io::Error::other(msg));
                            }
                            let n = chunk.len();
                            *cur = chunk;
                            self.progress.advance(&mut self.delivered, n);
                        }
                        Some(Err(e)) => {
                            self.network = Some(e.to_string());
                            return Err(e);
                        }
                        // An answer shorter than the blob (a Content-Length that was wrong, a
                        // proxy that cut it) is a broken transfer, resumed like one.
                        None if ingest.written() < ingest.expected() => {
                            let message = format!(
                                "the registry's answer ended after {} of {} bytes",
                                ingest.written(),
                                ingest.expected()
                            );
                            self.network = Some(message.clone());
                            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, message));
                        }
                        None => return Ok(0),
                    }
                }
                let n = buf.len().min(cur.len());
                buf[..n].copy_from_slice(&cur[..n]);
                cur.advance(n);
                Ok(n)
            }
        }
    }
}

/// Hashes what passes through (the diff ID of the uncompressed tar).
struct Hashing<R> {
    inner: R,
    hasher: Sha256,
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}

async fn attempt(
    inner: &Arc<Inner>,
    session: &Session<'_>,
    layer: &Layer,
    parent: Option<Digest>,
    progress: &LayerProgress,
    resume: bool,
    held: Held,
) -> Result<(), Error> {
    let (source, download) = if inner.content.contains(&layer.digest) {
        let path = inner.content.blob_path(&layer.digest);
        let f = std::fs::File::open(&path).map_err(|source| Error::Io { path, source })?;
        (Source::Local(f), None)
    } else {
        let mut ingest = inner.content.ingest(&layer.digest, layer.size)?;
        if !resume {
            ingest.restart()?;
        }
        if ingest.existing() > layer.size {
            ingest.restart()?;
        }
        let offset = ingest.existing();
        // Every byte already came (the connection broke after the last, or the layer failed
        // after its bytes were verified): nothing to ask for, the replay is verified again.
        let resp = if offset > 0 && offset == layer.size {
            tracing::info!(layer = %layer.digest, "the whole layer is already on disk");
            None
        } else {
            let (resp, partial) = session.blob(&layer.digest, offset).await?;
            if offset > 0 && !partial {
                ingest.restart()?;
            }
            if offset > 0 && partial {
                tracing::info!(layer = %layer.digest, offset, "resuming layer download");
            }
            Some(resp)
        };
        let replay: Option<Box<dyn Read + Send>> = if ingest.existing() > 0 {
            Some(Box::new(ingest.existing_reader()?))
        } else {
            None
        };
        // A few chunks in flight: hyper's chunks grow to about 400 KiB on a fast link, so 32
        // held up to 13 MiB per layer; the unpacker outruns the network anyway.
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        (
            Source::Remote {
                ingest: Box::new(ingest),
                replay,
                rx,
                cur: Bytes::new(),
            },
            // Without a response the sender is dropped: the replay is all there is.
            resp.map(|r| (r, tx)),
        )
    };

    let unpack_inner = inner.clone();
    let unpack_layer = layer.clone();
    let unpack_progress = progress.clone();
    let unpacker = tokio::task::spawn_blocking(move || {
        // All of it, not only the field used below (closures capture fields apart).
        let held = held;
        unpack_layer_blob(
            &unpack_inner,
            &unpack_layer,
            parent,
            source,
            unpack_progress,
            &held.landed,
        )
    });

    if let Some((mut resp, tx)) = download {
        loop {
            match resp.chunk().await {
                Ok(Some(chunk)) => {
                    if tx.send(Ok(chunk)).await.is_err() {
                        break; // the unpacker stopped; its error says why
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    let _ = tx.send(Err(io::Error::other(e.to_string()))).await;
                    break;
                }
            }
        }
    }
    unpacker.await.map_err(|e| Error::Download {
        digest: layer.digest.clone(),
        message: format!("unpack task failed: {e}"),
    })?
}

/// The blocking half: verify, unpack and commit one layer.
fn unpack_layer_blob(
    inner: &Inner,
    layer: &Layer,
    parent: Option<Digest>,
    source: Source,
    progress: LayerProgress,
    landed: &Landed,
) -> Result<(), Error> {
    let prepared = inner.snapshots.prepare()?;
    let mut blob = BlobReader {
        source,
        progress,
        delivered: 0,
        failure: None,
        network: None,
    };
    let outcome = (|| -> io::Result<Result<(unpack::UnpackStats, Digest), unpack::UnpackError>> {
        let mut buf = BufReader::with_capacity(256 << 10, &mut blob);
        let compression = Compression::sniff(buf.fill_buf()?);
        let (unpacked, drained_tar, hasher) = {
            let decoder: Box<dyn Read + '_> = match compression {
                Compression::Gzip => Box::new(flate2::bufread::MultiGzDecoder::new(&mut buf)),
                Compression::Zstd => Box::new(zstd::stream::read::Decoder::with_buffer(&mut buf)?),
                Compression::None => Box::new(&mut buf),
            };
            let mut tar = Hashing {
                inner: decoder,
                hasher: Sha256::new(),
            };
            let unpacked = unpack::unpack(&mut tar, &prepared.fs(), &inner.unpack);
            // Whatever the outcome, read to the end so the blob's digest covers every byte: a
            // corrupt download must be reported as such, not as the broken tar it looks like.
            let drained = io::copy(&mut tar, &mut io::sink());
            (unpacked, drained, tar.hasher)
        };
        // The raw blob is drained even when decompression failed: its digest is the verdict.
        // An error here is the download's own.
        io::copy(&mut buf, &mut io::sink())?;
        match unpacked {
            Ok(stats) => {
                drained_tar?;
                Ok(Ok((stats, Digest::from_hasher(hasher))))
            }
            Err(e) => Ok(Err(e)),
        }
    })();

    // The blob's own verdict comes first.
    if let Some(e) = blob.failure.take() {
        if let Source::Remote { ingest, .. } = blob.source {
            ingest.discard();
        }
        return Err(e.into());
    }
    // A broken connection next: the ingest file keeps what came, to resume from.
    if let Some(message) = blob.network.take() {
        return Err(Error::Network {
            digest: layer.digest.clone(),
            message,
        });
    }
    let ingest = match blob.source {
        Source::Remote { ingest, .. } => Some(*ingest),
        Source::Local(_) => None,
    };
    let verdict = |ingest: Option<Ingest>| -> Result<Option<Verified>, Error> {
        match ingest {
            Some(i) => Ok(Some(i.verify()?)),
            None => Ok(None),
        }
    };
    match outcome {
        Err(io_err) => {
            // Reading failed for a reason other than the connection (a broken compressed
            // stream, a local read): keep the ingest file to resume from.
            Err(Error::Download {
                digest: layer.digest.clone(),
                message: io_err.to_string(),
            })
        }
        Ok(Err(unpack_err)) => {
            // The bytes were read to the end: a wrong digest explains the failure best.
            let is_full = ingest.as_ref().is_none_or(|i| i.written() == layer.size);
            if is_full {
                // Verified bytes that are a hostile or broken tar: kept by no one.
                if let Some(v) = verdict(ingest)? {
                    v.remove();
                }
                let _ = inner.content.remove(&layer.digest);
            } else if let Some(i) = ingest {
                i.discard();
            }
            Err(Error::Unpack {
                digest: layer.digest.clone(),
                source: unpack_err,
            })
        }
        Ok(Ok((stats, diff_id))) => {
            if diff_id != layer.diff_id {
                // A wrong blob digest is the more precise complaint, if it applies.
                if let Some(v) = verdict(ingest)? {
                    v.remove();
                }
                return Err(Error::DiffIdMismatch {
                    digest: layer.digest.clone(),
                    expected: layer.diff_id.clone(),
                    actual: diff_id,
                });
            }
            // Kept until the snapshot is committed: a failure below costs no download.
            let verified = verdict(ingest)?;
            let mut stats = stats;
            copy_up_links(inner, layer, parent.as_ref(), &prepared, landed, &mut stats)?;
            let meta = Meta {
                chain_id: layer.chain_id.clone(),
                parent,
                diff_id,
                size: stats.size,
                inodes: stats.inodes,
            };
            inner.snapshots.commit(prepared, &meta)?;
            if let Some(v) = verified {
                v.remove();
            }
            Ok(())
        }
    }
}

/// Hardlinks to files of the layers below: copied up once those are in place (see
/// `snapshot::copyup`), their size and inodes added to the layer's.
fn copy_up_links(
    inner: &Inner,
    layer: &Layer,
    parent: Option<&Digest>,
    prepared: &Prepared,
    landed: &Landed,
    stats: &mut unpack::UnpackStats,
) -> Result<(), Error> {
    if stats.lower_links.is_empty() {
        return Ok(());
    }
    let lowers = match parent.map(|p| landed.wait(p, &inner.snapshots)) {
        Some(Some(lowers)) => lowers,
        Some(None) => {
            return Err(Error::Download {
                digest: layer.digest.clone(),
                message: "a layer below it failed, and it links to that layer's files".into(),
            });
        }
        None => Vec::new(),
    };
    let up = copyup::copy_up(&prepared.fs(), &stats.lower_links, &lowers).map_err(|source| {
        Error::Unpack {
            digest: layer.digest.clone(),
            source,
        }
    })?;
    stats.size += up.size;
    stats.inodes += up.inodes;
    Ok(())
}

/// Which layers of one pull have landed, for a layer that copies files up from the ones below
/// it (see `snapshot::copyup`): such a layer waits for its parent snapshot before it commits.
#[derive(Default)]
struct Landed {
    failed: std::sync::Mutex<std::collections::HashSet<Digest>>,
    changed: std::sync::Condvar,
}

impl Landed {
    /// Blocks until `chain` and every snapshot below it are committed (layers commit in any
    /// order) and returns their directories, topmost first; none once a layer of the pull
    /// failed (or was dropped with it).
    fn wait(&self, chain: &Digest, snapshots: &Snapshotter) -> Option<Vec<std::path::PathBuf>> {
        let mut failed = self.failed.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Ok(lowers) = snapshots.lowerdirs(chain) {
                return Some(lowers);
            }
            if !failed.is_empty() {
                return None;
            }
            // Committing happens on another thread without this lock: look again now and then.
            failed = self
                .changed
                .wait_timeout(failed, std::time::Duration::from_millis(100))
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
        }
    }
}

/// Says how a layer's fetch ended, however it ends: an error or a dropped future is a failure.
struct Landing {
    landed: Arc<Landed>,
    chain: Digest,
    ok: bool,
}

impl Drop for Landing {
    fn drop(&mut self) {
        if !self.ok {
            self.landed
                .failed
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(self.chain.clone());
        }
        self.landed.changed.notify_all();
    }
}
