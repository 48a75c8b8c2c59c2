//! The whole pull behind a lazy pull (see `lazy`), and what its failure means. What a lazy
//! layer serves is bound to its TOC digest only; the whole pull is the first to check the
//! layer's bytes against the blob digest and the config's diff ID. When it finds a mismatch,
//! what containers were given was never what the image claims: the image's lazy layers are
//! retired (running containers keep them), the image leaves the catalog, and the names it had
//! are remembered as refused until an image is pulled under them again. Any other failure (the
//! network, the registry) is tried again, as before.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::{
    CatalogName, Credentials, Error, Image, ImageService, Pull, Record, catalog_name, lazy, lock,
    read, write,
};
use crate::content::Digest;

/// The most names remembered as refused: a registry serving one bad image after another must
/// not grow the table without end, and forgetting a name loses only its message.
const MAX_REFUSALS: usize = 4096;

/// Why images were taken out of the catalog, by each name they had (tags, repo digests, ID).
#[derive(Default)]
pub(super) struct Refusals(Mutex<HashMap<String, Arc<Refusal>>>);

struct Refusal {
    manifest: Digest,
    /// The whole pull's error.
    why: String,
}

impl Refusals {
    fn add(&self, record: &Record, why: &str) {
        let refusal = Arc::new(Refusal {
            manifest: record.manifest.clone(),
            why: why.to_string(),
        });
        let names: Vec<String> = names(record).collect();
        let mut table = lock(&self.0);
        if table.len() + names.len() > MAX_REFUSALS {
            table.clear();
        }
        for name in names {
            table.insert(name, refusal.clone());
        }
    }

    /// An image is recorded: its names are no longer refused.
    pub(super) fn forget(&self, record: &Record) {
        let mut table = lock(&self.0);
        if table.is_empty() {
            return;
        }
        for name in names(record) {
            table.remove(&name);
        }
    }

    fn get(&self, name: &CatalogName) -> Option<Arc<Refusal>> {
        lock(&self.0).get(&name.key()).cloned()
    }
}

/// Every name an image is found by: its tags, repo digests and ID.
fn names(record: &Record) -> impl Iterator<Item = String> + '_ {
    record
        .repo_tags
        .iter()
        .chain(&record.repo_digests)
        .cloned()
        .chain(std::iter::once(record.id.to_string()))
}

impl ImageService {
    /// The whole pull of a lazily pulled image, after the configured delay, by its manifest's
    /// digest (a tag moved meanwhile does not change what is finished); tried three times, but
    /// a mismatch ends it at once (see `refuse`). Its lazy layers are retired once their
    /// snapshots are in, or once no image uses them.
    pub(super) fn finish_behind(&self, creds: Option<Credentials>, pulled: Arc<Image>) {
        let keys: Vec<lazy::Key> = pulled.record.layers.iter().filter_map(lazy::key).collect();
        let Some(image) = pulled.record.repo_digests.first().cloned() else {
            tracing::warn!(image = %pulled.record.id, "a lazily pulled image without a digest reference: not pulled whole");
            return;
        };
        let me = self.clone();
        let delay = self.inner.lazy.delay();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            for attempt in 1..=3u32 {
                if !read(&me.inner.catalog)
                    .images
                    .contains_key(&pulled.record.id)
                {
                    break;
                }
                match me.pull_as(&image, creds.clone(), Pull::Behind).await {
                    Ok(_) => {
                        tracing::info!(image, "lazily pulled image now whole");
                        break;
                    }
                    Err(e) if e.mismatched().is_some() => {
                        me.refuse(&pulled, &image, &e).await;
                        return;
                    }
                    Err(e) => {
                        tracing::warn!(image, attempt, error = %e, "whole pull of a lazily pulled image failed");
                        tokio::time::sleep(std::time::Duration::from_secs(10 * u64::from(attempt)))
                            .await;
                    }
                }
            }
            me.inner
                .lazy
                .retire_unless(&keys, |k| me.lazy_in_use(k))
                .await;
        });
    }

    /// Whether an image in the catalog has `key` among its layers and not yet unpacked.
    pub(super) fn lazy_in_use(&self, key: &lazy::Key) -> bool {
        read(&self.inner.catalog).images.values().any(|img| {
            img.record
                .layers
                .iter()
                .any(|l| lazy::key(l).as_ref() == Some(key))
        }) && !self.inner.snapshots.exists(&key.0)
    }

    /// The whole pull of `pulled` (shown as `shown`) failed with `error`, a mismatch. The layer
    /// it names is retired for good, and every image it serves taken out of the catalog (the
    /// same layer is the same lie); the image's other lazy layers go unless another image uses
    /// them. Pulled again, the layer is pulled whole.
    async fn refuse(&self, pulled: &Image, shown: &str, error: &Error) {
        let blob = error.mismatched();
        let own: Vec<lazy::Key> = pulled.record.layers.iter().filter_map(lazy::key).collect();
        let failed: Vec<lazy::Key> = own.iter().filter(|k| Some(&k.1) == blob).cloned().collect();
        let why = error.to_string();
        let refused = self
            .inner
            .lazy
            .distrust(&failed, || self.unrecord_refused(pulled, &failed, &why))
            .await;
        let layer = blob.map(Digest::to_string).unwrap_or_default();
        let mut others = Vec::new();
        for img in &refused {
            tracing::error!(image = %img.record.id, layer = %layer, error = %why, pulled = shown, "a lazily pulled image's layers did not match their digests: its lazy layers are retired and the image removed; containers already running on it keep running");
            others.extend(img.record.layers.iter().filter_map(lazy::key));
        }
        if refused.is_empty() {
            tracing::error!(image = shown, layer = %layer, error = %why, "a lazily pulled image (removed meanwhile) did not match its digests: its lazy layers are retired");
        }
        others.extend(own);
        self.inner
            .lazy
            .retire_unless(&others, |k| self.lazy_in_use(k))
            .await;
        self.collect_later();
    }

    /// Takes `pulled`, and every image with one of `failed` not yet unpacked, out of the
    /// catalog, remembering why by each of their names; returns them.
    fn unrecord_refused(&self, pulled: &Image, failed: &[lazy::Key], why: &str) -> Vec<Arc<Image>> {
        let served_by_failed = |img: &Image| {
            img.record.layers.iter().any(|l| {
                lazy::key(l).is_some_and(|k| failed.contains(&k))
                    && !self.inner.snapshots.exists(&l.chain_id)
            })
        };
        let mut catalog = write(&self.inner.catalog);
        let refused: Vec<Arc<Image>> = catalog
            .images
            .values()
            .filter(|img| img.record.id == pulled.record.id || served_by_failed(img))
            .cloned()
            .collect();
        for img in &refused {
            if let Err(e) = self.unrecord(&mut catalog, &img.record.id) {
                // Gone from memory all the same; a record left is dropped at the next start,
                // its layers being neither unpacked nor served.
                tracing::warn!(image = %img.record.id, error = %e, "refused image's record not removed");
                catalog.images.remove(&img.record.id);
                catalog.names.retain(|_, i| i != &img.record.id);
            }
            self.inner.refusals.add(&img.record, why);
        }
        refused
    }

    /// Why no image is found by `image`, when it was taken out of the catalog because its
    /// layers did not match their digests (and nothing was pulled under that name since): an
    /// error naming the image, for a request that wanted it (CreateContainer).
    pub fn refusal(&self, image: &str) -> Option<Error> {
        let name = catalog_name(image).ok()?;
        if self.lookup(image).ok().flatten().is_some() {
            return None;
        }
        let r = self.inner.refusals.get(&name)?;
        Some(Error::Manifest {
            reference: image.to_string(),
            digest: r.manifest.to_string(),
            reason: format!(
                "the image was removed because its layers did not match their digests ({}); pull it again",
                r.why
            ),
        })
    }
}

#[cfg(test)]
mod tests;
