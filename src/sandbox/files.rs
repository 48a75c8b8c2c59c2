//! A pod's files and kernel settings: `/etc/hosts`, `/etc/resolv.conf` from its DNS config,
//! `/etc/hostname`, the sysctls it may set, and their removal.

use super::{
    Error, MntFlags, NamespaceMode, Path, Paths, PodConfig, atomic, config, invalid, io_err,
    umount2,
};

pub(super) fn write_file(path: &Path, data: &[u8]) -> Result<(), Error> {
    atomic::write(path, data, 0o644).map_err(io_err(path))
}

pub(super) fn default_hosts() -> String {
    "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\nfe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\nfe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n".to_string()
}

pub(super) fn resolv_conf(dns: &config::Dns) -> Vec<u8> {
    let mut s = String::new();
    if !dns.searches.is_empty() {
        s.push_str(&format!("search {}\n", dns.searches.join(" ")));
    }
    for ns in &dns.servers {
        s.push_str(&format!("nameserver {ns}\n"));
    }
    if !dns.options.is_empty() {
        s.push_str(&format!("options {}\n", dns.options.join(" ")));
    }
    s.into_bytes()
}

/// Validates the pod's sysctls: only namespaced ones, and only for namespaces the pod owns.
pub(super) fn sysctls(
    config: &PodConfig,
    network: NamespaceMode,
    ipc: NamespaceMode,
) -> Result<Vec<(String, String)>, Error> {
    let Some(linux) = &config.linux else {
        return Ok(Vec::new());
    };
    let mut out: Vec<(String, String)> = Vec::new();
    for (key, value) in &linux.sysctls {
        let field = format!("config.linux.sysctls[{key:?}]");
        let k = key.replace('/', ".");
        if k.is_empty() || k.split('.').any(|c| c.is_empty() || c == "..") || value.contains('\n') {
            return Err(invalid(&field, "is not a valid sysctl"));
        }
        let ipc_key = k.starts_with("kernel.shm")
            || k.starts_with("kernel.msg")
            || k == "kernel.sem"
            || k.starts_with("fs.mqueue.");
        if k.starts_with("net.") {
            if network == NamespaceMode::Node {
                return Err(invalid(
                    &field,
                    "a pod on the host network cannot set network sysctls",
                ));
            }
        } else if ipc_key {
            if ipc == NamespaceMode::Node {
                return Err(invalid(
                    &field,
                    "a pod in the host IPC namespace cannot set IPC sysctls",
                ));
            }
        } else {
            return Err(invalid(
                &field,
                "is not a namespaced sysctl (only net.*, kernel.shm*, kernel.msg*, kernel.sem and fs.mqueue.* are)",
            ));
        }
        out.push((k, value.clone()));
    }
    out.sort();
    Ok(out)
}

/// Unmounts and deletes a sandbox directory; tolerant of anything already gone.
pub(super) fn remove_files(paths: &Paths) {
    for kind in ["user", "net", "ipc", "uts", "pid"] {
        let p = paths.ns(kind);
        if p.exists() {
            let _ = umount2(&p, MntFlags::MNT_DETACH);
        }
    }
    let shm = paths.shm();
    if shm.exists() {
        let _ = umount2(&shm, MntFlags::MNT_DETACH);
    }
    // The pause image's rootfs, if any, is detached with whatever else is mounted below.
    if let Err(e) = crate::mounttable::remove_tree(&paths.dir) {
        tracing::warn!(dir = %paths.dir.display(), error = %e, "removing sandbox directory");
    }
}
