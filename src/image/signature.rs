//! Signatures on the pull path: whether an image may be pulled under the node's policy
//! (`policy`), checked once its top-level manifest digest is known and before any layer is
//! fetched. `sigstoreSigned` signatures are found as cosign stores them: the OCI 1.1 referrers
//! of the manifest (artifact type `application/vnd.dev.cosign.artifact.sig.v1+json`) and, when
//! the registry has no referrers API, the `sha256-<hex>.sig` tag. Each layer of a signature
//! manifest is a simple-signing payload with its signature in the
//! `dev.cosignproject.cosign/signature` annotation (base64); a payload counts when a policy key
//! verifies it, it names this manifest digest, and its identity passes the rule.

use std::collections::HashMap;

use base64::Engine;
use serde::Deserialize;

use super::policy::{Policy, Requirement, SignedIdentity};
use super::reference::Reference;
use super::registry::Session;
use super::{Error, check_digest};
use crate::content::Digest;

const SIGNATURE_ANNOTATION: &str = "dev.cosignproject.cosign/signature";
const COSIGN_ARTIFACT: &str = "application/vnd.dev.cosign.artifact.sig.v1+json";
const PAYLOAD_TYPE: &str = "cosign container image signature";
/// Signature manifests and payloads looked at per image, and a payload's largest size.
const MAX_SIGNATURES: usize = 16;
const MAX_PAYLOAD: u64 = 64 << 10;

#[derive(Deserialize)]
struct SignatureManifest {
    #[serde(default)]
    layers: Vec<SignatureLayer>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SignatureLayer {
    digest: Digest,
    size: u64,
    #[serde(default)]
    annotations: HashMap<String, String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Referrers {
    #[serde(default)]
    manifests: Vec<Referrer>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Referrer {
    digest: Digest,
    #[serde(default)]
    artifact_type: String,
}

#[derive(Deserialize)]
struct Payload {
    critical: Critical,
}

#[derive(Deserialize)]
struct Critical {
    identity: PayloadIdentity,
    image: PayloadImage,
    #[serde(rename = "type")]
    kind: String,
}

#[derive(Deserialize)]
struct PayloadIdentity {
    #[serde(rename = "docker-reference")]
    docker_reference: String,
}

#[derive(Deserialize)]
struct PayloadImage {
    #[serde(rename = "docker-manifest-digest")]
    docker_manifest_digest: String,
}

/// Refuses `image` (whose top-level manifest has digest `top`) unless every requirement of
/// the policy scope naming it holds.
pub async fn check(
    policy: &Policy,
    session: &Session<'_>,
    image: &Reference,
    top: &Digest,
) -> Result<(), Error> {
    let (scope, requirements) = policy.for_image(image);
    let refuse = |reason: Refusal| Error::Policy {
        image: image.to_string(),
        scope: scope.to_string(),
        reason,
    };
    let mut payloads: Option<Vec<(Vec<u8>, Vec<u8>)>> = None;
    for req in requirements {
        match req {
            Requirement::InsecureAcceptAnything => {}
            Requirement::Reject => return Err(refuse(Refusal::Rejected)),
            Requirement::SigstoreSigned { keys, identity } => {
                if payloads.is_none() {
                    payloads = Some(signatures(session, top).await?);
                }
                let found = payloads.as_deref().unwrap_or_default();
                if found.is_empty() {
                    return Err(refuse(Refusal::NoSignature));
                }
                judge(found, keys, identity, image, top).map_err(refuse)?;
            }
        }
    }
    Ok(())
}

/// Why the signature policy refused an image.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    #[error("rejected by the policy")]
    Rejected,
    #[error("no signature")]
    NoSignature,
    #[error("signature by an unknown key")]
    UnknownKey,
    #[error("a signed payload that is not simple signing JSON ({0})")]
    NotSimpleSigning(#[source] serde_json::Error),
    #[error("a signed payload of type {0:?}")]
    PayloadType(String),
    #[error("a signature for another manifest ({0})")]
    OtherManifest(String),
    #[error("identity mismatch: signed for {0:?}")]
    IdentityMismatch(String),
}

/// Whether one of `found` (payload, signature) is by one of `keys`, for `top`, and names an
/// identity `rule` accepts; else why not (the last signature's reason).
fn judge(
    found: &[(Vec<u8>, Vec<u8>)],
    keys: &[super::policy::PublicKey],
    rule: &SignedIdentity,
    image: &Reference,
    top: &Digest,
) -> Result<(), Refusal> {
    let mut why = Refusal::UnknownKey;
    for (payload, signature) in found {
        if !keys.iter().any(|k| k.verifies(payload, signature)) {
            continue;
        }
        let p: Payload = match serde_json::from_slice(payload) {
            Ok(p) => p,
            Err(e) => {
                why = Refusal::NotSimpleSigning(e);
                continue;
            }
        };
        if p.critical.kind != PAYLOAD_TYPE {
            why = Refusal::PayloadType(p.critical.kind);
        } else if p.critical.image.docker_manifest_digest != top.to_string() {
            why = Refusal::OtherManifest(p.critical.image.docker_manifest_digest);
        } else if !rule.matches(image, &p.critical.identity.docker_reference) {
            why = Refusal::IdentityMismatch(p.critical.identity.docker_reference);
        } else {
            return Ok(());
        }
    }
    Err(why)
}

/// Every (payload, signature) the registry holds for manifest `top`, by referrers and else by
/// the cosign tag; none when it holds none.
async fn signatures(session: &Session<'_>, top: &Digest) -> Result<Vec<(Vec<u8>, Vec<u8>)>, Error> {
    let mut manifests = Vec::new();
    if let Some(index) = session.referrers(top, COSIGN_ARTIFACT).await? {
        let list: Referrers = serde_json::from_slice(&index).map_err(|e| Error::Registry {
            url: session.domain().to_string(),
            status: 0,
            message: format!("referrers of {top}: {e}"),
        })?;
        for r in list
            .manifests
            .iter()
            .filter(|r| r.artifact_type == COSIGN_ARTIFACT)
            .take(MAX_SIGNATURES)
        {
            let m = session.manifest(&r.digest.to_string()).await?;
            check_digest("signature manifest", &r.digest, &m.data)?;
            manifests.push(m.data);
        }
    }
    if manifests.is_empty() {
        match session.manifest(&format!("sha256-{}.sig", top.hex())).await {
            Ok(m) => manifests.push(m.data),
            Err(Error::NotFound { .. } | Error::RegistryNotFound { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    let mut out = Vec::new();
    for data in manifests {
        let Ok(m) = serde_json::from_slice::<SignatureManifest>(&data) else {
            continue;
        };
        for layer in m.layers.iter().take(MAX_SIGNATURES) {
            let Some(sig) = layer.annotations.get(SIGNATURE_ANNOTATION) else {
                continue;
            };
            let Ok(sig) = base64::engine::general_purpose::STANDARD.decode(sig.trim()) else {
                continue;
            };
            if layer.size > MAX_PAYLOAD {
                continue;
            }
            let payload = session.small_blob(&layer.digest, MAX_PAYLOAD).await?;
            check_digest("signature payload", &layer.digest, &payload)?;
            out.push((payload, sig));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::policy::PublicKey;

    #[test]
    fn payloads_are_judged_by_key_digest_and_identity() {
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = ring::signature::Ed25519KeyPair::generate_pkcs8(&rng).unwrap();
        let pair = ring::signature::Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap();
        use ring::signature::KeyPair;
        let key = PublicKey::Ed25519(pair.public_key().as_ref().to_vec());
        let top = Digest::of(b"manifest");
        let image = Reference::parse("reg.test/app:1").unwrap();
        let payload = |reference: &str, digest: &str| {
            serde_json::json!({"critical": {
                "identity": {"docker-reference": reference},
                "image": {"docker-manifest-digest": digest},
                "type": PAYLOAD_TYPE}, "optional": null})
            .to_string()
            .into_bytes()
        };
        let signed = |p: Vec<u8>| {
            let s = pair.sign(&p).as_ref().to_vec();
            (p, s)
        };
        let good = signed(payload("reg.test/app", &top.to_string()));
        let rule = SignedIdentity::MatchRepository;
        assert!(
            judge(
                std::slice::from_ref(&good),
                std::slice::from_ref(&key),
                &rule,
                &image,
                &top
            )
            .is_ok()
        );
        // Another key, another manifest, another repository, a changed payload.
        let other = PublicKey::Ed25519(vec![7; 32]);
        let e = judge(std::slice::from_ref(&good), &[other], &rule, &image, &top).unwrap_err();
        assert!(matches!(e, Refusal::UnknownKey), "{e}");
        let elsewhere = signed(payload("reg.test/app", &Digest::of(b"x").to_string()));
        let e = judge(
            &[elsewhere],
            std::slice::from_ref(&key),
            &rule,
            &image,
            &top,
        )
        .unwrap_err();
        assert!(matches!(e, Refusal::OtherManifest(_)), "{e}");
        let moved = signed(payload("reg.test/evil", &top.to_string()));
        let e = judge(&[moved], std::slice::from_ref(&key), &rule, &image, &top).unwrap_err();
        assert!(matches!(e, Refusal::IdentityMismatch(_)), "{e}");
        let mut tampered = good.clone();
        tampered.0 = payload("reg.test/app", &Digest::of(b"y").to_string());
        let e = judge(&[tampered], std::slice::from_ref(&key), &rule, &image, &top).unwrap_err();
        assert!(matches!(e, Refusal::UnknownKey), "{e}");
        // One good signature among bad ones is enough.
        let junk = (b"junk".to_vec(), b"sig".to_vec());
        assert!(judge(&[junk, good], &[key], &rule, &image, &top).is_ok());
    }
}
