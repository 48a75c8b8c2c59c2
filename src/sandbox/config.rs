//! What a pod is asked to be, in crius's own terms: the pod sandbox's configuration as kubelet
//! sends it, and the parts containers share with pods (namespace modes, ID mappings, SELinux
//! options, security profiles, resources). `cri` converts CRI's messages into these and back;
//! nothing below `cri` sees CRI's generated types. A pod's record stores its configuration: the
//! JSON keeps the field names and shapes CRI's messages had there (enums as numbers, optional
//! integers as `{"value": N}`), so records written before these types existed read back as
//! they were.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

/// An enum number that names no value (from a record or a request).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown value {0}")]
pub struct UnknownValue(pub i32);

/// An enum kept as its CRI number in records.
macro_rules! numbered {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $variant:ident = $n:literal),+ $(,)? }) => {
        $(#[$m])*
        #[derive(
            Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
        )]
        #[serde(try_from = "i32", into = "i32")]
        pub enum $name {
            #[default]
            $($(#[$vm])* $variant),+
        }

        impl TryFrom<i32> for $name {
            type Error = $crate::sandbox::config::UnknownValue;
            fn try_from(n: i32) -> Result<Self, $crate::sandbox::config::UnknownValue> {
                match n {
                    $($n => Ok($name::$variant),)+
                    other => Err($crate::sandbox::config::UnknownValue(other)),
                }
            }
        }

        impl From<$name> for i32 {
            fn from(v: $name) -> i32 {
                match v {
                    $($name::$variant => $n,)+
                }
            }
        }
    };
}
pub(crate) use numbered;

numbered!(
    /// Whose namespace a pod or container uses.
    NamespaceMode {
        /// The pod's (the default).
        Pod = 0,
        /// The container's own.
        Container = 1,
        /// The node's.
        Node = 2,
        /// Another container's (`target_id`).
        Target = 3,
    }
);

numbered!(
    /// A port mapping's protocol.
    Protocol {
        Tcp = 0,
        Udp = 1,
        Sctp = 2,
    }
);

numbered!(
    /// Which security profile (seccomp or AppArmor) is asked for.
    ProfileType {
        RuntimeDefault = 0,
        Unconfined = 1,
        Localhost = 2,
    }
);

numbered!(
    /// The propagation of a volume's mounts.
    Propagation {
        /// No propagation either way (`rprivate`).
        Private = 0,
        /// Mounts made on the host reach the container (`rslave`).
        HostToContainer = 1,
        /// Both ways (`rshared`).
        Bidirectional = 2,
    }
);

numbered!(
    /// How supplemental groups from the image combine with the ones asked for.
    SupplementalGroupsPolicy {
        Merge = 0,
        Strict = 1,
    }
);

impl NamespaceMode {
    /// The mode as CRI spells it.
    pub fn name(self) -> &'static str {
        match self {
            NamespaceMode::Pod => "POD",
            NamespaceMode::Container => "CONTAINER",
            NamespaceMode::Node => "NODE",
            NamespaceMode::Target => "TARGET",
        }
    }
}

/// Optional integers as CRI wraps them (`{"value": N}`), in records.
pub mod wrapped_i64 {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    #[derive(Serialize, Deserialize)]
    struct Value {
        #[serde(default)]
        value: i64,
    }

    pub fn serialize<S: Serializer>(v: &Option<i64>, s: S) -> Result<S::Ok, S::Error> {
        v.map(|value| Value { value }).serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
        Ok(Option::<Value>::deserialize(d)?.map(|v| v.value))
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PodMetadata {
    pub name: String,
    pub uid: String,
    pub namespace: String,
    pub attempt: u32,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Dns {
    pub servers: Vec<String>,
    pub searches: Vec<String>,
    pub options: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PortMapping {
    pub protocol: Protocol,
    pub container_port: i32,
    pub host_port: i32,
    pub host_ip: String,
}

/// A range of user or group IDs mapped into a user namespace.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct IdMapping {
    pub host_id: u32,
    pub container_id: u32,
    pub length: u32,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct UserNamespace {
    pub mode: NamespaceMode,
    pub uids: Vec<IdMapping>,
    pub gids: Vec<IdMapping>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct NamespaceOptions {
    pub network: NamespaceMode,
    pub pid: NamespaceMode,
    pub ipc: NamespaceMode,
    pub target_id: String,
    pub userns_options: Option<UserNamespace>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct SelinuxOptions {
    pub user: String,
    pub role: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub level: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SecurityProfile {
    pub profile_type: ProfileType,
    pub localhost_ref: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct HugepageLimit {
    pub page_size: String,
    pub limit: u64,
}

/// Linux resources of a container, or of a whole pod (its overhead and its total).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Resources {
    pub cpu_period: i64,
    pub cpu_quota: i64,
    pub cpu_shares: i64,
    pub memory_limit_in_bytes: i64,
    pub oom_score_adj: i64,
    pub cpuset_cpus: String,
    pub cpuset_mems: String,
    pub hugepage_limits: Vec<HugepageLimit>,
    pub unified: HashMap<String, String>,
    pub memory_swap_limit_in_bytes: i64,
}

/// The pod's security context.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PodSecurity {
    pub namespace_options: Option<NamespaceOptions>,
    pub selinux_options: Option<SelinuxOptions>,
    #[serde(with = "wrapped_i64")]
    pub run_as_user: Option<i64>,
    #[serde(with = "wrapped_i64")]
    pub run_as_group: Option<i64>,
    pub readonly_rootfs: bool,
    pub supplemental_groups: Vec<i64>,
    pub supplemental_groups_policy: SupplementalGroupsPolicy,
    pub privileged: bool,
    pub seccomp: Option<SecurityProfile>,
    pub apparmor: Option<SecurityProfile>,
    pub seccomp_profile_path: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PodLinux {
    pub cgroup_parent: String,
    pub security_context: Option<PodSecurity>,
    pub sysctls: HashMap<String, String>,
    pub overhead: Option<Resources>,
    pub resources: Option<Resources>,
}

/// A pod sandbox's configuration.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PodConfig {
    pub metadata: Option<PodMetadata>,
    pub hostname: String,
    pub log_directory: String,
    pub dns_config: Option<Dns>,
    pub port_mappings: Vec<PortMapping>,
    pub labels: HashMap<String, String>,
    pub annotations: HashMap<String, String>,
    pub linux: Option<PodLinux>,
}

impl PodConfig {
    /// The pod's security context, if it has one.
    pub fn security(&self) -> Option<&PodSecurity> {
        self.linux
            .as_ref()
            .and_then(|l| l.security_context.as_ref())
    }

    /// The pod's namespace options, if it has them.
    pub fn namespaces(&self) -> Option<&NamespaceOptions> {
        self.security().and_then(|s| s.namespace_options.as_ref())
    }
}
