//! Pods with their own user namespace: the maps kubelet asks for (or crius picks), reserved
//! so no two pods share host IDs.

use super::{
    Deserialize, Error, IdMapping, NamespaceMode, Path, PathBuf, SandboxService, Serialize,
    USERNS_FIRST, USERNS_LAST, USERNS_SIZE, config, invalid,
};

/// A pod's user namespace: one range each for user and group IDs, container ID 0 first.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct UserNs {
    pub uids: IdMapping,
    pub gids: IdMapping,
}

impl UserNs {
    /// The host IDs this pod's maps cover, as ranges.
    fn host_ranges(&self) -> [(u64, u64); 2] {
        [self.uids, self.gids].map(|m| (m.host_id as u64, m.host_id as u64 + m.size as u64))
    }
}

impl SandboxService {
    /// Reserves a pod's user namespace maps: kubelet's if given (refused if they overlap another
    /// pod's), else the first free 65536-ID block of crius's range.
    pub(super) fn reserve_userns(&self, id: &str, asked: Option<UserNs>) -> Result<UserNs, Error> {
        const FIELD: &str = "config.linux.security_context.namespace_options.userns_options";
        if let Some((dir, mode)) = unsearchable_ancestor(&self.inner.dir) {
            return Err(Error::StateUnreachable { dir, mode });
        }
        let mut taken = self.inner.userns.lock().unwrap_or_else(|p| p.into_inner());
        let overlaps = |u: &UserNs| {
            taken.iter().find_map(|(other, t)| {
                u.host_ranges().iter().find_map(|(a0, a1)| {
                    t.host_ranges()
                        .iter()
                        .any(|(b0, b1)| a0 < b1 && b0 < a1)
                        .then(|| other.clone())
                })
            })
        };
        let u = match asked {
            Some(u) => {
                if let Some(other) = overlaps(&u) {
                    return Err(invalid(
                        FIELD,
                        format!("the host IDs overlap those of pod sandbox {other}"),
                    ));
                }
                u
            }
            None => {
                let mut start = USERNS_FIRST;
                loop {
                    let m = IdMapping {
                        container_id: 0,
                        host_id: start,
                        size: USERNS_SIZE,
                    };
                    let u = UserNs { uids: m, gids: m };
                    if overlaps(&u).is_none() {
                        break u;
                    }
                    start = match start.checked_add(USERNS_SIZE) {
                        Some(s) if s <= USERNS_LAST - USERNS_SIZE + 1 => s,
                        _ => {
                            return Err(invalid(FIELD, "no free range of host IDs is left"));
                        }
                    };
                }
            }
        };
        taken.insert(id.to_string(), u.clone());
        Ok(u)
    }

    pub(super) fn release_userns(&self, id: &str) {
        self.inner
            .userns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
    }
}

/// The first of `dir` and the directories above it that other users cannot search, with its
/// mode. A pod's processes reach their root filesystem and files by path once they are in the
/// pod's user namespace, where the host's root is nobody: every directory on the way must be
/// searchable by others (the daemon makes its own 0711; a parent made 0700 breaks them).
fn unsearchable_ancestor(dir: &Path) -> Option<(PathBuf, u32)> {
    use std::os::unix::fs::PermissionsExt;
    dir.ancestors().find_map(|d| {
        let mode = std::fs::metadata(d).ok()?.permissions().mode() & 0o7777;
        (mode & 0o001 == 0).then(|| (d.to_path_buf(), mode))
    })
}

/// The user namespace a pod asks for: none (NODE, or nothing), or its maps; in POD mode
/// without maps crius picks them. As kubelet expects: one range each, starting at container ID
/// 0; CONTAINER and TARGET modes are not for user namespaces.
pub(super) fn userns_request(
    u: Option<&config::UserNamespace>,
) -> Result<Option<Option<UserNs>>, Error> {
    const FIELD: &str = "config.linux.security_context.namespace_options.userns_options";
    let Some(u) = u else {
        return Ok(None);
    };
    match u.mode {
        NamespaceMode::Node => {
            if !u.uids.is_empty() || !u.gids.is_empty() {
                return Err(invalid(
                    FIELD,
                    "NODE mode uses the host's user namespace: no uids or gids may be given",
                ));
            }
            return Ok(None);
        }
        NamespaceMode::Pod => {}
        m => {
            return Err(invalid(
                &format!("{FIELD}.mode"),
                format!(
                    "{} mode is not supported for user namespaces (POD or NODE)",
                    m.name()
                ),
            ));
        }
    }
    if u.uids.is_empty() && u.gids.is_empty() {
        return Ok(Some(None));
    }
    let one = |maps: &[config::IdMapping], what: &str| -> Result<IdMapping, Error> {
        let f = format!("{FIELD}.{what}");
        let [m] = maps else {
            return Err(invalid(
                &f,
                format!("exactly one mapping is supported, got {}", maps.len()),
            ));
        };
        if m.container_id != 0 {
            return Err(invalid(
                &f,
                format!(
                    "the mapping must start at container ID 0 (got {}): ID 0 would not be mapped",
                    m.container_id
                ),
            ));
        }
        if m.length == 0 || m.host_id as u64 + m.length as u64 > u32::MAX as u64 {
            return Err(invalid(
                &f,
                format!("host IDs {} + {} are out of range", m.host_id, m.length),
            ));
        }
        if m.host_id == 0 {
            return Err(invalid(&f, "host ID 0 (the host's root) may not be mapped"));
        }
        Ok(IdMapping {
            container_id: 0,
            host_id: m.host_id,
            size: m.length,
        })
    };
    Ok(Some(Some(UserNs {
        uids: one(&u.uids, "uids")?,
        gids: one(&u.gids, "gids")?,
    })))
}
