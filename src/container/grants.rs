//! What a restored container may be given: no more than the container its checkpoint was dumped
//! from had. criu restores the processes with the credentials, capabilities, seccomp filter,
//! namespaces and mounts its images hold, which are the old container's (the seal says this
//! node's crius dumped them). So the new config must grant at least as much in each, or the
//! restore is refused, naming the field: the same user and group, the old supplementary groups
//! among the new, each capability set a superset of the old, no_new_privs only where the old
//! had it, the same seccomp profile and LSM labels where the new sets them, every namespace the
//! new isolates isolated in the old too, and every path the new masks or makes read-only so in
//! the old. Uses `restore`'s member reading and this module's `Error`.

use std::collections::HashSet;
use std::path::Path;

use oci_spec::runtime::{Capabilities, LinuxCapabilities, Spec};

use super::restore::{bad, read_member};
use super::{Error, invalid};

const CTX: &str = "config.linux.security_context";

/// The old container's spec (`spec.dump` of the unpacked archive in `dir`).
pub(super) fn dumped_spec(archive: &Path, dir: &Path) -> Result<Spec, Error> {
    serde_json::from_slice(&read_member(archive, dir, "spec.dump")?)
        .map_err(|e| bad(archive, format!("spec.dump: {e}")))
}

/// Refuses a new spec that grants less than the old one's processes hold.
pub(super) fn check(old: &Spec, new: &Spec) -> Result<(), Error> {
    let refuse = |field: &str, why: String| Err(invalid(format!("{CTX}.{field}"), why));
    let (op, np) = (old.process().clone(), new.process().clone());
    let (op, np) = (op.unwrap_or_default(), np.unwrap_or_default());
    let (ou, nu) = (op.user(), np.user());
    if (ou.uid(), ou.gid()) != (nu.uid(), nu.gid()) {
        return refuse(
            "run_as_user",
            format!(
                "the checkpointed processes ran as {}:{}, this config as {}:{}; a restore keeps \
                 the old credentials",
                ou.uid(),
                ou.gid(),
                nu.uid(),
                nu.gid()
            ),
        );
    }
    let groups = |g: &Option<Vec<u32>>| -> HashSet<u32> { g.iter().flatten().copied().collect() };
    let extra: Vec<u32> = {
        let mut v: Vec<u32> = groups(ou.additional_gids())
            .difference(&groups(nu.additional_gids()))
            .copied()
            .collect();
        v.sort_unstable();
        v
    };
    if !extra.is_empty() {
        return refuse(
            "supplemental_groups",
            format!("the checkpointed processes had groups {extra:?} this config lacks"),
        );
    }
    caps_cover(op.capabilities(), np.capabilities())
        .map_or(Ok(()), |why| refuse("capabilities", why))?;
    if np.no_new_privileges() == Some(true) && op.no_new_privileges() != Some(true) {
        return refuse(
            "no_new_privs",
            "the checkpointed processes could gain privileges (no no_new_privs); criu cannot \
             take that back"
                .into(),
        );
    }
    if np.apparmor_profile().is_some() && np.apparmor_profile() != op.apparmor_profile() {
        return refuse(
            "apparmor",
            "the checkpointed processes had another AppArmor profile".into(),
        );
    }
    if np.selinux_label().is_some() && np.selinux_label() != op.selinux_label() {
        return refuse(
            "selinux_options",
            "the checkpointed processes had another SELinux label".into(),
        );
    }
    let (ol, nl) = (old.linux().clone(), new.linux().clone());
    let (ol, nl) = (ol.unwrap_or_default(), nl.unwrap_or_default());
    if nl.seccomp().is_some() && nl.seccomp() != ol.seccomp() {
        return refuse(
            "seccomp",
            "the checkpointed processes had another seccomp profile, or none".into(),
        );
    }
    let kinds = |l: &oci_spec::runtime::Linux| -> HashSet<String> {
        l.namespaces()
            .iter()
            .flatten()
            .map(|n| format!("{:?}", n.typ()))
            .collect()
    };
    let mut shared: Vec<String> = kinds(&nl).difference(&kinds(&ol)).cloned().collect();
    shared.sort();
    if !shared.is_empty() {
        return refuse(
            "namespace_options",
            format!(
                "the checkpointed container shared the node's {shared:?} namespaces, which \
                 this config isolates"
            ),
        );
    }
    for (field, o, n) in [
        ("masked_paths", ol.masked_paths(), nl.masked_paths()),
        ("readonly_paths", ol.readonly_paths(), nl.readonly_paths()),
    ] {
        let was: HashSet<&String> = o.iter().flatten().collect();
        if let Some(p) = n.iter().flatten().find(|p| !was.contains(p)) {
            return refuse(
                field,
                format!("{p} was not so in the checkpointed container; its mounts are restored"),
            );
        }
    }
    Ok(())
}

/// Why the new capability sets do not each hold the old one's, if they do not.
fn caps_cover(old: &Option<LinuxCapabilities>, new: &Option<LinuxCapabilities>) -> Option<String> {
    let (old, new) = (
        old.clone().unwrap_or_default(),
        new.clone().unwrap_or_default(),
    );
    let sets: [(&str, &Option<Capabilities>, &Option<Capabilities>); 5] = [
        ("bounding", old.bounding(), new.bounding()),
        ("effective", old.effective(), new.effective()),
        ("permitted", old.permitted(), new.permitted()),
        ("inheritable", old.inheritable(), new.inheritable()),
        ("ambient", old.ambient(), new.ambient()),
    ];
    for (name, o, n) in sets {
        let empty = Capabilities::default();
        let (o, n) = (o.as_ref().unwrap_or(&empty), n.as_ref().unwrap_or(&empty));
        let mut more: Vec<String> = o.difference(n).map(|c| format!("CAP_{c}")).collect();
        if !more.is_empty() {
            more.sort();
            return Some(format!(
                "the checkpointed processes held {more:?} in their {name} set, which this \
                 config does not grant"
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn spec(v: serde_json::Value) -> Spec {
        let mut base = serde_json::json!({
            "ociVersion": "1.0.2",
            "process": {
                "user": {"uid": 1000, "gid": 1000, "additionalGids": [1000, 2000]},
                "args": ["sleep"], "cwd": "/",
                "capabilities": {
                    "bounding": ["CAP_CHOWN", "CAP_KILL"],
                    "effective": ["CAP_CHOWN"],
                    "permitted": ["CAP_CHOWN"]
                },
                "noNewPrivileges": true
            },
            "linux": {
                "namespaces": [{"type": "pid"}, {"type": "mount"}, {"type": "network", "path": "/x"}],
                "maskedPaths": ["/proc/kcore"],
                "readonlyPaths": ["/proc/sys"],
                "seccomp": {"defaultAction": "SCMP_ACT_ERRNO", "syscalls": []}
            }
        });
        merge(&mut base, v);
        serde_json::from_value(base).unwrap()
    }

    fn merge(a: &mut serde_json::Value, b: serde_json::Value) {
        match (a, b) {
            (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
                for (k, v) in b {
                    merge(a.entry(k).or_insert(serde_json::Value::Null), v);
                }
            }
            (a, b) => *a = b,
        }
    }

    fn refused(old: serde_json::Value, new: serde_json::Value) -> String {
        check(&spec(old), &spec(new)).unwrap_err().to_string()
    }

    #[test]
    fn the_same_grants_or_more_restore() {
        check(&spec(serde_json::json!({})), &spec(serde_json::json!({}))).unwrap();
        // More capabilities, more groups, no seccomp, fewer masks: more is granted.
        check(
            &spec(serde_json::json!({})),
            &spec(serde_json::json!({
                "process": {
                    "user": {"additionalGids": [1000, 2000, 3000]},
                    "capabilities": {"bounding": ["CAP_CHOWN", "CAP_KILL", "CAP_NET_RAW"]},
                    "noNewPrivileges": false
                },
                "linux": {"seccomp": null, "maskedPaths": []}
            })),
        )
        .unwrap();
    }

    #[test]
    fn a_config_granting_less_than_the_checkpoint_held_is_refused() {
        let none = serde_json::json!({});
        let e = refused(
            none.clone(),
            serde_json::json!({"process": {"user": {"uid": 0}}}),
        );
        assert!(e.contains("run_as_user") && e.contains("1000:1000"), "{e}");
        let e = refused(
            none.clone(),
            serde_json::json!({"process": {"user": {"additionalGids": [1000]}}}),
        );
        assert!(
            e.contains("supplemental_groups") && e.contains("2000"),
            "{e}"
        );
        let e = refused(
            none.clone(),
            serde_json::json!({"process": {"capabilities": {"bounding": ["CAP_CHOWN"]}}}),
        );
        assert!(e.contains("capabilities") && e.contains("CAP_KILL"), "{e}");
        let e = refused(
            serde_json::json!({"process": {"noNewPrivileges": false}}),
            none.clone(),
        );
        assert!(e.contains("no_new_privs"), "{e}");
        let e = refused(
            serde_json::json!({"linux": {"seccomp": null}}),
            none.clone(),
        );
        assert!(e.contains("seccomp"), "{e}");
        let e = refused(
            serde_json::json!({"linux": {"namespaces": [{"type": "mount"}]}}),
            none.clone(),
        );
        assert!(e.contains("namespace_options") && e.contains("Pid"), "{e}");
        let e = refused(
            serde_json::json!({"linux": {"maskedPaths": []}}),
            none.clone(),
        );
        assert!(
            e.contains("masked_paths") && e.contains("/proc/kcore"),
            "{e}"
        );
        let e = refused(
            none.clone(),
            serde_json::json!({"process": {"apparmorProfile": "crius-default"}}),
        );
        assert!(e.contains("apparmor"), "{e}");
    }
}
