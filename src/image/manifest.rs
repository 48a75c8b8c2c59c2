//! OCI and Docker v2 schema 2 manifests, indexes (manifest lists) and image configs: just the
//! fields crius uses, parsed tolerantly where the formats agree and strictly where it matters
//! (digests, sizes, the number of layers). Picks the node's platform from an index.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::content::Digest;

pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
const DOCKER_SCHEMA1: &str = "application/vnd.docker.distribution.manifest.v1+json";
const DOCKER_SCHEMA1_SIGNED: &str = "application/vnd.docker.distribution.manifest.v1+prettyjws";

/// What the registry is told we accept, in order of preference.
pub const ACCEPT: &str = "application/vnd.oci.image.index.v1+json, application/vnd.docker.distribution.manifest.list.v2+json, application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json";

/// The largest manifest or index accepted (containerd uses the same bound).
pub const MAX_MANIFEST_SIZE: u64 = 4 << 20;
/// The largest image config accepted.
pub const MAX_CONFIG_SIZE: u64 = 16 << 20;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Descriptor {
    #[serde(rename = "mediaType", default)]
    pub media_type: String,
    pub digest: Digest,
    pub size: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform: Option<Platform>,
    /// A layer's annotations (an eStargz layer names its table of contents' digest here).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub annotations: std::collections::BTreeMap<String, String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Platform {
    pub architecture: String,
    pub os: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
}

impl std::fmt::Display for Platform {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.os, self.architecture)?;
        if let Some(v) = &self.variant {
            write!(f, "/{v}")?;
        }
        Ok(())
    }
}

impl Platform {
    /// The platform this crius binary runs on.
    pub fn node() -> Platform {
        let (architecture, variant) = match std::env::consts::ARCH {
            "x86_64" => ("amd64", None),
            "aarch64" => ("arm64", Some("v8")),
            "arm" => ("arm", Some("v7")),
            "x86" => ("386", None),
            "powerpc64" => ("ppc64le", None),
            "riscv64" => ("riscv64", None),
            "s390x" => ("s390x", None),
            other => (other, None),
        };
        Platform {
            architecture: architecture.to_string(),
            os: std::env::consts::OS.to_string(),
            variant: variant.map(str::to_string),
        }
    }

    /// Whether an image for `other` runs here. A missing variant matches the baseline variant.
    pub fn runs(&self, other: &Platform) -> bool {
        if self.os != other.os || self.architecture != other.architecture {
            return false;
        }
        let baseline = match self.architecture.as_str() {
            "arm64" => "v8",
            "amd64" => "v1",
            _ => "",
        };
        let theirs = other.variant.as_deref().unwrap_or(baseline);
        let ours = self.variant.as_deref().unwrap_or(baseline);
        theirs == ours || (theirs.is_empty() && ours == baseline)
    }
}

#[derive(Debug, Clone, Deserialize)]
pub struct Manifest {
    #[serde(rename = "schemaVersion")]
    pub schema_version: u32,
    #[serde(rename = "mediaType", default)]
    pub media_type: Option<String>,
    pub config: Descriptor,
    #[serde(default)]
    pub layers: Vec<Descriptor>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Index {
    #[serde(rename = "schemaVersion")]
    pub schema_version: u32,
    #[serde(rename = "mediaType", default)]
    pub media_type: Option<String>,
    pub manifests: Vec<Descriptor>,
}

#[derive(Debug)]
pub enum Parsed {
    Index(Index),
    Manifest(Manifest),
}

/// Why a manifest, index or image config cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("not valid JSON: {0}")]
    Json(serde_json::Error),
    #[error(
        "Docker schema 1 manifests are not supported (deprecated; push the image again with a current client)"
    )]
    Schema1,
    #[error("unsupported schemaVersion {0:?}")]
    SchemaVersion(Option<u32>),
    #[error("unsupported manifest media type {0:?}")]
    MediaType(String),
    #[error("invalid index: {0}")]
    Index(Invalid),
    #[error("invalid manifest: {0}")]
    Manifest(Invalid),
    #[error("invalid image config: {0}")]
    Config(Invalid),
    #[error("unsupported rootfs type {0:?}")]
    RootfsType(String),
}

/// A document that does not decode, and the field where it fails (`layers[2].size`).
#[derive(Debug, thiserror::Error)]
#[error("{}{source}", at(path))]
pub struct Invalid {
    pub path: String,
    #[source]
    pub source: serde_json::Error,
}

fn at(path: &str) -> String {
    if path == "." || path.is_empty() {
        String::new()
    } else {
        format!("{path}: ")
    }
}

/// Decodes `data`, naming the field a failure is at.
fn decode<T: serde::de::DeserializeOwned>(data: &[u8]) -> Result<T, Invalid> {
    let mut de = serde_json::Deserializer::from_slice(data);
    serde_path_to_error::deserialize(&mut de).map_err(|e| Invalid {
        path: e.path().to_string(),
        source: e.into_inner(),
    })
}

#[derive(Debug, Deserialize)]
struct Probe {
    #[serde(rename = "schemaVersion")]
    schema_version: Option<u32>,
    #[serde(rename = "mediaType")]
    media_type: Option<String>,
    manifests: Option<serde_json::Value>,
    config: Option<serde_json::Value>,
}

/// Parses a manifest or index. `content_type` is the registry's Content-Type, used only when the
/// document does not name its own media type.
pub fn parse(data: &[u8], content_type: Option<&str>) -> Result<Parsed, ManifestError> {
    let probe: Probe = serde_json::from_slice(data).map_err(ManifestError::Json)?;
    let media_type = probe
        .media_type
        .clone()
        .or_else(|| content_type.map(|c| c.split(';').next().unwrap_or("").trim().to_string()))
        .unwrap_or_default();
    if probe.schema_version == Some(1)
        || media_type == DOCKER_SCHEMA1
        || media_type == DOCKER_SCHEMA1_SIGNED
    {
        return Err(ManifestError::Schema1);
    }
    if probe.schema_version != Some(2) {
        return Err(ManifestError::SchemaVersion(probe.schema_version));
    }
    let is_index = match media_type.as_str() {
        OCI_INDEX | DOCKER_LIST => true,
        OCI_MANIFEST | DOCKER_MANIFEST => false,
        // OCI allows omitting mediaType: tell the two apart by shape.
        _ if probe.manifests.is_some() => true,
        _ if probe.config.is_some() => false,
        other => return Err(ManifestError::MediaType(other.to_string())),
    };
    if is_index {
        let index: Index = decode(data).map_err(ManifestError::Index)?;
        Ok(Parsed::Index(index))
    } else {
        let m: Manifest = decode(data).map_err(ManifestError::Manifest)?;
        Ok(Parsed::Manifest(m))
    }
}

impl Index {
    /// The first manifest that runs on `platform`, preferring an exact variant match.
    pub fn select(&self, platform: &Platform) -> Option<&Descriptor> {
        let candidates: Vec<&Descriptor> = self
            .manifests
            .iter()
            .filter(|d| d.platform.as_ref().is_some_and(|p| platform.runs(p)))
            .collect();
        candidates
            .iter()
            .find(|d| {
                d.platform
                    .as_ref()
                    .is_some_and(|p| p.variant == platform.variant)
            })
            .or(candidates.first())
            .copied()
    }

    pub fn platforms(&self) -> Vec<String> {
        self.manifests
            .iter()
            .map(|d| {
                d.platform
                    .as_ref()
                    .map(|p| p.to_string())
                    .unwrap_or_else(|| "unknown".into())
            })
            .collect()
    }
}

/// The parts of an image config crius reads (the raw blob is kept for verbose status).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ImageConfig {
    #[serde(default)]
    pub architecture: String,
    #[serde(default)]
    pub os: String,
    #[serde(default)]
    pub created: Option<String>,
    #[serde(default)]
    pub config: RunConfig,
    pub rootfs: RootFs,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RunConfig {
    #[serde(rename = "User", default)]
    pub user: String,
    #[serde(rename = "Env", default)]
    pub env: Option<Vec<String>>,
    #[serde(rename = "Entrypoint", default)]
    pub entrypoint: Option<Vec<String>>,
    #[serde(rename = "Cmd", default)]
    pub cmd: Option<Vec<String>>,
    #[serde(rename = "WorkingDir", default)]
    pub working_dir: String,
    #[serde(rename = "Labels", default)]
    pub labels: Option<BTreeMap<String, String>>,
    #[serde(rename = "StopSignal", default)]
    pub stop_signal: String,
    #[serde(rename = "Volumes", default)]
    pub volumes: Option<BTreeMap<String, serde_json::Value>>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RootFs {
    #[serde(rename = "type", default)]
    pub kind: String,
    pub diff_ids: Vec<Digest>,
}

pub fn parse_config(data: &[u8]) -> Result<ImageConfig, ManifestError> {
    let c: ImageConfig = decode(data).map_err(ManifestError::Config)?;
    if !c.rootfs.kind.is_empty() && c.rootfs.kind != "layers" {
        return Err(ManifestError::RootfsType(c.rootfs.kind));
    }
    Ok(c)
}

/// How a layer's bytes are compressed, judged by its first bytes (media types are sometimes wrong).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    Gzip,
    Zstd,
    None,
}

impl Compression {
    pub fn sniff(head: &[u8]) -> Compression {
        if head.starts_with(&[0x1f, 0x8b]) {
            Compression::Gzip
        } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
            Compression::Zstd
        } else {
            Compression::None
        }
    }
}

/// Layer media types crius unpacks; anything else (Windows foreign layers, encrypted layers,
/// artifacts) fails the pull with a clear error.
pub fn is_layer(media_type: &str) -> bool {
    matches!(
        media_type,
        "application/vnd.oci.image.layer.v1.tar"
            | "application/vnd.oci.image.layer.v1.tar+gzip"
            | "application/vnd.oci.image.layer.v1.tar+zstd"
            | "application/vnd.oci.image.layer.nondistributable.v1.tar"
            | "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip"
            | "application/vnd.oci.image.layer.nondistributable.v1.tar+zstd"
            | "application/vnd.docker.image.rootfs.diff.tar.gzip"
            | "application/vnd.docker.image.rootfs.diff.tar"
            | ""
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(n: u8) -> String {
        Digest::of(&[n]).to_string()
    }

    #[test]
    fn parses_docker_and_oci_manifests() {
        let docker = format!(
            r#"{{"schemaVersion":2,"mediaType":"{DOCKER_MANIFEST}","config":{{"mediaType":"application/vnd.docker.container.image.v1+json","size":10,"digest":"{}"}},"layers":[{{"mediaType":"application/vnd.docker.image.rootfs.diff.tar.gzip","size":5,"digest":"{}"}}]}}"#,
            d(1),
            d(2)
        );
        let Parsed::Manifest(m) = parse(docker.as_bytes(), None).unwrap() else {
            panic!()
        };
        assert_eq!(m.layers.len(), 1);
        assert_eq!(m.config.size, 10);
        // OCI without mediaType: told apart by shape
        let oci = format!(
            r#"{{"schemaVersion":2,"config":{{"size":1,"digest":"{}"}},"layers":[]}}"#,
            d(3)
        );
        assert!(matches!(
            parse(oci.as_bytes(), None).unwrap(),
            Parsed::Manifest(_)
        ));
        let idx = format!(
            r#"{{"schemaVersion":2,"manifests":[{{"size":1,"digest":"{}","platform":{{"os":"linux","architecture":"amd64"}}}}]}}"#,
            d(4)
        );
        assert!(matches!(
            parse(idx.as_bytes(), None).unwrap(),
            Parsed::Index(_)
        ));
    }

    #[test]
    fn rejects_schema1_and_junk() {
        assert!(
            parse(br#"{"schemaVersion":1,"name":"x"}"#, None)
                .unwrap_err()
                .to_string()
                .contains("schema 1")
        );
        assert!(parse(b"not json", None).is_err());
        assert!(parse(br#"{"schemaVersion":2}"#, None).is_err());
        let bad_digest =
            r#"{"schemaVersion":2,"config":{"size":1,"digest":"sha256:zz"},"layers":[]}"#;
        assert!(parse(bad_digest.as_bytes(), None).is_err());
    }

    #[test]
    fn platform_selection() {
        let p = |a: &str, v: Option<&str>| Platform {
            architecture: a.into(),
            os: "linux".into(),
            variant: v.map(Into::into),
        };
        let desc = |n: u8, plat: Platform| Descriptor {
            media_type: OCI_MANIFEST.into(),
            digest: Digest::of(&[n]),
            size: 1,
            platform: Some(plat),
            annotations: Default::default(),
        };
        let index = Index {
            schema_version: 2,
            media_type: None,
            manifests: vec![
                desc(1, p("arm", Some("v6"))),
                desc(2, p("arm64", None)),
                desc(3, p("amd64", None)),
                desc(4, p("arm", Some("v7"))),
            ],
        };
        assert_eq!(
            index.select(&p("amd64", None)).unwrap().digest,
            Digest::of(&[3])
        );
        assert_eq!(
            index.select(&p("arm64", Some("v8"))).unwrap().digest,
            Digest::of(&[2])
        );
        assert_eq!(
            index.select(&p("arm", Some("v7"))).unwrap().digest,
            Digest::of(&[4])
        );
        assert!(index.select(&p("s390x", None)).is_none());
        assert!(!p("amd64", None).runs(&p("amd64", Some("v3"))));
        assert_eq!(index.platforms()[0], "linux/arm/v6");
    }

    #[test]
    fn compression_sniffing() {
        assert_eq!(Compression::sniff(&[0x1f, 0x8b, 8]), Compression::Gzip);
        assert_eq!(
            Compression::sniff(&[0x28, 0xb5, 0x2f, 0xfd]),
            Compression::Zstd
        );
        assert_eq!(Compression::sniff(b"usr/"), Compression::None);
    }
}

#[cfg(test)]
mod props {
    use proptest::prelude::*;
    use serde_json::{Value, json};

    use super::*;

    fn platform() -> impl Strategy<Value = Platform> {
        (
            prop::sample::select(vec!["amd64", "arm64", "arm", "s390x"]),
            prop::option::of(prop::sample::select(vec!["v1", "v3", "v6", "v7", "v8"])),
        )
            .prop_map(|(a, v)| Platform {
                architecture: a.into(),
                os: "linux".into(),
                variant: v.map(Into::into),
            })
    }

    fn descriptor(with_platform: bool) -> impl Strategy<Value = Descriptor> {
        (
            any::<[u8; 4]>(),
            0u64..(1 << 40),
            prop::sample::select(vec![
                OCI_MANIFEST,
                "application/vnd.oci.image.layer.v1.tar+gzip",
            ]),
            platform(),
        )
            .prop_map(move |(b, size, media_type, p)| Descriptor {
                media_type: media_type.into(),
                digest: Digest::of(&b),
                size,
                platform: with_platform.then_some(p),
                annotations: Default::default(),
            })
    }

    fn manifest_json(config: &Descriptor, layers: &[Descriptor], named: bool) -> Value {
        let mut m = json!({
            "schemaVersion": 2,
            "config": config,
            "layers": layers,
            // Fields crius does not use are ignored.
            "annotations": {"org.opencontainers.image.created": "now"},
        });
        if named {
            m["mediaType"] = json!(OCI_MANIFEST);
        }
        m
    }

    proptest! {
        /// Any bytes, with any Content-Type, are parsed or refused: never a panic.
        #[test]
        fn any_bytes_are_parsed_or_refused(
            data in prop::collection::vec(any::<u8>(), 0..512),
            content_type in prop::option::of("[a-z/.+;= 0-9-]{0,60}"),
        ) {
            let _ = parse(&data, content_type.as_deref());
            let _ = parse_config(&data);
        }

        /// A manifest of generated descriptors parses back to them, whether it names its
        /// media type or is told apart by its shape.
        #[test]
        fn manifests_parse_back(
            config in descriptor(false),
            layers in prop::collection::vec(descriptor(false), 0..8),
            named in any::<bool>(),
        ) {
            let data = serde_json::to_vec(&manifest_json(&config, &layers, named)).unwrap();
            let Ok(Parsed::Manifest(m)) = parse(&data, None) else {
                return Err(TestCaseError::fail("not parsed as a manifest"));
            };
            prop_assert_eq!(m.config, config);
            prop_assert_eq!(m.layers, layers);
        }

        /// An index picks a manifest that runs on the platform asked for, one whenever any
        /// does, and the exact variant when one has it.
        #[test]
        fn index_selection(
            manifests in prop::collection::vec(descriptor(true), 0..8),
            want in platform(),
        ) {
            let data = serde_json::to_vec(&json!({
                "schemaVersion": 2,
                "mediaType": OCI_INDEX,
                "manifests": manifests,
            })).unwrap();
            let Ok(Parsed::Index(index)) = parse(&data, None) else {
                return Err(TestCaseError::fail("not parsed as an index"));
            };
            let runs = |d: &Descriptor| d.platform.as_ref().is_some_and(|p| want.runs(p));
            match index.select(&want) {
                Some(d) => {
                    prop_assert!(runs(d));
                    let exact = manifests.iter().any(|m| runs(m) && m.platform.as_ref().unwrap().variant == want.variant);
                    if exact {
                        prop_assert_eq!(&d.platform.as_ref().unwrap().variant, &want.variant);
                    }
                }
                None => prop_assert!(!manifests.iter().any(runs)),
            }
        }

        /// A field of the wrong kind anywhere in the layers is refused, naming where.
        #[test]
        fn broken_fields_are_named(
            config in descriptor(false),
            layers in prop::collection::vec(descriptor(false), 1..6),
            which in any::<prop::sample::Index>(),
            field in prop::sample::select(vec!["size", "digest"]),
        ) {
            let mut m = manifest_json(&config, &layers, true);
            let i = which.index(layers.len());
            m["layers"][i][field] = if field == "size" { json!("big") } else { json!("sha256:nothex") };
            let err = parse(&serde_json::to_vec(&m).unwrap(), None).err().map(|e| e.to_string());
            let want = format!("layers[{i}].{field}");
            prop_assert!(err.as_ref().is_some_and(|e| e.contains(&want)), "{:?} does not name {}", err, want);
        }
    }
}
