//! One CDI spec file as its vendor wrote it (CDI 0.3.0 to 1.1.0, JSON or YAML), and the checks
//! the CDI specification asks of it: a known version at least as new as the fields it uses, a
//! `vendor/class` kind, valid device names, and container edits a runtime can apply. Unknown
//! fields are refused, as the CDI library refuses them.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// The versions this runtime reads, oldest first.
pub const VERSIONS: [&str; 8] = [
    "0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0",
];

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Spec {
    pub cdi_version: String,
    pub kind: String,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    pub devices: Vec<Device>,
    #[serde(default)]
    pub container_edits: ContainerEdits,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Device {
    pub name: String,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    #[serde(default)]
    pub container_edits: ContainerEdits,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ContainerEdits {
    #[serde(default)]
    pub env: Vec<String>,
    #[serde(default)]
    pub device_nodes: Vec<DeviceNode>,
    #[serde(default)]
    pub net_devices: Vec<NetDevice>,
    #[serde(default)]
    pub hooks: Vec<Hook>,
    #[serde(default)]
    pub mounts: Vec<Mount>,
    #[serde(default)]
    pub intel_rdt: Option<IntelRdt>,
    #[serde(default, rename = "additionalGids")]
    pub additional_gids: Vec<u32>,
}

impl ContainerEdits {
    pub fn is_empty(&self) -> bool {
        *self == ContainerEdits::default()
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DeviceNode {
    pub path: String,
    #[serde(default)]
    pub host_path: String,
    #[serde(default, rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub major: i64,
    #[serde(default)]
    pub minor: i64,
    #[serde(default)]
    pub file_mode: Option<u32>,
    #[serde(default)]
    pub permissions: String,
    #[serde(default)]
    pub uid: Option<u32>,
    #[serde(default)]
    pub gid: Option<u32>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Mount {
    pub host_path: String,
    pub container_path: String,
    #[serde(default)]
    pub options: Vec<String>,
    #[serde(default, rename = "type")]
    pub kind: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Hook {
    pub hook_name: String,
    pub path: String,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub env: Vec<String>,
    #[serde(default)]
    pub timeout: Option<i64>,
}

/// The hook names of the OCI runtime specification, in the order the runtime reaches them.
pub const HOOK_NAMES: [&str; 6] = [
    "prestart",
    "createRuntime",
    "createContainer",
    "startContainer",
    "poststart",
    "poststop",
];

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct IntelRdt {
    #[serde(default, rename = "closID")]
    pub clos_id: String,
    #[serde(default)]
    pub l3_cache_schema: String,
    #[serde(default)]
    pub mem_bw_schema: String,
    #[serde(default)]
    pub schemata: Option<Vec<String>>,
    #[serde(default)]
    pub enable_monitoring: bool,
    // 0.7.0's monitoring switches, dropped in 1.1.0; still read in older files.
    #[serde(default, rename = "enableCMT")]
    pub enable_cmt: bool,
    #[serde(default, rename = "enableMBM")]
    pub enable_mbm: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NetDevice {
    pub host_interface_name: String,
    pub name: String,
}

/// Why a spec file cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    #[error("{0}")]
    Syntax(String),
    #[error("cdiVersion {version:?} is not one of {known}", known = VERSIONS.join(", "))]
    Version { version: String },
    #[error("cdiVersion {version} is older than {needed}, which its fields need ({why})")]
    TooOld {
        version: String,
        needed: &'static str,
        why: &'static str,
    },
    #[error("kind {kind:?}: {reason}")]
    Kind { kind: String, reason: String },
    #[error("devices: at least one device is required")]
    NoDevices,
    #[error("{field}: {reason}")]
    Field { field: String, reason: String },
    #[error("{0}")]
    Unsafe(String),
}

fn field(field: impl Into<String>, reason: impl Into<String>) -> SpecError {
    SpecError::Field {
        field: field.into(),
        reason: reason.into(),
    }
}

/// Reads a spec file's text: YAML for `.yaml`, JSON otherwise. Errors say the line.
pub fn parse(path: &Path, text: &str) -> Result<Spec, SpecError> {
    let spec: Spec = if path.extension().is_some_and(|e| e == "yaml") {
        serde_saphyr::from_str(text).map_err(|e| SpecError::Syntax(e.to_string()))?
    } else {
        let de = &mut serde_json::Deserializer::from_str(text);
        serde_path_to_error::deserialize(de).map_err(|e| {
            let inner = e.inner();
            SpecError::Syntax(format!(
                "line {} column {}: {}: {}",
                inner.line(),
                inner.column(),
                e.path(),
                inner
            ))
        })?
    };
    validate(&spec)?;
    Ok(spec)
}

/// The spec's vendor and class (`vendor.com/class`).
pub fn kind_parts(kind: &str) -> Option<(&str, &str)> {
    let (vendor, class) = kind.split_once('/')?;
    Some((vendor, class))
}

/// What is wrong with a CDI name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("empty")]
    Empty,
    #[error("{0:?} must start with a letter")]
    Start(String),
    #[error("{0:?} must end with a letter or digit")]
    End(String),
    #[error("{name:?} has {bad:?}")]
    Character { name: String, bad: char },
    #[error("empty device name")]
    DeviceEmpty,
    #[error("device name {0:?} must start and end with a letter or digit")]
    DeviceEnds(String),
    #[error("device name {name:?} has {bad:?}")]
    DeviceCharacter { name: String, bad: char },
    #[error("{0:?} is not a qualified CDI name (vendor.com/class=name)")]
    NotQualified(String),
    /// A part of a qualified name (`vendor `, `class ` or the device name) is wrong.
    #[error("{device:?}: {part}{reason}")]
    Part {
        device: String,
        part: &'static str,
        reason: Box<NameError>,
    },
}

/// Vendor and class: a letter first, a letter or digit last, `_ - .` between.
pub fn check_qualifier(name: &str) -> Result<(), NameError> {
    let b = name.as_bytes();
    if b.is_empty() {
        return Err(NameError::Empty);
    }
    if !b[0].is_ascii_alphabetic() {
        return Err(NameError::Start(name.into()));
    }
    if !b[b.len() - 1].is_ascii_alphanumeric() {
        return Err(NameError::End(name.into()));
    }
    match b
        .iter()
        .find(|c| !(c.is_ascii_alphanumeric() || b"_-.".contains(c)))
    {
        Some(c) => Err(NameError::Character {
            name: name.into(),
            bad: *c as char,
        }),
        None => Ok(()),
    }
}

/// A device name: a letter or digit at both ends, `_ - . :` between.
pub fn check_device_name(name: &str) -> Result<(), NameError> {
    let b = name.as_bytes();
    if b.is_empty() {
        return Err(NameError::DeviceEmpty);
    }
    if !b[0].is_ascii_alphanumeric() || !b[b.len() - 1].is_ascii_alphanumeric() {
        return Err(NameError::DeviceEnds(name.into()));
    }
    match b
        .iter()
        .find(|c| !(c.is_ascii_alphanumeric() || b"_-.:".contains(c)))
    {
        Some(c) => Err(NameError::DeviceCharacter {
            name: name.into(),
            bad: *c as char,
        }),
        None => Ok(()),
    }
}

/// A fully qualified device name, `vendor.com/class=name`, split into kind and name.
pub fn parse_qualified(device: &str) -> Result<(&str, &str), NameError> {
    let not_qualified = || NameError::NotQualified(device.into());
    let (kind, name) = device.split_once('=').ok_or_else(not_qualified)?;
    let (vendor, class) = kind_parts(kind).ok_or_else(not_qualified)?;
    let part = |part: &'static str| {
        move |reason| NameError::Part {
            device: device.into(),
            part,
            reason: Box::new(reason),
        }
    };
    check_qualifier(vendor).map_err(part("vendor "))?;
    check_qualifier(class).map_err(part("class "))?;
    check_device_name(name).map_err(part(""))?;
    Ok((kind, name))
}

fn version_index(v: &str) -> Option<usize> {
    let v = v.strip_prefix('v').unwrap_or(v);
    VERSIONS.iter().position(|k| *k == v)
}

/// The newest version whose fields the spec uses, and which field needs it.
fn needed_version(spec: &Spec) -> (&'static str, &'static str) {
    let edits: Vec<&ContainerEdits> = std::iter::once(&spec.container_edits)
        .chain(spec.devices.iter().map(|d| &d.container_edits))
        .collect();
    let rdt_new = |e: &&ContainerEdits| {
        e.intel_rdt
            .as_ref()
            .is_some_and(|r| r.schemata.is_some() || r.enable_monitoring)
    };
    if edits.iter().any(|e| !e.net_devices.is_empty()) {
        return ("1.1.0", "netDevices");
    }
    if edits.iter().any(rdt_new) {
        return ("1.1.0", "intelRdt.schemata or enableMonitoring");
    }
    if edits.iter().any(|e| e.intel_rdt.is_some()) {
        return ("0.7.0", "intelRdt");
    }
    if edits.iter().any(|e| !e.additional_gids.is_empty()) {
        return ("0.7.0", "additionalGids");
    }
    let class_dot = kind_parts(&spec.kind).is_some_and(|(_, c)| c.contains('.'));
    if !spec.annotations.is_empty() || spec.devices.iter().any(|d| !d.annotations.is_empty()) {
        return ("0.6.0", "annotations");
    }
    if class_dot {
        return ("0.6.0", "a dot in the class name");
    }
    if spec
        .devices
        .iter()
        .any(|d| d.name.starts_with(|c: char| c.is_ascii_digit()))
    {
        return ("0.5.0", "a device name starting with a digit");
    }
    if edits
        .iter()
        .any(|e| e.device_nodes.iter().any(|n| !n.host_path.is_empty()))
    {
        return ("0.5.0", "deviceNodes.hostPath");
    }
    if edits
        .iter()
        .any(|e| e.mounts.iter().any(|m| !m.kind.is_empty()))
    {
        return ("0.4.0", "mounts.type");
    }
    ("0.3.0", "")
}

/// The checks of the CDI specification, with the field each failure is in.
pub fn validate(spec: &Spec) -> Result<(), SpecError> {
    let have = version_index(&spec.cdi_version).ok_or_else(|| SpecError::Version {
        version: spec.cdi_version.clone(),
    })?;
    let (needed, why) = needed_version(spec);
    if version_index(needed).is_some_and(|n| n > have) {
        return Err(SpecError::TooOld {
            version: spec.cdi_version.clone(),
            needed,
            why,
        });
    }
    let kind_err = |reason: String| SpecError::Kind {
        kind: spec.kind.clone(),
        reason,
    };
    let (vendor, class) =
        kind_parts(&spec.kind).ok_or_else(|| kind_err("must be vendor.com/class".into()))?;
    check_qualifier(vendor).map_err(|r| kind_err(format!("vendor {r}")))?;
    check_qualifier(class).map_err(|r| kind_err(format!("class {r}")))?;
    if spec.devices.is_empty() {
        return Err(SpecError::NoDevices);
    }
    check_edits("containerEdits", &spec.container_edits)?;
    let mut seen = std::collections::HashSet::new();
    for (i, d) in spec.devices.iter().enumerate() {
        let at = format!("devices[{i}]");
        check_device_name(&d.name).map_err(|r| field(format!("{at}.name"), r.to_string()))?;
        if !seen.insert(d.name.as_str()) {
            return Err(field(
                format!("{at}.name"),
                format!("device {:?} is defined twice", d.name),
            ));
        }
        check_edits(&format!("{at}.containerEdits"), &d.container_edits)?;
    }
    Ok(())
}

fn check_edits(at: &str, e: &ContainerEdits) -> Result<(), SpecError> {
    for (i, v) in e.env.iter().enumerate() {
        if !v.contains('=') || v.starts_with('=') {
            return Err(field(
                format!("{at}.env[{i}]"),
                format!("{v:?} is not NAME=VALUE"),
            ));
        }
    }
    for (i, n) in e.device_nodes.iter().enumerate() {
        let f = format!("{at}.deviceNodes[{i}]");
        if !n.path.starts_with('/') {
            return Err(field(format!("{f}.path"), "must be an absolute path"));
        }
        if !n.host_path.is_empty() && !n.host_path.starts_with('/') {
            return Err(field(format!("{f}.hostPath"), "must be an absolute path"));
        }
        if !matches!(n.kind.as_str(), "" | "b" | "c" | "u" | "p") {
            return Err(field(
                format!("{f}.type"),
                format!("{:?} is not one of b, c, u, p", n.kind),
            ));
        }
        if n.permissions != "none" && n.permissions.chars().any(|c| !"rwm".contains(c)) {
            return Err(field(
                format!("{f}.permissions"),
                format!("{:?} is not made of r, w, m (or none)", n.permissions),
            ));
        }
    }
    for (i, h) in e.hooks.iter().enumerate() {
        let f = format!("{at}.hooks[{i}]");
        if !HOOK_NAMES.contains(&h.hook_name.as_str()) {
            return Err(field(
                format!("{f}.hookName"),
                format!("{:?} is not one of {}", h.hook_name, HOOK_NAMES.join(", ")),
            ));
        }
        if !h.path.starts_with('/') {
            return Err(field(format!("{f}.path"), "must be an absolute path"));
        }
        if h.timeout.is_some_and(|t| t <= 0) {
            return Err(field(format!("{f}.timeout"), "must be more than 0 seconds"));
        }
        for (j, v) in h.env.iter().enumerate() {
            if !v.contains('=') {
                return Err(field(
                    format!("{f}.env[{j}]"),
                    format!("{v:?} is not NAME=VALUE"),
                ));
            }
        }
    }
    for (i, m) in e.mounts.iter().enumerate() {
        let f = format!("{at}.mounts[{i}]");
        if m.host_path.is_empty() {
            return Err(field(format!("{f}.hostPath"), "is required"));
        }
        if !m.container_path.starts_with('/') {
            return Err(field(
                format!("{f}.containerPath"),
                "must be an absolute path",
            ));
        }
    }
    for (i, n) in e.net_devices.iter().enumerate() {
        let f = format!("{at}.netDevices[{i}]");
        if n.host_interface_name.is_empty() || n.name.is_empty() {
            return Err(field(f, "hostInterfaceName and name are required"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json(text: &str) -> Result<Spec, SpecError> {
        parse(Path::new("x.json"), text)
    }

    #[test]
    fn qualified_names() {
        assert_eq!(
            parse_qualified("vendor.com/gpu=0").unwrap(),
            ("vendor.com/gpu", "0")
        );
        assert_eq!(
            parse_qualified("nvidia.com/gpu=GPU-1:mig").unwrap().1,
            "GPU-1:mig"
        );
        for bad in [
            "gpu0",
            "/dev/gpu0",
            "vendor.com/gpu",
            "vendor.com=gpu",
            "-v.com/gpu=0",
            "v.com/gpu=",
            "v.com/gpu=a/b",
            "v.com/g pu=0",
        ] {
            assert!(parse_qualified(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn versions_and_the_fields_that_need_them() {
        let ok = r#"{"cdiVersion":"0.3.0","kind":"v.com/c","devices":[{"name":"a","containerEdits":{"env":["A=1"]}}]}"#;
        json(ok).unwrap();
        let e = json(&ok.replace("0.3.0", "0.2.0")).unwrap_err();
        assert!(matches!(e, SpecError::Version { .. }), "{e}");
        let gids = r#"{"cdiVersion":"0.6.0","kind":"v.com/c","devices":[{"name":"a","containerEdits":{"additionalGids":[44]}}]}"#;
        let e = json(gids).unwrap_err();
        assert!(e.to_string().contains("additionalGids"), "{e}");
        json(&gids.replace("0.6.0", "0.7.0")).unwrap();
        json(&gids.replace("0.6.0", "v1.1.0")).unwrap();
        let digit = r#"{"cdiVersion":"0.4.0","kind":"v.com/c","devices":[{"name":"0","containerEdits":{}}]}"#;
        assert!(json(digit).unwrap_err().to_string().contains("digit"));
    }

    #[test]
    fn refusals_name_the_field() {
        let base = |edits: &str| {
            format!(
                r#"{{"cdiVersion":"1.1.0","kind":"v.com/c","devices":[{{"name":"a","containerEdits":{edits}}}]}}"#
            )
        };
        let cases = [
            (
                r#"{"env":["NOEQUALS"]}"#,
                "devices[0].containerEdits.env[0]",
            ),
            (
                r#"{"deviceNodes":[{"path":"dev/x"}]}"#,
                "deviceNodes[0].path",
            ),
            (
                r#"{"deviceNodes":[{"path":"/dev/x","permissions":"rx"}]}"#,
                "permissions",
            ),
            (
                r#"{"hooks":[{"hookName":"preStart","path":"/bin/true"}]}"#,
                "hookName",
            ),
            (
                r#"{"hooks":[{"hookName":"poststop","path":"/bin/true","timeout":0}]}"#,
                "timeout",
            ),
            (
                r#"{"mounts":[{"hostPath":"/a","containerPath":"b"}]}"#,
                "containerPath",
            ),
        ];
        for (edits, want) in cases {
            let e = json(&base(edits)).unwrap_err().to_string();
            assert!(e.contains(want), "{edits}: {e}");
        }
        let e = json(&base(r#"{"color":"red"}"#)).unwrap_err().to_string();
        assert!(e.contains("line 1") && e.contains("color"), "{e}");
        let e = json(r#"{"cdiVersion":"1.1.0","kind":"gpu","devices":[{"name":"a"}]}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("kind"), "{e}");
        let e = json(r#"{"cdiVersion":"1.1.0","kind":"v.com/c","devices":[]}"#).unwrap_err();
        assert_eq!(e, SpecError::NoDevices);
        let twice =
            r#"{"cdiVersion":"1.1.0","kind":"v.com/c","devices":[{"name":"a"},{"name":"a"}]}"#;
        assert!(json(twice).unwrap_err().to_string().contains("twice"));
    }

    #[test]
    fn yaml_reads_as_json_does() {
        let yaml = "cdiVersion: 0.5.0\nkind: vendor.com/device\ndevices:\n  - name: myDevice\n    containerEdits:\n      deviceNodes:\n        - path: /dev/vfio/71\n          hostPath: /dev/vfio/71\ncontainerEdits:\n  env:\n    - FOO=VALID_SPEC\n  hooks:\n    - hookName: createContainer\n      path: /bin/echo\n      args: [echo, hi]\n      timeout: 5\n  mounts:\n    - hostPath: /bin/vendorBin\n      containerPath: /bin/vendorBin\n      options: [ro, bind]\n";
        let s = parse(Path::new("v.yaml"), yaml).unwrap();
        assert_eq!(
            s.devices[0].container_edits.device_nodes[0].path,
            "/dev/vfio/71"
        );
        assert_eq!(s.container_edits.hooks[0].timeout, Some(5));
        assert_eq!(s.container_edits.mounts[0].options, ["ro", "bind"]);
        let bad = parse(Path::new("v.yaml"), "cdiVersion: 0.5.0\nkind: [\n");
        assert!(matches!(bad, Err(SpecError::Syntax(_))));
    }
}
