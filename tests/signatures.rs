//! The signature policy on the pull path, against the real registry: images signed the way
//! cosign signs them (a simple-signing payload under the `sha256-<hex>.sig` tag, its signature
//! in the layer's annotation), with keys `openssl` makes (ECDSA P-256 and Ed25519). Signed,
//! unsigned, signed by another key, signed for another repository, a tampered payload, a
//! rejected scope, and a policy changed between pulls without a restart; a refused image
//! leaves nothing behind.

#![allow(clippy::unwrap_used)] // tests may panic on what they did not expect

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use base64::Engine;
use common::*;
use tonic::Code;

/// A key pair made by openssl: the private key file and the public key's PEM.
struct Key {
    private: PathBuf,
    public: PathBuf,
    ed25519: bool,
}

fn openssl(args: &[&str]) {
    let out = Command::new("openssl").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Key {
    fn new(dir: &Path, name: &str, ed25519: bool) -> Key {
        let private = dir.join(format!("{name}.key"));
        let public = dir.join(format!("{name}.pub"));
        let p = private.to_str().unwrap();
        if ed25519 {
            openssl(&["genpkey", "-algorithm", "ed25519", "-out", p]);
        } else {
            openssl(&[
                "ecparam",
                "-name",
                "prime256v1",
                "-genkey",
                "-noout",
                "-out",
                p,
            ]);
        }
        openssl(&[
            "pkey",
            "-in",
            p,
            "-pubout",
            "-out",
            public.to_str().unwrap(),
        ]);
        Key {
            private,
            public,
            ed25519,
        }
    }

    /// A signature over `data` as cosign makes one (ECDSA: DER over SHA-256; Ed25519: pure).
    fn sign(&self, dir: &Path, data: &[u8]) -> Vec<u8> {
        let input = dir.join("payload.in");
        let output = dir.join("payload.sig");
        std::fs::write(&input, data).unwrap();
        let (i, o, k) = (
            input.to_str().unwrap(),
            output.to_str().unwrap(),
            self.private.to_str().unwrap(),
        );
        if self.ed25519 {
            openssl(&[
                "pkeyutl", "-sign", "-rawin", "-inkey", k, "-in", i, "-out", o,
            ]);
        } else {
            openssl(&["dgst", "-sha256", "-sign", k, "-out", o, i]);
        }
        std::fs::read(&output).unwrap()
    }
}

/// What cosign writes as the payload for `reference` (its repository) at `digest`.
fn payload(reference: &str, digest: &str) -> Vec<u8> {
    serde_json::json!({
        "critical": {
            "identity": {"docker-reference": reference},
            "image": {"docker-manifest-digest": digest},
            "type": "cosign container image signature"
        },
        "optional": null
    })
    .to_string()
    .into_bytes()
}

/// Pushes a signature manifest for manifest `digest` of `repo` under cosign's tag.
async fn attach(reg: &Registry, repo: &str, digest: &str, payload: &[u8], signature: &[u8]) {
    let (manifest, _) = signature_manifest(reg, repo, payload, signature).await;
    let tag = format!("sha256-{}.sig", digest.trim_start_matches("sha256:"));
    reg.push_manifest(
        repo,
        &tag,
        "application/vnd.oci.image.manifest.v1+json",
        manifest.as_bytes(),
    )
    .await
    .unwrap();
}

/// Pushes a signature's payload and config to `repo`; returns its manifest and digest.
async fn signature_manifest(
    reg: &Registry,
    repo: &str,
    payload: &[u8],
    signature: &[u8],
) -> (String, String) {
    let config =
        br#"{"architecture":"","config":{},"os":"","rootfs":{"type":"layers","diff_ids":[]}}"#;
    let config_digest = reg.push_blob(repo, config).await.unwrap();
    let payload_digest = reg.push_blob(repo, payload).await.unwrap();
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "size": config.len(),
            "digest": config_digest
        },
        "layers": [{
            "mediaType": "application/vnd.dev.cosign.simplesigning.v1+json",
            "size": payload.len(),
            "digest": payload_digest,
            "annotations": {
                "dev.cosignproject.cosign/signature":
                    base64::engine::general_purpose::STANDARD.encode(signature)
            }
        }]
    })
    .to_string();
    let digest = sha256(manifest.as_bytes());
    (manifest, digest)
}

/// An HTTP front for the registry that has the OCI 1.1 referrers API Debian's registry lacks:
/// every referrers request is answered `index`; the rest goes to the registry.
fn referrers_front(registry: u16, index: String) -> u16 {
    use std::io::Write;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut client) = conn else { continue };
            let index = index.clone();
            std::thread::spawn(move || {
                if !wire::speaks_http(&client) {
                    return;
                }
                let Some(head) = wire::request_head(&mut client) else {
                    return;
                };
                let path = head.split_whitespace().nth(1).unwrap_or("");
                if path.contains("/referrers/") {
                    let _ = write!(
                        client,
                        "HTTP/1.1 200 OK\r\nContent-Type: application/vnd.oci.image.index.v1+json\r\n\
                         Content-Length: {}\r\nConnection: close\r\n\r\n{index}",
                        index.len()
                    );
                    return;
                }
                wire::forward(&head, client, registry);
            });
        }
    });
    port
}

fn write_policy(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[tokio::test]
async fn pulls_follow_the_signature_policy() {
    let keys = tempfile::tempdir().unwrap();
    let ours = Key::new(keys.path(), "ours", false);
    let ed = Key::new(keys.path(), "ed", true);
    let stranger = Key::new(keys.path(), "stranger", false);

    let reg = Registry::start(None);
    let img = image(vec![busybox_layer(Compress::Gzip)], &ImageOpts::default());
    let host = reg.host();
    // The same image under five repositories, each signed differently.
    let mut digests = std::collections::HashMap::new();
    for repo in [
        "signed", "edsigned", "unsigned", "stranger", "moved", "tampered",
    ] {
        let d = reg.push_image(repo, "1", &img).await.unwrap();
        digests.insert(repo, d);
    }
    let sign = |key: &Key, repo: &str, named: &str| {
        let p = payload(&format!("{host}/{named}"), &digests[repo]);
        let s = key.sign(keys.path(), &p);
        (p, s)
    };
    let (p, s) = sign(&ours, "signed", "signed");
    attach(&reg, "signed", &digests["signed"], &p, &s).await;
    let (p, s) = sign(&ed, "edsigned", "edsigned");
    attach(&reg, "edsigned", &digests["edsigned"], &p, &s).await;
    let (p, s) = sign(&stranger, "stranger", "stranger");
    attach(&reg, "stranger", &digests["stranger"], &p, &s).await;
    // Signed by our key, but for another repository.
    let (p, s) = sign(&ours, "moved", "signed");
    attach(&reg, "moved", &digests["moved"], &p, &s).await;
    // A genuine signature, with the payload changed after signing.
    let (p, s) = sign(&ours, "tampered", "tampered");
    let mut changed = String::from_utf8(p).unwrap();
    changed = changed.replace(
        "cosign container image signature",
        "cosign container image signaturE",
    );
    attach(
        &reg,
        "tampered",
        &digests["tampered"],
        changed.as_bytes(),
        &s,
    )
    .await;

    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("policy.json");
    let ed_data =
        base64::engine::general_purpose::STANDARD.encode(std::fs::read(&ed.public).unwrap());
    write_policy(
        &policy,
        &format!(
            r#"{{"default": [{{"type": "reject"}}],
                "transports": {{"docker": {{
                    "{host}": [{{"type": "sigstoreSigned", "keyPath": "{}",
                                 "signedIdentity": {{"type": "matchRepository"}}}}],
                    "{host}/edsigned": [{{"type": "sigstoreSigned", "keyData": "{ed_data}",
                                          "signedIdentity": {{"type": "matchRepository"}}}}]
                }}}}}}"#,
            ours.public.display()
        ),
    );
    let d = Daemon::start(&format!(
        "[image]\nsignature_policy = \"{}\"\n",
        policy.display()
    ));
    let name = |repo: &str| format!("{host}/{repo}:1");

    let refused = |e: tonic::Status, why: &str| {
        assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
        assert!(
            e.message().contains("refused by the signature policy")
                && e.message().contains(&format!("scope \"{host}\""))
                && e.message().contains(why),
            "{why}: {}",
            e.message()
        );
    };
    refused(d.pull(&name("unsigned")).await.unwrap_err(), "no signature");
    refused(
        d.pull(&name("stranger")).await.unwrap_err(),
        "signature by an unknown key",
    );
    refused(
        d.pull(&name("moved")).await.unwrap_err(),
        "identity mismatch",
    );
    refused(
        d.pull(&name("tampered")).await.unwrap_err(),
        "signature by an unknown key",
    );
    // Nothing of a refused image was fetched or kept.
    assert!(d.list_images().await.is_empty());
    assert!(d.ingests().is_empty() && d.blobs().is_empty() && d.snapshots().is_empty());
    for repo in ["unsigned", "stranger", "moved", "tampered"] {
        for l in &img.layers {
            let path = format!("/v2/{repo}/blobs/{}", l.digest);
            assert_eq!(reg.requests("GET", &path), 0, "GET {path}");
        }
    }
    assert_eq!(d.pull(&name("signed")).await.unwrap(), img.config_digest);
    assert_eq!(d.pull(&name("edsigned")).await.unwrap(), img.config_digest);

    // An edit applies to the next pull, without a restart: accept the unsigned repository,
    // then reject everything of the registry.
    write_policy(
        &policy,
        &format!(
            r#"{{"default": [{{"type": "reject"}}],
                "transports": {{"docker": {{"{host}/unsigned": [{{"type": "insecureAcceptAnything"}}]}}}}}}"#
        ),
    );
    assert_eq!(d.pull(&name("unsigned")).await.unwrap(), img.config_digest);
    refused_default(d.pull(&name("signed")).await.unwrap_err());
    // A broken policy fails pulls naming the file and the field, and nothing else.
    write_policy(&policy, r#"{"default": [{"type": "sigstoreSigned"}]}"#);
    let e = d.pull(&name("signed")).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(
        e.message().contains("policy.json") && e.message().contains("default[0]"),
        "{}",
        e.message()
    );
    // No policy file: every image is accepted.
    std::fs::remove_file(&policy).unwrap();
    assert_eq!(d.pull(&name("stranger")).await.unwrap(), img.config_digest);
}

fn refused_default(e: tonic::Status) {
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(
        e.message().contains("scope \"default\"") && e.message().contains("rejected"),
        "{}",
        e.message()
    );
}

/// A registry with the referrers API: the signature is found there (it has no tag at all).
#[tokio::test]
async fn signatures_found_by_referrers() {
    let keys = tempfile::tempdir().unwrap();
    let ours = Key::new(keys.path(), "ours", false);
    let reg = Registry::start(None);
    let img = image(vec![busybox_layer(Compress::Gzip)], &ImageOpts::default());
    let digest = reg.push_image("refd", "1", &img).await.unwrap();
    let p = payload(&format!("{}/refd", reg.host()), &digest);
    let s = ours.sign(keys.path(), &p);
    let (manifest, sig_digest) = signature_manifest(&reg, "refd", &p, &s).await;
    reg.push_manifest(
        "refd",
        &sig_digest,
        "application/vnd.oci.image.manifest.v1+json",
        manifest.as_bytes(),
    )
    .await
    .unwrap();
    let index = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": sig_digest,
            "size": manifest.len(),
            "artifactType": "application/vnd.dev.cosign.artifact.sig.v1+json"
        }]
    })
    .to_string();
    let front = referrers_front(reg.port, index);
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("policy.json");
    write_policy(
        &policy,
        &format!(
            r#"{{"default": [{{"type": "sigstoreSigned", "keyPath": "{}",
                              "signedIdentity": {{"type": "exactRepository",
                                                  "dockerRepository": "{}/refd"}}}}]}}"#,
            ours.public.display(),
            reg.host()
        ),
    );
    let d = Daemon::start(&format!(
        "[image]\nsignature_policy = \"{}\"\n",
        policy.display()
    ));
    // Through the front (signed under the registry's own name, which the policy names).
    let through = format!("127.0.0.1:{front}/refd:1");
    assert_eq!(d.pull(&through).await.unwrap(), img.config_digest);
    // Without the referrers API the signature, which has no tag, is not found.
    let direct = format!("{}/refd:1", reg.host());
    let e = d.pull(&direct).await.unwrap_err();
    assert!(e.message().contains("no signature"), "{}", e.message());
}
