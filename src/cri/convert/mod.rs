//! CRI's messages into crius's own types and back: requests are converted here, at the edge,
//! before any work starts (an enum number that names nothing is refused by field), and answers
//! are made here from what the services below return. Nothing below `cri` sees a generated
//! CRI type.

mod container;
mod pod;
mod stats;

pub use container::*;
pub use pod::*;
pub use stats::*;

use tonic::Status;

use crate::sandbox::config::UnknownValue;

/// An enum given as a number, read as crius's type, or refused naming `field`.
fn num<T: TryFrom<i32, Error = UnknownValue>>(n: i32, field: &str) -> Result<T, Status> {
    T::try_from(n).map_err(|e| Status::invalid_argument(format!("{field}: {e}")))
}

/// Each item of a list converted, the field naming its index.
fn each<A, B>(
    items: Vec<A>,
    field: &str,
    f: impl Fn(A, &str) -> Result<B, Status>,
) -> Result<Vec<B>, Status> {
    items
        .into_iter()
        .enumerate()
        .map(|(i, a)| f(a, &format!("{field}[{i}]")))
        .collect()
}

#[cfg(test)]
mod tests {
    use crate::cri::v1 as cri;

    use super::*;
    use crate::container::config::ContainerConfig;
    use crate::sandbox::config::PodConfig;

    fn pod() -> cri::PodSandboxConfig {
        cri::PodSandboxConfig {
            metadata: Some(cri::PodSandboxMetadata {
                name: "web".into(),
                uid: "u".into(),
                namespace: "ns".into(),
                attempt: 2,
            }),
            hostname: "web".into(),
            log_directory: "/var/log/pods/x".into(),
            dns_config: Some(cri::DnsConfig {
                servers: vec!["10.0.0.10".into()],
                searches: vec!["svc".into()],
                options: vec!["ndots:5".into()],
            }),
            port_mappings: vec![cri::PortMapping {
                protocol: cri::Protocol::Udp as i32,
                container_port: 53,
                host_port: 5353,
                host_ip: "127.0.0.1".into(),
            }],
            labels: [("app".to_string(), "web".to_string())].into(),
            annotations: [("a".to_string(), "b".to_string())].into(),
            linux: Some(cri::LinuxPodSandboxConfig {
                cgroup_parent: "/kubepods".into(),
                security_context: Some(cri::LinuxSandboxSecurityContext {
                    namespace_options: Some(cri::NamespaceOption {
                        network: cri::NamespaceMode::Node as i32,
                        pid: cri::NamespaceMode::Container as i32,
                        ipc: cri::NamespaceMode::Pod as i32,
                        target_id: String::new(),
                        userns_options: Some(cri::UserNamespace {
                            mode: cri::NamespaceMode::Pod as i32,
                            uids: vec![cri::IdMapping {
                                host_id: 100000,
                                container_id: 0,
                                length: 65536,
                            }],
                            gids: vec![],
                        }),
                    }),
                    selinux_options: Some(cri::SeLinuxOption {
                        r#type: "container_t".into(),
                        level: "s0:c1,c2".into(),
                        ..Default::default()
                    }),
                    run_as_user: Some(cri::Int64Value { value: 1000 }),
                    run_as_group: None,
                    supplemental_groups: vec![5, 6],
                    supplemental_groups_policy: cri::SupplementalGroupsPolicy::Strict as i32,
                    seccomp: Some(cri::SecurityProfile {
                        profile_type: cri::security_profile::ProfileType::Localhost as i32,
                        localhost_ref: "/p.json".into(),
                    }),
                    ..Default::default()
                }),
                sysctls: [("net.ipv4.ip_forward".to_string(), "1".to_string())].into(),
                overhead: None,
                resources: Some(cri::LinuxContainerResources {
                    cpu_quota: 50000,
                    hugepage_limits: vec![cri::HugepageLimit {
                        page_size: "2MB".into(),
                        limit: 4,
                    }],
                    unified: [("memory.high".to_string(), "1G".to_string())].into(),
                    ..Default::default()
                }),
            }),
            windows: None,
        }
    }

    fn container() -> cri::ContainerConfig {
        cri::ContainerConfig {
            metadata: Some(cri::ContainerMetadata {
                name: "c".into(),
                attempt: 1,
            }),
            image: Some(cri::ImageSpec {
                image: "busybox".into(),
                ..Default::default()
            }),
            command: vec!["sh".into()],
            args: vec!["-c".into(), "true".into()],
            working_dir: "/w".into(),
            envs: vec![cri::KeyValue {
                key: "A".into(),
                value: b"1".to_vec(),
            }],
            mounts: vec![cri::Mount {
                container_path: "/data".into(),
                host_path: "/srv".into(),
                readonly: true,
                propagation: cri::MountPropagation::PropagationHostToContainer as i32,
                uid_mappings: vec![cri::IdMapping {
                    host_id: 1,
                    container_id: 2,
                    length: 3,
                }],
                ..Default::default()
            }],
            devices: vec![cri::Device {
                container_path: "/dev/fuse".into(),
                host_path: "/dev/fuse".into(),
                permissions: "rw".into(),
            }],
            log_path: "c.log".into(),
            stdin: true,
            tty: true,
            linux: Some(cri::LinuxContainerConfig {
                resources: Some(cri::LinuxContainerResources {
                    memory_limit_in_bytes: 1 << 30,
                    oom_score_adj: 500,
                    ..Default::default()
                }),
                security_context: Some(cri::LinuxContainerSecurityContext {
                    capabilities: Some(cri::Capability {
                        add_capabilities: vec!["NET_ADMIN".into()],
                        ..Default::default()
                    }),
                    run_as_user: Some(cri::Int64Value { value: 0 }),
                    masked_paths: vec!["/proc/kcore".into()],
                    apparmor: Some(cri::SecurityProfile {
                        profile_type: cri::security_profile::ProfileType::Unconfined as i32,
                        localhost_ref: String::new(),
                    }),
                    ..Default::default()
                }),
            }),
            cdi_devices: vec![cri::CdiDevice {
                name: "vendor.com/gpu=0".into(),
            }],
            ..Default::default()
        }
    }

    /// A record of a crius from before these types: CRI v1.31's messages as JSON (k8s-cri's
    /// serde), with string env values and none of the fields CRI gained since.
    fn as_old_record(mut v: serde_json::Value) -> serde_json::Value {
        fn walk(v: &mut serde_json::Value) {
            match v {
                serde_json::Value::Object(m) => {
                    for gone in [
                        "image_ref",
                        "image_sub_path",
                        "mount_options",
                        "stop_signal",
                        "windows",
                    ] {
                        m.remove(gone);
                    }
                    let env = m.get("key").is_some_and(|k| k.is_string());
                    if env
                        && let Some(value) = m.get_mut("value")
                        && let serde_json::Value::Array(bytes) = value
                    {
                        let b: Vec<u8> = bytes.iter().map(|x| x.as_u64().unwrap() as u8).collect();
                        *value = serde_json::Value::String(String::from_utf8(b).unwrap());
                    }
                    m.values_mut().for_each(walk);
                }
                serde_json::Value::Array(a) => a.iter_mut().for_each(walk),
                _ => {}
            }
        }
        walk(&mut v);
        v
    }

    /// Records written before crius had its own types hold CRI's messages as JSON: they read
    /// back as the same configuration the conversion makes, and what is written now reads back
    /// the same again.
    #[test]
    fn records_keep_the_json_of_cri_messages() {
        let old = as_old_record(serde_json::to_value(pod()).unwrap());
        let read: PodConfig = serde_json::from_value(old.clone()).unwrap();
        assert_eq!(read, pod_config(pod(), "config").unwrap());
        let again = serde_json::to_value(&read).unwrap();
        assert_eq!(as_old_record(again.clone()), old);
        assert_eq!(serde_json::from_value::<PodConfig>(again).unwrap(), read);

        let old = as_old_record(serde_json::to_value(container()).unwrap());
        let read: ContainerConfig = serde_json::from_value(old.clone()).unwrap();
        assert_eq!(read, container_config(container()).unwrap());
        let again = serde_json::to_value(&read).unwrap();
        assert_eq!(as_old_record(again.clone()), old);
        assert_eq!(
            serde_json::from_value::<ContainerConfig>(again).unwrap(),
            read
        );
    }

    #[test]
    fn unknown_enum_numbers_are_refused_by_field() {
        let mut c = container();
        c.mounts[0].propagation = 7;
        let e = container_config(c).unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert!(
            e.message().contains("config.mounts[0].propagation"),
            "{}",
            e.message()
        );
        let mut p = pod();
        p.port_mappings[0].protocol = 9;
        let e = pod_config(p, "config").unwrap_err();
        assert!(
            e.message().contains("config.port_mappings[0].protocol"),
            "{}",
            e.message()
        );
    }
}
