//! The manifest side of a pull: the manifest (or index) fetched is verified against the digest
//! it was requested or resolved by, an index gives the node's platform's manifest, the config
//! is read from the content store or fetched and verified, and the manifest's layers are
//! checked against the config's diff IDs. Nothing is stored here (`pull` stores it all once
//! every layer is in). Uses `registry` (the session), `manifest` (parsing) and `content`.

use std::sync::Arc;

use super::Credentials;
use super::manifest::{self, Parsed, Platform};
use super::registry::{FetchedManifest, Session};
use super::{Error, ImageConfig, Inner, Layer, Reference, check_digest};
use crate::content::Digest;
use crate::snapshot;

/// The manifest a pull uses: the one fetched, or the node's platform's from a fetched index
/// (which is kept too, to be stored with it).
pub(super) struct Chosen {
    /// The index and its bytes, when the reference named one.
    pub(super) index: Option<(Digest, Vec<u8>)>,
    pub(super) digest: Digest,
    pub(super) bytes: Vec<u8>,
    pub(super) manifest: manifest::Manifest,
}

/// A manifest `reason` refuses, of the image `reference`.
fn bad_manifest(reference: &str, digest: &Digest, reason: String) -> Error {
    Error::Manifest {
        reference: reference.to_string(),
        digest: digest.to_string(),
        reason,
    }
}

/// The first manifest (or index) must be the one the reference names by digest, or else the
/// one the registry said it resolved the tag to.
pub(super) fn check_top_digest(
    reference: &Reference,
    fetched: &FetchedManifest,
    top: &Digest,
) -> Result<(), Error> {
    if let Some(want) = &reference.digest {
        if top != want {
            return Err(Error::DigestMismatch {
                what: "manifest",
                expected: want.clone(),
                actual: top.clone(),
            });
        }
    } else if let Some(h) = fetched
        .digest_header
        .as_deref()
        .and_then(|h| h.parse::<Digest>().ok())
        && &h != top
    {
        return Err(Error::DigestMismatch {
            what: "manifest",
            expected: h,
            actual: top.clone(),
        });
    }
    Ok(())
}

/// Parses the fetched manifest (digest `top`); an index gives the node's platform's manifest,
/// fetched and verified against its descriptor.
pub(super) async fn choose_manifest(
    session: &Session<'_>,
    shown: &str,
    fetched: FetchedManifest,
    top: Digest,
) -> Result<Chosen, Error> {
    let parsed = manifest::parse(&fetched.data, fetched.content_type.as_deref())
        .map_err(|r| bad_manifest(shown, &top, r.to_string()))?;
    let idx = match parsed {
        Parsed::Manifest(m) => {
            return Ok(Chosen {
                index: None,
                digest: top.clone(),
                bytes: fetched.data,
                manifest: m,
            });
        }
        Parsed::Index(idx) => idx,
    };
    let node = Platform::node();
    let desc = idx.select(&node).ok_or_else(|| Error::NoPlatform {
        reference: shown.to_string(),
        wanted: node.to_string(),
        available: idx.platforms().join(", "),
    })?;
    if desc.size > manifest::MAX_MANIFEST_SIZE {
        return Err(bad_manifest(
            shown,
            &desc.digest,
            "larger than the 4 MiB limit".into(),
        ));
    }
    let f = session.manifest(&desc.digest.to_string()).await?;
    check_blob("manifest", &desc.digest, desc.size, &f.data)?;
    match manifest::parse(&f.data, f.content_type.as_deref())
        .map_err(|r| bad_manifest(shown, &desc.digest, r.to_string()))?
    {
        Parsed::Manifest(m) => Ok(Chosen {
            index: Some((top.clone(), fetched.data)),
            digest: desc.digest.clone(),
            bytes: f.data,
            manifest: m,
        }),
        Parsed::Index(_) => Err(bad_manifest(
            shown,
            &desc.digest,
            "an index inside an index is not supported".into(),
        )),
    }
}

/// The image config of the chosen manifest, its bytes from the content store when there,
/// else fetched and verified; with the config parsed.
pub(super) async fn fetch_config(
    inner: &Arc<Inner>,
    session: &Session<'_>,
    shown: &str,
    chosen: &Chosen,
) -> Result<(Vec<u8>, ImageConfig), Error> {
    let m = &chosen.manifest;
    if m.config.size > manifest::MAX_CONFIG_SIZE {
        return Err(bad_manifest(
            shown,
            &chosen.digest,
            "config larger than the 16 MiB limit".into(),
        ));
    }
    let config_bytes = if inner.content.contains(&m.config.digest) {
        inner.content.read(&m.config.digest)?
    } else {
        let b = session
            .small_blob(&m.config.digest, manifest::MAX_CONFIG_SIZE)
            .await?;
        check_blob("config", &m.config.digest, m.config.size, &b)?;
        b
    };
    let config = manifest::parse_config(&config_bytes)
        .map_err(|r| bad_manifest(shown, &chosen.digest, r.to_string()))?;
    Ok((config_bytes, config))
}

/// The image's layers: the manifest's, each with its diff ID from the config and its chain
/// ID; refused unless the config lists one diff ID per layer and every layer's media type is
/// one this node unpacks.
pub(super) fn layer_list(
    shown: &str,
    chosen: &Chosen,
    config: &ImageConfig,
) -> Result<Vec<Layer>, Error> {
    let m = &chosen.manifest;
    let diff_ids = &config.rootfs.diff_ids;
    if diff_ids.len() != m.layers.len() {
        return Err(bad_manifest(
            shown,
            &chosen.digest,
            format!(
                "{} layers but the config lists {} diff IDs",
                m.layers.len(),
                diff_ids.len()
            ),
        ));
    }
    for l in &m.layers {
        if !manifest::is_layer(&l.media_type) {
            return Err(bad_manifest(
                shown,
                &chosen.digest,
                format!(
                    "layer {} has unsupported media type {:?}",
                    l.digest, l.media_type
                ),
            ));
        }
    }
    let chains = snapshot::chain_ids(diff_ids);
    Ok(m.layers
        .iter()
        .zip(diff_ids)
        .zip(&chains)
        .map(|((d, diff), chain)| Layer {
            digest: d.digest.clone(),
            size: d.size,
            media_type: d.media_type.clone(),
            diff_id: diff.clone(),
            chain_id: chain.clone(),
            toc_digest: d
                .annotations
                .get(crate::snapshot::lazy::toc::TOC_DIGEST_ANNOTATION)
                .and_then(|a| a.parse().ok()),
        })
        .collect())
}

/// Checks a small blob against its descriptor: its size, then its digest.
fn check_blob(what: &'static str, digest: &Digest, size: u64, data: &[u8]) -> Result<(), Error> {
    if data.len() as u64 != size {
        return Err(Error::SizeMismatch {
            what,
            digest: digest.clone(),
            expected: size,
            actual: data.len() as u64,
        });
    }
    check_digest(what, digest, data)
}

/// An image resolved to its platform manifest, config and layers, all verified; nothing of
/// its layers fetched yet.
pub(super) struct Resolved<'a> {
    pub(super) session: Session<'a>,
    pub(super) chosen: Chosen,
    pub(super) config_bytes: Vec<u8>,
    pub(super) config: ImageConfig,
    pub(super) layers: Vec<Layer>,
}

/// Resolves `reference`: its manifest verified against the digest it was asked or resolved
/// by, the node's signature policy, the platform's manifest, the config.
pub(super) async fn resolve<'a>(
    inner: &'a Arc<Inner>,
    reference: &Reference,
    creds: Option<Credentials>,
) -> Result<Resolved<'a>, Error> {
    let session = inner.registry.session(reference, creds).await?;
    let shown = reference.to_string();
    let fetched = session.manifest(&reference.object()).await?;
    let top = Digest::of(&fetched.data);
    check_top_digest(reference, &fetched, &top)?;
    // The node's policy, read now (an edit applies to the next pull), before any layer.
    let policy = super::policy::Policy::load(&inner.signature_policy).map_err(|source| {
        Error::PolicyFile {
            path: inner.signature_policy.clone(),
            source,
        }
    })?;
    if let Some(policy) = &policy {
        super::signature::check(policy, &session, reference, &top).await?;
    }
    let chosen = choose_manifest(&session, &shown, fetched, top).await?;
    let (config_bytes, config) = fetch_config(inner, &session, &shown, &chosen).await?;
    let layers = layer_list(&shown, &chosen, &config)?;
    Ok(Resolved {
        session,
        chosen,
        config_bytes,
        config,
        layers,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blob_checks() {
        let d = Digest::of(b"abc");
        assert!(check_blob("config", &d, 3, b"abc").is_ok());
        assert!(matches!(
            check_blob("config", &d, 4, b"abc"),
            Err(Error::SizeMismatch { .. })
        ));
        assert!(matches!(
            check_blob("config", &d, 3, b"abd"),
            Err(Error::DigestMismatch { .. })
        ));
    }
}
