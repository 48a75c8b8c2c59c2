//! What a container is asked to be, in crius's own terms: the container's configuration as
//! kubelet sends it (`cri` converts CRI's messages into these and back). A container's record
//! stores it; the JSON keeps the field names and shapes CRI's messages had there, so records
//! written before these types existed read back as they were. The parts pods share
//! (namespaces, profiles, resources) are `sandbox::config`'s.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::sandbox::config::numbered;
pub use crate::sandbox::config::{
    IdMapping, NamespaceMode, NamespaceOptions, ProfileType, Propagation, Resources,
    SecurityProfile, SelinuxOptions, SupplementalGroupsPolicy, wrapped_i64,
};

numbered!(
    /// Where a container is in its life (CRI's states; `Removed` is crius's own, for the
    /// record a removal has just taken away, as a call that waited for its lock finds it).
    ContainerState {
        Created = 0,
        Running = 1,
        Exited = 2,
        Unknown = 3,
        Removed = -1,
    }
);

impl ContainerState {
    pub fn name(self) -> &'static str {
        match self {
            ContainerState::Created => "created",
            ContainerState::Running => "running",
            ContainerState::Exited => "exited",
            ContainerState::Unknown => "unknown",
            ContainerState::Removed => "removed",
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ContainerMetadata {
    pub name: String,
    pub attempt: u32,
}

/// An image as a container (or an image volume) names it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ImageSpec {
    pub image: String,
    pub annotations: HashMap<String, String>,
    pub user_specified_image: String,
    pub runtime_handler: String,
    /// For an image volume: the digest of the image mounted (what ContainerStatus reports).
    pub image_ref: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct KeyValue {
    pub key: String,
    /// The value as text: for a value that is not UTF-8 (CRI's values are bytes), its lossy
    /// form, with the bytes themselves in `raw`.
    pub value: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub raw: Option<Vec<u8>>,
}

/// A volume: a host path bound into the container.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Mount {
    pub container_path: String,
    pub host_path: String,
    pub readonly: bool,
    pub selinux_relabel: bool,
    pub propagation: Propagation,
    pub uid_mappings: Vec<IdMapping>,
    pub gid_mappings: Vec<IdMapping>,
    pub recursive_read_only: bool,
    /// An image volume: the image's root filesystem mounted read-only (no host path).
    pub image: Option<ImageSpec>,
    /// With `image`: the directory inside the image to mount instead of its root.
    pub image_sub_path: String,
    /// Bind-mount options (KEP-5855): `nosuid`, `nodev`, `noexec` and their recursive forms.
    pub mount_options: Vec<String>,
}

/// A host device given to the container.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Device {
    pub container_path: String,
    pub host_path: String,
    pub permissions: String,
}

/// A device named by CDI (`vendor.com/class=name`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct CdiDevice {
    pub name: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Capabilities {
    pub add_capabilities: Vec<String>,
    pub drop_capabilities: Vec<String>,
    pub add_ambient_capabilities: Vec<String>,
}

/// The container's security context.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ContainerSecurity {
    pub capabilities: Option<Capabilities>,
    pub privileged: bool,
    pub namespace_options: Option<NamespaceOptions>,
    pub selinux_options: Option<SelinuxOptions>,
    #[serde(with = "wrapped_i64")]
    pub run_as_user: Option<i64>,
    #[serde(with = "wrapped_i64")]
    pub run_as_group: Option<i64>,
    pub run_as_username: String,
    pub readonly_rootfs: bool,
    pub supplemental_groups: Vec<i64>,
    pub supplemental_groups_policy: SupplementalGroupsPolicy,
    pub no_new_privs: bool,
    pub masked_paths: Vec<String>,
    pub readonly_paths: Vec<String>,
    pub seccomp: Option<SecurityProfile>,
    pub apparmor: Option<SecurityProfile>,
    pub apparmor_profile: String,
    pub seccomp_profile_path: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ContainerLinux {
    pub resources: Option<Resources>,
    pub security_context: Option<ContainerSecurity>,
}

/// A container's configuration.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ContainerConfig {
    pub metadata: Option<ContainerMetadata>,
    pub image: Option<ImageSpec>,
    pub command: Vec<String>,
    pub args: Vec<String>,
    pub working_dir: String,
    pub envs: Vec<KeyValue>,
    pub mounts: Vec<Mount>,
    pub devices: Vec<Device>,
    pub labels: HashMap<String, String>,
    pub annotations: HashMap<String, String>,
    pub log_path: String,
    pub stdin: bool,
    pub stdin_once: bool,
    pub tty: bool,
    pub linux: Option<ContainerLinux>,
    pub cdi_devices: Vec<CdiDevice>,
    /// The signal StopContainer sends first (`SIGUSR1`, `SIGRTMIN+3`); empty: the image's, else
    /// SIGTERM.
    pub stop_signal: String,
}

impl ContainerConfig {
    /// The security context, if the container has one.
    pub fn security(&self) -> Option<&ContainerSecurity> {
        self.linux
            .as_ref()
            .and_then(|l| l.security_context.as_ref())
    }

    /// The resources asked for, if any.
    pub fn resources(&self) -> Option<&Resources> {
        self.linux.as_ref().and_then(|l| l.resources.as_ref())
    }

    /// The container's name (empty without metadata).
    pub fn name(&self) -> &str {
        self.metadata.as_ref().map_or("", |m| m.name.as_str())
    }
}
