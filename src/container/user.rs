//! Who a container runs as: the CRI security context's user, name and group, else the image's
//! `User`, resolved against the image's own `/etc/passwd` and `/etc/group` (read inside the rootfs,
//! never through a symlink that leaves it), with supplementary groups merged as kubelet expects.

use std::io::Read;
use std::path::Path;

use super::config;
use crate::runtime::init::open_in_root;

#[derive(Debug, Clone, PartialEq)]
pub struct User {
    pub uid: u32,
    pub gid: u32,
    pub additional_gids: Vec<u32>,
    pub home: String,
    pub name: Option<String>,
}

#[derive(Debug, Clone)]
struct Passwd {
    name: String,
    uid: u32,
    gid: u32,
    home: String,
}

#[derive(Debug, Clone)]
struct Group {
    name: String,
    gid: u32,
    members: Vec<String>,
}

fn read_in_root(root: &Path, path: &str) -> String {
    // A hostile image could make these huge: a megabyte is plenty for passwd and group.
    open_in_root(root, path)
        .map(|fd| read_regular(std::fs::File::from(fd), 1 << 20))
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .unwrap_or_default()
}

/// At most `max` bytes of `f`, when it is a regular file: a file a container or an image made
/// may be huge (sparse), or a FIFO or device, which would be waited on or read without end.
pub(super) fn read_regular(f: std::fs::File, max: u64) -> Vec<u8> {
    let mut bytes = Vec::new();
    if f.metadata().is_ok_and(|m| m.is_file()) {
        let _ = f.take(max).read_to_end(&mut bytes);
    }
    bytes
}

fn passwd(root: &Path) -> Vec<Passwd> {
    read_in_root(root, "/etc/passwd")
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            if f.len() < 7 {
                return None;
            }
            Some(Passwd {
                name: f[0].to_string(),
                uid: f[2].parse().ok()?,
                gid: f[3].parse().ok()?,
                home: f[5].to_string(),
            })
        })
        .collect()
}

fn groups(root: &Path) -> Vec<Group> {
    read_in_root(root, "/etc/group")
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            if f.len() < 4 {
                return None;
            }
            Some(Group {
                name: f[0].to_string(),
                gid: f[2].parse().ok()?,
                members: f[3]
                    .split(',')
                    .filter(|m| !m.is_empty())
                    .map(str::to_string)
                    .collect(),
            })
        })
        .collect()
}

/// Why a container's user cannot be resolved.
#[derive(Debug, thiserror::Error)]
pub enum UserError {
    #[error("run_as_group is set without run_as_user or run_as_username")]
    GroupWithoutUser,
    #[error("user {0:?} is not in the image's /etc/passwd")]
    UnknownUser(String),
    #[error("group {0:?} is not in the image's /etc/group")]
    UnknownGroup(String),
    #[error("run_as_group {0} is out of range")]
    GroupRange(i64),
    #[error("supplemental group {0} is out of range")]
    SupplementalRange(i64),
}

/// Resolves the container's user. `image_user` is the image config's `User` (`user[:group]`).
pub fn resolve(
    root: &Path,
    sc: Option<&config::ContainerSecurity>,
    image_user: &str,
) -> Result<User, UserError> {
    let users = passwd(root);
    let groups = groups(root);
    let run_as_user = sc.and_then(|s| s.run_as_user);
    let run_as_name = sc
        .map(|s| s.run_as_username.as_str())
        .filter(|s| !s.is_empty());
    let run_as_group = sc.and_then(|s| s.run_as_group);
    if run_as_group.is_some() && run_as_user.is_none() && run_as_name.is_none() {
        return Err(UserError::GroupWithoutUser);
    }
    let (user_part, group_part) = match (run_as_user, run_as_name) {
        (Some(uid), _) => (uid.to_string(), None),
        (None, Some(name)) => (name.to_string(), None),
        (None, None) => match image_user.split_once(':') {
            Some((u, g)) => (u.to_string(), Some(g.to_string())),
            None => (image_user.to_string(), None),
        },
    };
    let entry_for = |u: &str| -> Result<Option<Passwd>, UserError> {
        if u.is_empty() {
            return Ok(users.iter().find(|p| p.uid == 0).cloned());
        }
        match u.parse::<u32>() {
            Ok(uid) => Ok(users.iter().find(|p| p.uid == uid).cloned()),
            Err(_) => users
                .iter()
                .find(|p| p.name == u)
                .cloned()
                .map(Some)
                .ok_or_else(|| UserError::UnknownUser(u.to_string())),
        }
    };
    let entry = entry_for(&user_part)?;
    let uid = match (&entry, user_part.parse::<u32>()) {
        (_, Ok(uid)) => uid,
        (Some(p), _) => p.uid,
        (None, _) => 0,
    };
    let gid = match (run_as_group, &group_part) {
        (Some(g), _) => u32::try_from(g).map_err(|_| UserError::GroupRange(g))?,
        (None, Some(g)) => match g.parse::<u32>() {
            Ok(gid) => gid,
            Err(_) => groups
                .iter()
                .find(|x| &x.name == g)
                .map(|x| x.gid)
                .ok_or_else(|| UserError::UnknownGroup(g.clone()))?,
        },
        (None, None) => entry.as_ref().map(|p| p.gid).unwrap_or(0),
    };
    let strict = sc
        .is_some_and(|s| s.supplemental_groups_policy == config::SupplementalGroupsPolicy::Strict);
    // The primary group leads the supplementary ones (as containerd since CVE-2023-25173), so
    // dropping the primary group with setgid cannot shed its access; ContainerStatus.user
    // reports the same list, as kubelet and critest expect.
    let mut additional: Vec<u32> = vec![gid];
    // In order and once each; a set beside the list keeps tens of thousands of groups linear.
    let mut seen = std::collections::HashSet::from([gid]);
    // Merge (the default): the groups the image's /etc/group gives the user, then the pod's.
    if !strict && let Some(p) = &entry {
        for g in &groups {
            if g.members.iter().any(|m| m == &p.name) && seen.insert(g.gid) {
                additional.push(g.gid);
            }
        }
    }
    for g in sc
        .map(|s| s.supplemental_groups.as_slice())
        .unwrap_or_default()
    {
        let g = u32::try_from(*g).map_err(|_| UserError::SupplementalRange(*g))?;
        if seen.insert(g) {
            additional.push(g);
        }
    }
    Ok(User {
        uid,
        gid,
        additional_gids: additional,
        home: entry
            .as_ref()
            .map(|p| p.home.clone())
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "/".into()),
        name: entry.map(|p| p.name),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("etc")).unwrap();
        std::fs::write(
            d.path().join("etc/passwd"),
            "root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000::/home/app:/bin/sh\n",
        )
        .unwrap();
        std::fs::write(
            d.path().join("etc/group"),
            "root:x:0:\napp:x:1000:\nextra:x:2000:app\nwww:x:33:\n",
        )
        .unwrap();
        d
    }

    fn sc(
        uid: Option<i64>,
        name: &str,
        gid: Option<i64>,
        groups: &[i64],
        strict: bool,
    ) -> config::ContainerSecurity {
        config::ContainerSecurity {
            run_as_user: uid,
            run_as_username: name.into(),
            run_as_group: gid,
            supplemental_groups: groups.to_vec(),
            supplemental_groups_policy: if strict {
                config::SupplementalGroupsPolicy::Strict
            } else {
                config::SupplementalGroupsPolicy::Merge
            },
            ..Default::default()
        }
    }

    #[test]
    fn a_fifo_for_etc_passwd_is_not_waited_on() {
        let r = root();
        std::fs::remove_file(r.path().join("etc/passwd")).unwrap();
        nix::unistd::mkfifo(
            &r.path().join("etc/passwd"),
            nix::sys::stat::Mode::from_bits_truncate(0o644),
        )
        .unwrap();
        // No writer ever comes: read as absent, so a name is not found and an ID is taken.
        assert!(resolve(r.path(), None, "app").is_err());
        assert_eq!(resolve(r.path(), None, "1000").unwrap().uid, 1000);
    }

    /// 53,000 groups naming the user (an image built to slow CreateContainer): each once, in
    /// the file's order, the primary group first, the pod's groups after, nothing twice.
    #[test]
    fn many_groups_merge_once_each() {
        let r = root();
        let mut text = String::from("app:x:1000:\n");
        for i in 0..53_000u32 {
            text.push_str(&format!("g{i}:x:{}:app\n", 10_000 + i));
        }
        // The same GID again under another name, and the primary group as a member's group.
        text.push_str("again:x:10000:app\nown:x:1000:app\n");
        std::fs::write(r.path().join("etc/group"), text).unwrap();
        let groups = sc(None, "", None, &[10_001, 7, 7], false);
        let u = resolve(r.path(), Some(&groups), "app").unwrap();
        assert_eq!(u.additional_gids.len(), 1 + 53_000 + 1);
        assert_eq!(u.additional_gids[..3], [1000, 10_000, 10_001]);
        assert_eq!(u.additional_gids.last(), Some(&7));
        let distinct: std::collections::HashSet<_> = u.additional_gids.iter().collect();
        assert_eq!(distinct.len(), u.additional_gids.len());
    }

    #[test]
    fn image_user_and_overrides() {
        let r = root();
        let u = resolve(r.path(), None, "").unwrap();
        assert_eq!((u.uid, u.gid, u.home.as_str()), (0, 0, "/root"));
        let u = resolve(r.path(), None, "app").unwrap();
        assert_eq!(
            (u.uid, u.gid, u.additional_gids.clone(), u.home.as_str()),
            (1000, 1000, vec![1000, 2000], "/home/app")
        );
        let u = resolve(r.path(), None, "1000:www").unwrap();
        assert_eq!((u.uid, u.gid), (1000, 33));
        let u = resolve(
            r.path(),
            Some(&sc(Some(1234), "", None, &[5], false)),
            "app",
        )
        .unwrap();
        assert_eq!(
            (u.uid, u.gid, u.additional_gids.clone(), u.home.as_str()),
            (1234, 0, vec![0, 5], "/")
        );
        let u = resolve(r.path(), Some(&sc(None, "app", Some(7), &[9], false)), "").unwrap();
        assert_eq!(
            (u.uid, u.gid, u.additional_gids.clone()),
            (1000, 7, vec![7, 2000, 9])
        );
        let u = resolve(r.path(), Some(&sc(None, "app", None, &[9], true)), "").unwrap();
        assert_eq!(
            u.additional_gids,
            vec![1000, 9],
            "Strict leaves out the image's groups"
        );
    }

    #[test]
    fn errors() {
        let r = root();
        assert!(
            resolve(r.path(), Some(&sc(None, "", Some(5), &[], false)), "")
                .unwrap_err()
                .to_string()
                .contains("without")
        );
        assert!(
            resolve(r.path(), None, "nobody")
                .unwrap_err()
                .to_string()
                .contains("nobody")
        );
        assert!(
            resolve(r.path(), None, "app:nogroup")
                .unwrap_err()
                .to_string()
                .contains("nogroup")
        );
    }
}
