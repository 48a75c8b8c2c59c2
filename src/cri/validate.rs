//! The limits every request meets before any work starts: sizes, ranges, NUL bytes and line
//! breaks, checked on crius's own types right after conversion. A refusal is InvalidArgument
//! naming the field and quoting at most [`QUOTE`] bytes of what was sent. README's Reliability
//! section lists the limits; the deeper checks (paths inside the image, profiles, what the
//! kernel accepts) stay with the services that know them.

use std::net::IpAddr;

use tonic::Status;

use crate::container::config::{ContainerConfig, Mount};
use crate::sandbox::config::PodConfig;

/// Most bytes of a refused value quoted back.
pub const QUOTE: usize = 200;
/// Longest name, namespace, UID or image reference.
pub const NAME_MAX: usize = 253;
/// Longest path (the kernel's PATH_MAX, less its NUL).
pub const PATH_MAX: usize = 4095;
/// Longest single argument or `KEY=value` (the kernel's MAX_ARG_STRLEN, less its NUL).
pub const ARG_MAX: usize = 128 * 1024 - 1;
/// Most bytes of arguments and environment together.
pub const EXEC_TOTAL_MAX: usize = 1024 * 1024;
/// Most supplemental groups (the kernel's NGROUPS_MAX).
pub const GROUPS_MAX: usize = 65_536;
/// Longest host name (the kernel's).
pub const HOSTNAME_MAX: usize = 64;

fn refuse(field: &str, reason: impl std::fmt::Display) -> Status {
    Status::invalid_argument(format!("{field}: {reason}"))
}

/// At most [`QUOTE`] bytes of `s`, cut at a character, with how much more there was.
pub fn quoted(s: &str) -> String {
    if s.len() <= QUOTE {
        return format!("{s:?}");
    }
    let mut end = QUOTE;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{:?}… ({} bytes)", &s[..end], s.len())
}

/// No NUL anywhere, no line break where `one_line`, at most `max` bytes.
fn text(field: &str, s: &str, max: usize, one_line: bool) -> Result<(), Status> {
    if s.len() > max {
        return Err(refuse(
            field,
            format!("{} bytes, more than {max}: {}", s.len(), quoted(s)),
        ));
    }
    if s.contains('\0') {
        return Err(refuse(field, format!("holds a NUL byte: {}", quoted(s))));
    }
    if one_line && (s.contains('\n') || s.contains('\r')) {
        return Err(refuse(field, format!("holds a line break: {}", quoted(s))));
    }
    Ok(())
}

fn path(field: &str, s: &str) -> Result<(), Status> {
    text(field, s, PATH_MAX, true)
}

/// A path's components as the kernel reads them (`.` and empty ones dropped).
fn components(s: &str) -> Vec<&str> {
    s.split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .collect()
}

fn port(field: &str, p: i32) -> Result<(), Status> {
    if !(0..=65_535).contains(&p) {
        return Err(refuse(field, format!("{p} is not a port (0 to 65535)")));
    }
    Ok(())
}

fn id(field: &str, v: i64) -> Result<(), Status> {
    if !(0..=i64::from(u32::MAX - 1)).contains(&v) {
        return Err(refuse(field, format!("{v} is not a user or group ID")));
    }
    Ok(())
}

fn groups(field: &str, g: &[i64]) -> Result<(), Status> {
    if g.len() > GROUPS_MAX {
        return Err(refuse(
            field,
            format!("{} groups, more than the kernel's {GROUPS_MAX}", g.len()),
        ));
    }
    g.iter()
        .enumerate()
        .try_for_each(|(i, v)| id(&format!("{field}[{i}]"), *v))
}

/// A command line (a container's command and args, or an exec's) and environment.
fn exec_strings<'a>(
    args: impl Iterator<Item = (String, &'a String)>,
    env: usize,
) -> Result<(), Status> {
    let mut total = env;
    for (field, a) in args {
        text(&field, a, ARG_MAX, false)?;
        total += a.len() + 1;
    }
    if total > EXEC_TOTAL_MAX {
        return Err(refuse(
            "cmd",
            format!("arguments and environment take {total} bytes, more than {EXEC_TOTAL_MAX}"),
        ));
    }
    Ok(())
}

/// An exec's command (ExecSync, Exec).
pub fn exec(cmd: &[String]) -> Result<(), Status> {
    match cmd.first() {
        None => return Err(refuse("cmd", "is required")),
        Some(c) if c.is_empty() => return Err(refuse("cmd[0]", "is empty")),
        Some(_) => {}
    }
    exec_strings(
        cmd.iter()
            .enumerate()
            .map(|(i, a)| (format!("cmd[{i}]"), a)),
        0,
    )
}

fn mount(field: &str, m: &Mount) -> Result<(), Status> {
    let at = format!("{field}.container_path");
    path(&at, &m.container_path)?;
    if m.container_path.is_empty() {
        return Err(refuse(&at, "is required"));
    }
    if components(&m.container_path).is_empty() {
        return Err(refuse(&at, "a mount over the container's root"));
    }
    path(&format!("{field}.host_path"), &m.host_path)?;
    path(&format!("{field}.image_sub_path"), &m.image_sub_path)?;
    if let Some(i) = &m.image {
        text(&format!("{field}.image.image"), &i.image, PATH_MAX, true)?;
    }
    Ok(())
}

/// CreateContainer's config.
pub fn container(c: &ContainerConfig) -> Result<(), Status> {
    if let Some(m) = &c.metadata {
        text("config.metadata.name", &m.name, NAME_MAX, true)?;
    }
    if let Some(i) = &c.image {
        text("config.image.image", &i.image, PATH_MAX, true)?;
    }
    match c.command.first().or(c.args.first()) {
        Some(first) if first.is_empty() => {
            let field = if c.command.is_empty() {
                "config.args[0]"
            } else {
                "config.command[0]"
            };
            return Err(refuse(field, "is empty"));
        }
        _ => {}
    }
    let mut env = 0;
    for (i, kv) in c.envs.iter().enumerate() {
        let field = format!("config.envs[{i}]");
        if kv.key.is_empty() {
            return Err(refuse(&format!("{field}.key"), "is empty"));
        }
        if kv.key.contains('=') {
            return Err(refuse(
                &format!("{field}.key"),
                format!("holds '=': {}", quoted(&kv.key)),
            ));
        }
        text(&format!("{field}.key"), &kv.key, ARG_MAX, false)?;
        text(&format!("{field}.value"), &kv.value, ARG_MAX, false)?;
        let entry = kv.key.len() + 1 + kv.value.len();
        if entry > ARG_MAX {
            return Err(refuse(
                &field,
                format!("{entry} bytes as KEY=value, more than {ARG_MAX}"),
            ));
        }
        env += entry + 1;
    }
    exec_strings(
        c.command
            .iter()
            .enumerate()
            .map(|(i, a)| (format!("config.command[{i}]"), a))
            .chain(
                c.args
                    .iter()
                    .enumerate()
                    .map(|(i, a)| (format!("config.args[{i}]"), a)),
            ),
        env,
    )?;
    path("config.working_dir", &c.working_dir)?;
    path("config.log_path", &c.log_path)?;
    if !c.log_path.is_empty() && components(&c.log_path).is_empty() {
        return Err(refuse(
            "config.log_path",
            format!("names no file: {}", quoted(&c.log_path)),
        ));
    }
    for (i, m) in c.mounts.iter().enumerate() {
        mount(&format!("config.mounts[{i}]"), m)?;
    }
    // CDI names are checked here for their form; whether a spec provides them is the
    // container's business, at creation.
    for (i, d) in c.cdi_devices.iter().enumerate() {
        crate::cdi::spec::parse_qualified(&d.name)
            .map_err(|r| refuse(&format!("config.cdi_devices[{i}].name"), r))?;
    }
    let mut cdi_keys: Vec<&String> = c
        .annotations
        .keys()
        .filter(|k| k.starts_with(CDI_ANNOTATION))
        .collect();
    cdi_keys.sort();
    for k in cdi_keys {
        let field = format!("config.annotations[{}]", quoted(k));
        for name in c.annotations[k].split(',') {
            crate::cdi::spec::parse_qualified(name).map_err(|r| refuse(&field, r))?;
        }
    }
    for (i, d) in c.devices.iter().enumerate() {
        path(
            &format!("config.devices[{i}].container_path"),
            &d.container_path,
        )?;
        path(&format!("config.devices[{i}].host_path"), &d.host_path)?;
    }
    if let Some(l) = &c.linux {
        if let Some(r) = &l.resources
            && !(-1000..=1000).contains(&r.oom_score_adj)
        {
            return Err(refuse(
                "config.linux.resources.oom_score_adj",
                format!("{} is outside -1000..=1000", r.oom_score_adj),
            ));
        }
        if let Some(s) = &l.security_context {
            let f = "config.linux.security_context";
            if let Some(u) = s.run_as_user {
                id(&format!("{f}.run_as_user"), u)?;
            }
            if let Some(g) = s.run_as_group {
                id(&format!("{f}.run_as_group"), g)?;
            }
            text(
                &format!("{f}.run_as_username"),
                &s.run_as_username,
                NAME_MAX,
                true,
            )?;
            groups(&format!("{f}.supplemental_groups"), &s.supplemental_groups)?;
            for (i, p) in s.masked_paths.iter().enumerate() {
                path(&format!("{f}.masked_paths[{i}]"), p)?;
            }
            for (i, p) in s.readonly_paths.iter().enumerate() {
                path(&format!("{f}.readonly_paths[{i}]"), p)?;
            }
        }
    }
    Ok(())
}

/// UpdateRuntimeConfig's pod CIDR: one or two (dual-stack) networks, comma-separated, as
/// kubelet sends them; anything else would surface only later, as every pod's network failing.
pub fn pod_cidr(s: &str) -> Result<(), Status> {
    let field = "runtime_config.network_config.pod_cidr";
    text(field, s, NAME_MAX, true)?;
    for cidr in s.split(',').map(str::trim) {
        let ok = cidr.split_once('/').is_some_and(|(addr, len)| {
            let max = match addr.parse::<IpAddr>() {
                Ok(IpAddr::V4(_)) => 32,
                Ok(IpAddr::V6(_)) => 128,
                Err(_) => return false,
            };
            len.parse::<u8>().is_ok_and(|l| l <= max)
        });
        if !ok {
            return Err(refuse(
                field,
                format!("{} is not a network (address/prefix)", quoted(cidr)),
            ));
        }
    }
    Ok(())
}

/// The annotations that ask for CDI devices.
const CDI_ANNOTATION: &str = "cdi.k8s.io/";

/// Directories of the host crius must never write a log below.
const NO_LOGS_UNDER: &[&str] = &["proc", "sys", "dev"];

/// RunPodSandbox's runtime handler: a RuntimeClass handler is a DNS label; anything longer
/// than a subdomain is refused before it is looked up (and quoted short).
pub fn runtime_handler(h: &str) -> Result<(), Status> {
    text("runtime_handler", h, NAME_MAX, true)
}

/// A call's runtime-specific options (CheckpointPod's, RestorePod's): crius defines none, and
/// the CRI has a runtime refuse what it does not support rather than ignore it. The first key
/// in order is named, so one request is always refused alike.
pub fn options(
    field: &str,
    options: &std::collections::HashMap<String, String>,
) -> Result<(), Status> {
    let Some(key) = options.keys().min() else {
        return Ok(());
    };
    // Named as sent when it is plain and short; quoted (and cut) otherwise.
    let plain = key.len() <= 64 && key.bytes().all(|b| b.is_ascii_graphic() && b != b']');
    let name = if plain { key.clone() } else { quoted(key) };
    Err(refuse(
        &format!("{field}[{name}]"),
        "is not an option crius supports (it defines none)",
    ))
}

/// A path a call names on the node (CheckpointPod's `output_path`, RestorePod's
/// `checkpoint_path`): required, absolute, within the limits.
pub fn node_path(field: &str, p: &str) -> Result<(), Status> {
    if p.is_empty() {
        return Err(refuse(field, "is required"));
    }
    path(field, p)?;
    if !p.starts_with('/') {
        return Err(refuse(
            field,
            format!("{} is not an absolute path", quoted(p)),
        ));
    }
    Ok(())
}

/// RunPodSandbox's config (or CreateContainer's `sandbox_config`) under `field`.
pub fn pod(c: &PodConfig, field: &str) -> Result<(), Status> {
    if let Some(m) = &c.metadata {
        for (name, v) in [
            ("name", &m.name),
            ("uid", &m.uid),
            ("namespace", &m.namespace),
        ] {
            let f = format!("{field}.metadata.{name}");
            text(&f, v, NAME_MAX, true)?;
            // They go into the network plugins' CNI_ARGS, whose pairs `;` and `=` separate: a
            // name holding them could set another key (`IP=`, `K8S_POD_NAMESPACE=`).
            if v.contains([';', '=']) {
                return Err(refuse(&f, format!("holds `;` or `=`: {}", quoted(v))));
            }
        }
    }
    let host = format!("{field}.hostname");
    text(&host, &c.hostname, HOSTNAME_MAX, true)?;
    if c.hostname.contains(char::is_whitespace) {
        return Err(refuse(
            &host,
            format!("holds white space: {}", quoted(&c.hostname)),
        ));
    }
    let logs = format!("{field}.log_directory");
    path(&logs, &c.log_directory)?;
    // A `..` would step past the check below (`/var/../proc/sys/kernel`).
    if components(&c.log_directory).contains(&"..") {
        return Err(refuse(
            &logs,
            format!("holds a `..` component: {}", quoted(&c.log_directory)),
        ));
    }
    if c.log_directory.starts_with('/')
        && components(&c.log_directory)
            .first()
            .is_some_and(|top| NO_LOGS_UNDER.contains(top))
    {
        return Err(refuse(
            &logs,
            format!(
                "logs are not written under /proc, /sys or /dev: {}",
                quoted(&c.log_directory)
            ),
        ));
    }
    if let Some(d) = &c.dns_config {
        for (i, s) in d.servers.iter().enumerate() {
            let f = format!("{field}.dns_config.servers[{i}]");
            text(&f, s, NAME_MAX, true)?;
            if s.parse::<IpAddr>().is_err() {
                return Err(refuse(&f, format!("not an IP address: {}", quoted(s))));
            }
        }
        for (name, list) in [("searches", &d.searches), ("options", &d.options)] {
            for (i, s) in list.iter().enumerate() {
                let f = format!("{field}.dns_config.{name}[{i}]");
                text(&f, s, NAME_MAX, true)?;
                if s.is_empty() || s.contains(char::is_whitespace) {
                    return Err(refuse(
                        &f,
                        format!("empty or holds white space: {}", quoted(s)),
                    ));
                }
            }
        }
    }
    for (i, p) in c.port_mappings.iter().enumerate() {
        let f = format!("{field}.port_mappings[{i}]");
        port(&format!("{f}.container_port"), p.container_port)?;
        port(&format!("{f}.host_port"), p.host_port)?;
        text(&format!("{f}.host_ip"), &p.host_ip, NAME_MAX, true)?;
    }
    if let Some(l) = &c.linux {
        path(&format!("{field}.linux.cgroup_parent"), &l.cgroup_parent)?;
        for (k, v) in &l.sysctls {
            let f = format!("{field}.linux.sysctls[{}]", quoted(k));
            text(&f, k, NAME_MAX, true)?;
            text(&f, v, PATH_MAX, true)?;
        }
        if let Some(s) = &l.security_context {
            let f = format!("{field}.linux.security_context");
            if let Some(u) = s.run_as_user {
                id(&format!("{f}.run_as_user"), u)?;
            }
            if let Some(g) = s.run_as_group {
                id(&format!("{f}.run_as_group"), g)?;
            }
            groups(&format!("{f}.supplemental_groups"), &s.supplemental_groups)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::container::config::{ContainerLinux, ContainerSecurity, KeyValue};
    use crate::sandbox::config::{Dns, PodLinux, PortMapping, Resources};

    fn message(r: Result<(), Status>) -> String {
        let s = r.expect_err("refused");
        assert_eq!(s.code(), tonic::Code::InvalidArgument);
        s.message().to_string()
    }

    #[test]
    fn long_runtime_handlers_are_quoted_short() {
        let e = runtime_handler(&"h".repeat(1 << 20)).unwrap_err();
        assert!(
            e.message().starts_with("runtime_handler: "),
            "{}",
            e.message()
        );
        assert!(e.message().len() < 400, "{} bytes", e.message().len());
        assert!(runtime_handler("runc").is_ok());
        assert!(runtime_handler("").is_ok());
    }

    #[test]
    fn quotes_are_short() {
        let big = "x".repeat(1 << 20);
        let q = quoted(&big);
        assert!(q.len() < QUOTE + 40, "{}", q.len());
        assert!(q.ends_with("(1048576 bytes)"));
        // Cut at a character, never inside one.
        assert!(quoted(&"é".repeat(300)).contains('é'));
    }

    #[test]
    fn containers() {
        let ok = ContainerConfig {
            command: vec!["sh".into()],
            envs: vec![KeyValue {
                key: "A".into(),
                value: "b".into(),
                raw: None,
            }],
            ..Default::default()
        };
        container(&ok).unwrap();
        let refused = |f: &dyn Fn(&mut ContainerConfig), want: &str| {
            let mut c = ok.clone();
            f(&mut c);
            let m = message(container(&c));
            assert!(m.starts_with(want), "{m:?} should start with {want:?}");
            assert!(m.len() < 400, "{m}");
        };
        refused(&|c| c.command = vec![String::new()], "config.command[0]");
        refused(&|c| c.args = vec!["a\0b".into()], "config.args[0]");
        refused(&|c| c.args = vec!["x".repeat(1 << 20)], "config.args[0]");
        refused(&|c| c.envs[0].key = String::new(), "config.envs[0].key");
        refused(&|c| c.envs[0].key = "A=B".into(), "config.envs[0].key");
        refused(&|c| c.envs[0].value = "v\0".into(), "config.envs[0].value");
        refused(
            &|c| c.args = vec!["x".repeat(100_000); 11],
            "cmd: arguments and environment",
        );
        refused(&|c| c.log_path = ".".into(), "config.log_path");
        refused(
            &|c| {
                c.cdi_devices = vec![crate::container::config::CdiDevice {
                    name: "gpu0".into(),
                }]
            },
            "config.cdi_devices[0].name",
        );
        refused(
            &|c| {
                c.annotations = [("cdi.k8s.io/gpu".into(), "vendor.com/gpu=0,gpu1".into())].into();
            },
            "config.annotations",
        );
        refused(&|c| c.log_path = "a\0".into(), "config.log_path");
        refused(
            &|c| {
                c.mounts = vec![Mount {
                    container_path: "/".into(),
                    ..Default::default()
                }]
            },
            "config.mounts[0].container_path",
        );
        refused(
            &|c| {
                c.mounts = vec![Mount {
                    container_path: "//./".into(),
                    ..Default::default()
                }]
            },
            "config.mounts[0].container_path",
        );
        refused(
            &|c| {
                c.linux = Some(ContainerLinux {
                    resources: Some(Resources {
                        oom_score_adj: 1001,
                        ..Default::default()
                    }),
                    ..Default::default()
                })
            },
            "config.linux.resources.oom_score_adj",
        );
        refused(
            &|c| {
                c.linux = Some(ContainerLinux {
                    security_context: Some(ContainerSecurity {
                        supplemental_groups: vec![1; 100_000],
                        ..Default::default()
                    }),
                    ..Default::default()
                })
            },
            "config.linux.security_context.supplemental_groups",
        );
    }

    #[test]
    fn pods() {
        let ok = PodConfig {
            hostname: "web".into(),
            log_directory: "/var/log/pods/x".into(),
            dns_config: Some(Dns {
                servers: vec!["10.0.0.10".into(), "fd00::a".into()],
                searches: vec!["svc.cluster.local".into()],
                options: vec!["ndots:5".into()],
            }),
            port_mappings: vec![PortMapping {
                container_port: 80,
                host_port: 8080,
                ..Default::default()
            }],
            ..Default::default()
        };
        pod(&ok, "config").unwrap();
        let refused = |f: &dyn Fn(&mut PodConfig), want: &str| {
            let mut c = ok.clone();
            f(&mut c);
            let m = message(pod(&c, "config"));
            assert!(m.starts_with(want), "{m:?} should start with {want:?}");
        };
        refused(&|c| c.hostname = "a\nb".into(), "config.hostname");
        refused(&|c| c.hostname = "x".repeat(65), "config.hostname");
        // Under /proc, /sys or /dev, too long, or past the check of its first component by
        // `..` (to /proc/sys/kernel/core_pattern's directory).
        for dir in [
            "/proc/self".to_string(),
            "/dev/null".into(),
            "//sys/x".into(),
            format!("/{}", "d".repeat(5000)),
            "/var/../proc/sys/kernel".into(),
            "/var/log/pods/../../../dev".into(),
        ] {
            refused(&|c| c.log_directory = dir.clone(), "config.log_directory");
        }
        // CNI_ARGS' separators: another key for the plugins.
        let meta = |name: &str, uid: &str, namespace: &str| {
            let (name, uid, namespace) = (name.to_string(), uid.to_string(), namespace.to_string());
            move |c: &mut PodConfig| {
                c.metadata = Some(crate::sandbox::config::PodMetadata {
                    name: name.clone(),
                    uid: uid.clone(),
                    namespace: namespace.clone(),
                    attempt: 0,
                })
            }
        };
        let mut named = ok.clone();
        meta("web-0", "6a3c5e1e-7d1b-4f0a-9a53-2f0c8b1a0e11", "default")(&mut named);
        pod(&named, "config").unwrap();
        refused(&meta("web;IP=10.88.0.1", "u", "n"), "config.metadata.name");
        refused(
            &meta("web", "u;K8S_POD_NAMESPACE=kube-system", "n"),
            "config.metadata.uid",
        );
        refused(&meta("web", "u", "a=b"), "config.metadata.namespace");
        refused(
            &|c| {
                if let Some(d) = c.dns_config.as_mut() {
                    d.servers = vec!["1.1.1.1\nnameserver 6.6.6.6".into()];
                }
            },
            "config.dns_config.servers[0]",
        );
        refused(
            &|c| {
                if let Some(d) = c.dns_config.as_mut() {
                    d.searches = vec!["a b".into()];
                }
            },
            "config.dns_config.searches[0]",
        );
        refused(
            &|c| c.port_mappings[0].host_port = 70_000,
            "config.port_mappings[0].host_port",
        );
        refused(
            &|c| {
                c.linux = Some(PodLinux {
                    sysctls: [("net.core.somaxconn".into(), "1\n2".into())].into(),
                    ..Default::default()
                })
            },
            "config.linux.sysctls",
        );
    }

    #[test]
    fn pod_cidrs() {
        pod_cidr("10.244.1.0/24").unwrap();
        pod_cidr("10.244.1.0/24,fd00:10:244:1::/64").unwrap();
        for bad in [
            "10.244.1.0",
            "10.244.1.0/33",
            "fd00::/129",
            "x/8",
            "10.0.0.0/8;IP=1",
            "",
        ] {
            let m = message(pod_cidr(bad));
            assert!(
                m.starts_with("runtime_config.network_config.pod_cidr"),
                "{bad}: {m}"
            );
        }
    }

    #[test]
    fn execs() {
        exec(&["ls".into()]).unwrap();
        assert!(message(exec(&[])).starts_with("cmd"));
        assert!(message(exec(&[String::new()])).starts_with("cmd[0]"));
        assert!(message(exec(&["a".into(), "b\0".into()])).starts_with("cmd[1]"));
    }
}
