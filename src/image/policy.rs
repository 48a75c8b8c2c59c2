//! Image signature policy in the `containers-policy.json` format CRI-O's and podman's operators
//! write: a `default` list of requirements and, for the `docker` transport, lists by scope
//! (`host[:port]/repo:tag` or `@digest`, `host/repo`, its namespaces, `host`, `*.domain`), the
//! most specific scope that names the image applying. Requirements: `insecureAcceptAnything`,
//! `reject`, and `sigstoreSigned` with public keys (`keyPath`, `keyPaths`, `keyData`: ECDSA
//! P-256 or Ed25519, PEM) and a `signedIdentity` rule for the reference a signature names.
//! Parsing and matching only: `signature` fetches and verifies. Errors name the field.

use std::path::Path;

use base64::Engine;
use serde_json::Value;

use super::reference::Reference;

/// A policy file that cannot be used, with where in it.
#[derive(Debug, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct PolicyError {
    pub field: String,
    pub reason: String,
}

fn bad(field: impl Into<String>, reason: impl Into<String>) -> PolicyError {
    PolicyError {
        field: field.into(),
        reason: reason.into(),
    }
}

/// A public key a signature may be made with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PublicKey {
    /// The uncompressed point (65 bytes).
    P256(Vec<u8>),
    /// The 32-byte key.
    Ed25519(Vec<u8>),
}

/// SubjectPublicKeyInfo DER before the key bits, for the two kinds of key (their encodings
/// are fixed: an id-ecPublicKey on prime256v1 with an uncompressed point, and id-Ed25519).
const P256_SPKI_PREFIX: &[u8] = &[
    0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08, 0x2a,
    0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00,
];
const ED25519_SPKI_PREFIX: &[u8] = &[
    0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
];

/// What is wrong with a public key file.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("not PEM: {0}")]
    NotPem(#[source] pem::PemError),
    #[error("no PEM block in it")]
    NoBlock,
    #[error("a {0:?} block, not a PUBLIC KEY")]
    NotAPublicKey(String),
    #[error("neither an ECDSA P-256 nor an Ed25519 public key")]
    Kind,
}

impl PublicKey {
    /// The keys of a PEM text (`-----BEGIN PUBLIC KEY-----` blocks).
    pub fn from_pem(text: &[u8]) -> Result<Vec<PublicKey>, KeyError> {
        let blocks = pem::parse_many(text).map_err(KeyError::NotPem)?;
        if blocks.is_empty() {
            return Err(KeyError::NoBlock);
        }
        blocks
            .iter()
            .map(|b| {
                if b.tag() != "PUBLIC KEY" {
                    return Err(KeyError::NotAPublicKey(b.tag().to_string()));
                }
                let der = b.contents();
                if let Some(point) = der.strip_prefix(P256_SPKI_PREFIX)
                    && point.len() == 65
                    && point[0] == 0x04
                {
                    Ok(PublicKey::P256(point.to_vec()))
                } else if let Some(key) = der.strip_prefix(ED25519_SPKI_PREFIX)
                    && key.len() == 32
                {
                    Ok(PublicKey::Ed25519(key.to_vec()))
                } else {
                    Err(KeyError::Kind)
                }
            })
            .collect()
    }

    /// Whether `signature` over `payload` is this key's (ECDSA: ASN.1 DER over SHA-256).
    pub fn verifies(&self, payload: &[u8], signature: &[u8]) -> bool {
        use ring::signature::{ECDSA_P256_SHA256_ASN1, ED25519, UnparsedPublicKey};
        match self {
            PublicKey::P256(k) => UnparsedPublicKey::new(&ECDSA_P256_SHA256_ASN1, k)
                .verify(payload, signature)
                .is_ok(),
            PublicKey::Ed25519(k) => UnparsedPublicKey::new(&ED25519, k)
                .verify(payload, signature)
                .is_ok(),
        }
    }
}

/// Which reference a signature must name for the image being pulled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SignedIdentity {
    /// The same repository for a pull by digest; the same repository and tag otherwise.
    MatchRepoDigestOrExact,
    MatchRepository,
    MatchExact,
    ExactReference(String),
    ExactRepository(String),
    /// The image's reference with `prefix` rewritten to `signed_prefix`, then as
    /// `MatchRepoDigestOrExact` (images copied from where they were signed).
    RemapIdentity {
        prefix: String,
        signed_prefix: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requirement {
    InsecureAcceptAnything,
    Reject,
    SigstoreSigned {
        keys: Vec<PublicKey>,
        identity: SignedIdentity,
    },
}

/// A loaded policy.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    default: Vec<Requirement>,
    /// The `docker` transport's scopes, as written.
    docker: Vec<(String, Vec<Requirement>)>,
}

impl Policy {
    /// Reads the policy at `path`; `None` when there is no such file (no policy: every image is
    /// accepted, as before one is written).
    pub fn load(path: &Path) -> Result<Option<Policy>, PolicyError> {
        let data = match std::fs::read(path) {
            Ok(d) => d,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(bad(path.display().to_string(), e.to_string())),
        };
        let base = path.parent().unwrap_or(Path::new("/"));
        Policy::parse(&data, base).map(Some)
    }

    /// Parses policy JSON; relative key paths are taken from `base`.
    pub fn parse(data: &[u8], base: &Path) -> Result<Policy, PolicyError> {
        let v: Value = serde_json::from_slice(data).map_err(|e| {
            bad(
                format!("line {} column {}", e.line(), e.column()),
                e.to_string(),
            )
        })?;
        let Value::Object(top) = &v else {
            return Err(bad("(top)", "not an object"));
        };
        for k in top.keys() {
            if k != "default" && k != "transports" {
                return Err(bad(k.as_str(), "unknown field"));
            }
        }
        let default = match top.get("default") {
            Some(d) => requirements(d, "default", base)?,
            None => return Err(bad("default", "is required")),
        };
        let mut docker = Vec::new();
        if let Some(t) = top.get("transports") {
            let Value::Object(transports) = t else {
                return Err(bad("transports", "not an object"));
            };
            for (name, scopes) in transports {
                let Value::Object(scopes) = scopes else {
                    return Err(bad(format!("transports.{name}"), "not an object"));
                };
                // Images come from registries only: other transports' scopes never apply.
                if name != "docker" {
                    continue;
                }
                for (scope, reqs) in scopes {
                    let field = format!("transports.docker[{scope:?}]");
                    docker.push((scope.clone(), requirements(reqs, &field, base)?));
                }
            }
        }
        Ok(Policy { default, docker })
    }

    /// The requirements for `image` and the scope they come from (`default` when no scope
    /// names it).
    pub fn for_image(&self, image: &Reference) -> (&str, &[Requirement]) {
        for scope in scopes(image) {
            if let Some((s, r)) = self.docker.iter().find(|(s, _)| *s == scope) {
                return (s, r);
            }
        }
        // The transport's own default scope, then the policy's.
        if let Some((s, r)) = self.docker.iter().find(|(s, _)| s.is_empty()) {
            return (s, r);
        }
        ("default", &self.default)
    }
}

/// The scopes that may name `image`, the most specific first, as containers/image lists them
/// for the docker transport.
fn scopes(image: &Reference) -> Vec<String> {
    let repo = image.name();
    let mut out = Vec::new();
    match (&image.digest, &image.tag) {
        (Some(d), _) => out.push(format!("{repo}@{d}")),
        (None, t) => out.push(format!("{repo}:{}", t.as_deref().unwrap_or("latest"))),
    }
    // The repository, then each namespace above it, then the host.
    let mut name = repo.as_str();
    loop {
        out.push(name.to_string());
        match name.rfind('/') {
            Some(i) => name = &name[..i],
            None => break,
        }
    }
    // Wildcards over the host's domains: *.b.c, then *.c.
    let host = image.domain.split(':').next().unwrap_or(&image.domain);
    let mut rest = host;
    while let Some(i) = rest.find('.') {
        rest = &rest[i + 1..];
        out.push(format!("*.{rest}"));
    }
    out
}

fn requirements(v: &Value, field: &str, base: &Path) -> Result<Vec<Requirement>, PolicyError> {
    let Value::Array(list) = v else {
        return Err(bad(field, "not a list of requirements"));
    };
    if list.is_empty() {
        return Err(bad(
            field,
            "an empty list (write [{\"type\": \"reject\"}] to refuse)",
        ));
    }
    list.iter()
        .enumerate()
        .map(|(i, r)| requirement(r, &format!("{field}[{i}]"), base))
        .collect()
}

fn requirement(v: &Value, field: &str, base: &Path) -> Result<Requirement, PolicyError> {
    let Value::Object(o) = v else {
        return Err(bad(field, "not an object"));
    };
    let kind = o
        .get("type")
        .and_then(Value::as_str)
        .ok_or_else(|| bad(format!("{field}.type"), "is required"))?;
    let only = |allowed: &[&str]| -> Result<(), PolicyError> {
        match o.keys().find(|k| !allowed.contains(&k.as_str())) {
            Some(k) => Err(bad(
                format!("{field}.{k}"),
                format!("not a field of {kind:?} requirements here"),
            )),
            None => Ok(()),
        }
    };
    match kind {
        "insecureAcceptAnything" => {
            only(&["type"])?;
            Ok(Requirement::InsecureAcceptAnything)
        }
        "reject" => {
            only(&["type"])?;
            Ok(Requirement::Reject)
        }
        "sigstoreSigned" => {
            only(&["type", "keyPath", "keyPaths", "keyData", "signedIdentity"])?;
            let keys = keys(o, field, base)?;
            let identity = match o.get("signedIdentity") {
                None => SignedIdentity::MatchRepoDigestOrExact,
                Some(i) => signed_identity(i, &format!("{field}.signedIdentity"))?,
            };
            Ok(Requirement::SigstoreSigned { keys, identity })
        }
        "signedBy" => Err(bad(
            format!("{field}.type"),
            "GPG signatures (signedBy) are not supported; use sigstoreSigned",
        )),
        other => Err(bad(
            format!("{field}.type"),
            format!("unknown requirement {other:?}"),
        )),
    }
}

fn keys(
    o: &serde_json::Map<String, Value>,
    field: &str,
    base: &Path,
) -> Result<Vec<PublicKey>, PolicyError> {
    let given: Vec<&str> = ["keyPath", "keyPaths", "keyData"]
        .into_iter()
        .filter(|k| o.contains_key(*k))
        .collect();
    if given.len() != 1 {
        return Err(bad(
            field,
            "exactly one of keyPath, keyPaths and keyData is required (keyless Fulcio \
             signatures are not supported)",
        ));
    }
    let read = |f: String, p: &str| -> Result<Vec<PublicKey>, PolicyError> {
        let path = base.join(p);
        let text = std::fs::read(&path).map_err(|e| bad(&f, format!("{}: {e}", path.display())))?;
        PublicKey::from_pem(&text).map_err(|e| bad(&f, format!("{}: {e}", path.display())))
    };
    match given[0] {
        "keyPath" => {
            let f = format!("{field}.keyPath");
            let p = o["keyPath"]
                .as_str()
                .ok_or_else(|| bad(&f, "not a string"))?;
            read(f, p)
        }
        "keyPaths" => {
            let f = format!("{field}.keyPaths");
            let list = o["keyPaths"]
                .as_array()
                .filter(|l| !l.is_empty())
                .ok_or_else(|| bad(&f, "not a list of paths"))?;
            let mut all = Vec::new();
            for (i, p) in list.iter().enumerate() {
                let fi = format!("{f}[{i}]");
                let p = p.as_str().ok_or_else(|| bad(&fi, "not a string"))?;
                all.extend(read(fi, p)?);
            }
            Ok(all)
        }
        _ => {
            let f = format!("{field}.keyData");
            let data = o["keyData"]
                .as_str()
                .ok_or_else(|| bad(&f, "not a string"))?;
            let pem = base64::engine::general_purpose::STANDARD
                .decode(data.trim())
                .map_err(|e| bad(&f, format!("not base64: {e}")))?;
            PublicKey::from_pem(&pem).map_err(|e| bad(&f, e.to_string()))
        }
    }
}

fn signed_identity(v: &Value, field: &str) -> Result<SignedIdentity, PolicyError> {
    let o = v.as_object().ok_or_else(|| bad(field, "not an object"))?;
    let kind = o
        .get("type")
        .and_then(Value::as_str)
        .ok_or_else(|| bad(format!("{field}.type"), "is required"))?;
    let text = |name: &str| -> Result<String, PolicyError> {
        o.get(name)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .ok_or_else(|| bad(format!("{field}.{name}"), "is required"))
    };
    Ok(match kind {
        "matchRepoDigestOrExact" => SignedIdentity::MatchRepoDigestOrExact,
        "matchRepository" => SignedIdentity::MatchRepository,
        "matchExact" => SignedIdentity::MatchExact,
        "exactReference" => SignedIdentity::ExactReference(text("dockerReference")?),
        "exactRepository" => SignedIdentity::ExactRepository(text("dockerRepository")?),
        "remapIdentity" => SignedIdentity::RemapIdentity {
            prefix: text("prefix")?,
            signed_prefix: text("signedPrefix")?,
        },
        other => {
            return Err(bad(
                format!("{field}.type"),
                format!("unknown identity rule {other:?}"),
            ));
        }
    })
}

impl SignedIdentity {
    /// Whether a signature naming `signed` (a reference as its payload writes it) is for
    /// `image` under this rule.
    pub fn matches(&self, image: &Reference, signed: &str) -> bool {
        let Ok(signed) = Reference::parse(signed) else {
            return false;
        };
        let tag = |r: &Reference| r.tag.clone().unwrap_or_else(|| "latest".into());
        let exact = |a: &Reference, b: &Reference| {
            a.name() == b.name()
                && match (&a.digest, &b.digest) {
                    (Some(x), Some(y)) => x == y,
                    (None, None) => tag(a) == tag(b),
                    _ => false,
                }
        };
        let repo_digest_or_exact = |image: &Reference| {
            if image.digest.is_some() {
                image.name() == signed.name()
            } else {
                signed.digest.is_none() && signed.tag.is_some() && exact(image, &signed)
            }
        };
        match self {
            SignedIdentity::MatchRepoDigestOrExact => repo_digest_or_exact(image),
            SignedIdentity::MatchRepository => image.name() == signed.name(),
            SignedIdentity::MatchExact => {
                image.digest.is_none() && signed.tag.is_some() && exact(image, &signed)
            }
            SignedIdentity::ExactReference(r) => {
                Reference::parse(r).is_ok_and(|r| signed.tag.is_some() && exact(&r, &signed))
            }
            SignedIdentity::ExactRepository(r) => {
                Reference::parse(r).is_ok_and(|r| r.name() == signed.name())
            }
            SignedIdentity::RemapIdentity {
                prefix,
                signed_prefix,
            } => {
                let shown = image.to_string();
                let remapped = match shown.strip_prefix(prefix.as_str()) {
                    // At a boundary: the whole prefix is a host, a path or the name itself.
                    Some(rest)
                        if rest.is_empty()
                            || prefix.ends_with('/')
                            || rest.starts_with(['/', ':', '@']) =>
                    {
                        format!("{signed_prefix}{rest}")
                    }
                    _ => shown,
                };
                Reference::parse(&remapped).is_ok_and(|r| repo_digest_or_exact(&r))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(s: &str) -> Reference {
        Reference::parse(s).unwrap()
    }

    #[test]
    fn the_most_specific_scope_applies() {
        let p = Policy::parse(
            br#"{"default": [{"type": "reject"}],
                 "transports": {"docker": {
                    "reg.test:5000/team/app:1": [{"type": "insecureAcceptAnything"}],
                    "reg.test:5000/team": [{"type": "reject"}],
                    "reg.test:5000": [{"type": "insecureAcceptAnything"}],
                    "*.mirror.test": [{"type": "insecureAcceptAnything"}]
                 },
                 "atomic": {"x": [{"type": "reject"}]}}}"#,
            Path::new("/"),
        )
        .unwrap();
        let scope = |s: &str| p.for_image(&r(s)).0.to_string();
        assert_eq!(
            scope("reg.test:5000/team/app:1"),
            "reg.test:5000/team/app:1"
        );
        assert_eq!(scope("reg.test:5000/team/app:2"), "reg.test:5000/team");
        assert_eq!(scope("reg.test:5000/other"), "reg.test:5000");
        assert_eq!(scope("a.b.mirror.test/x"), "*.mirror.test");
        assert_eq!(scope("quay.io/x"), "default");
        assert_eq!(p.for_image(&r("quay.io/x")).1, [Requirement::Reject]);
        assert_eq!(
            scopes(&r("busybox")),
            [
                "docker.io/library/busybox:latest",
                "docker.io/library/busybox",
                "docker.io/library",
                "docker.io",
                "*.io"
            ]
        );
    }

    #[test]
    fn bad_policies_name_the_field() {
        let err = |s: &str| {
            Policy::parse(s.as_bytes(), Path::new("/"))
                .unwrap_err()
                .to_string()
        };
        assert!(err("{").contains("line 1"));
        assert!(err(r#"{"transports": {}}"#).starts_with("default: is required"));
        assert!(err(r#"{"default": []}"#).contains("empty list"));
        assert!(
            err(r#"{"default": [{"type": "signedBy", "keyType": "GPGKeys"}]}"#)
                .starts_with("default[0].type: GPG")
        );
        assert!(
            err(r#"{"default": [{"type": "sigstoreSigned", "fulcio": {}}]}"#)
                .starts_with("default[0].fulcio")
        );
        assert!(
            err(r#"{"default": [{"type": "sigstoreSigned"}]}"#).contains("exactly one of keyPath")
        );
        assert!(
            err(r#"{"default": [{"type": "sigstoreSigned", "keyPath": "/nonexistent.pub"}]}"#)
                .starts_with("default[0].keyPath: /nonexistent.pub")
        );
        assert!(
            err(r#"{"default": [{"type": "sigstoreSigned", "keyData": "!!"}]}"#)
                .contains("not base64")
        );
        assert!(
            err(r#"{"default": [{"type": "insecureAcceptAnything"}],
                    "transports": {"docker": {"r": [{"type": "sigstoreSigned", "keyData": "",
                    "signedIdentity": {"type": "nope"}}]}}}"#)
            .starts_with("transports.docker[\"r\"][0]")
        );
        assert!(err(r#"{"default": [{"type": "reject", "x": 1}]}"#).starts_with("default[0].x"));
    }

    #[test]
    fn identities_as_containers_image_matches_them() {
        let tagged = r("reg.test/app:1");
        let by_digest = r(&format!("reg.test/app@sha256:{}", "a".repeat(64)));
        use SignedIdentity::*;
        assert!(MatchRepoDigestOrExact.matches(&tagged, "reg.test/app:1"));
        assert!(!MatchRepoDigestOrExact.matches(&tagged, "reg.test/app:2"));
        // cosign names the repository alone: enough for a pull by digest, not by tag.
        assert!(!MatchRepoDigestOrExact.matches(&tagged, "reg.test/app"));
        assert!(MatchRepoDigestOrExact.matches(&by_digest, "reg.test/app"));
        assert!(!MatchRepoDigestOrExact.matches(&by_digest, "reg.test/other"));
        assert!(MatchRepository.matches(&tagged, "reg.test/app"));
        assert!(!MatchRepository.matches(&tagged, "reg.test/app2"));
        assert!(MatchExact.matches(&tagged, "reg.test/app:1"));
        assert!(!MatchExact.matches(&by_digest, "reg.test/app"));
        assert!(ExactReference("reg.test/app:1".into()).matches(&tagged, "reg.test/app:1"));
        assert!(!ExactReference("reg.test/app:1".into()).matches(&tagged, "reg.test/app:2"));
        assert!(ExactRepository("reg.test/app".into()).matches(&by_digest, "reg.test/app:9"));
        let remap = RemapIdentity {
            prefix: "mirror.test/copies".into(),
            signed_prefix: "reg.test".into(),
        };
        assert!(remap.matches(&r("mirror.test/copies/app:1"), "reg.test/app:1"));
        assert!(!remap.matches(&r("mirror.test/copiesx/app:1"), "reg.test/app:1"));
        assert!(!MatchRepository.matches(&tagged, "not a reference"));
    }

    #[test]
    fn keys_from_pem() {
        // An Ed25519 key (RFC 8410's example) and a P-256 key.
        let ed = b"-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEAGb9ECWmEzf6FQbrBZ9w7lshQhqowtrbLDFw4rXAxZuE=\n-----END PUBLIC KEY-----\n";
        assert!(
            matches!(&PublicKey::from_pem(ed).unwrap()[..], [PublicKey::Ed25519(k)] if k.len() == 32)
        );
        let p256 = b"-----BEGIN PUBLIC KEY-----\nMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE49I9X0Qoy4YWEB6Q70dVmBcbCmJs\nXfiEnodajcb+EFikpbZ0trz1M/f0jEHorPvjz3FHYrfUGUu29N0oFiLGNQ==\n-----END PUBLIC KEY-----\n";
        assert!(
            matches!(&PublicKey::from_pem(p256).unwrap()[..], [PublicKey::P256(k)] if k.len() == 65)
        );
        assert!(PublicKey::from_pem(b"nothing").is_err());
        let rsa_like = b"-----BEGIN RSA PUBLIC KEY-----\nAAAA\n-----END RSA PUBLIC KEY-----\n";
        assert!(PublicKey::from_pem(rsa_like).is_err());
    }
}
