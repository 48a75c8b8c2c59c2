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

/// An `/etc/passwd` entry, borrowed from the file's text.
#[derive(Debug)]
struct Passwd<'a> {
    name: &'a str,
    uid: u32,
    gid: u32,
    home: &'a str,
}

/// An `/etc/group` entry, borrowed from the file's text; `members` as the file lists them.
#[derive(Debug)]
struct Group<'a> {
    name: &'a str,
    gid: u32,
    members: &'a str,
}

impl Group<'_> {
    fn has_member(&self, user: &str) -> bool {
        self.members.split(',').any(|m| m == user)
    }
}

/// The most of `/etc/passwd` or `/etc/group` read: a hostile image could make them huge (a
/// single line of gigabytes, say), and a megabyte holds thousands of entries.
const MAX_USER_FILE: usize = 1 << 20;

fn read_in_root(root: &Path, path: &str) -> String {
    open_in_root(root, path)
        .map(|fd| read_regular(std::fs::File::from(fd), MAX_USER_FILE as u64 + 1))
        .map(|b| whole_lines(b, MAX_USER_FILE))
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .unwrap_or_default()
}

/// `bytes` cut to its whole lines when it passes `max`: a line cut by the bound would read as
/// another entry (a group's members cut to a shorter name).
fn whole_lines(mut bytes: Vec<u8>, max: usize) -> Vec<u8> {
    if bytes.len() > max {
        bytes.truncate(max);
        let end = bytes.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
        bytes.truncate(end);
    }
    bytes
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

/// The entries of an `/etc/passwd` text, parsed as they are looked at: a file of tens of
/// thousands of entries is never held twice.
fn passwd(text: &str) -> impl Iterator<Item = Passwd<'_>> {
    text.lines().filter_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        if f.len() < 7 {
            return None;
        }
        Some(Passwd {
            name: f[0],
            uid: f[2].parse().ok()?,
            gid: f[3].parse().ok()?,
            home: f[5],
        })
    })
}

/// The entries of an `/etc/group` text, parsed as they are looked at.
fn groups(text: &str) -> impl Iterator<Item = Group<'_>> {
    text.lines().filter_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        if f.len() < 4 {
            return None;
        }
        Some(Group {
            name: f[0],
            gid: f[2].parse().ok()?,
            members: f[3],
        })
    })
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
    let (passwd_text, group_text) = (
        read_in_root(root, "/etc/passwd"),
        read_in_root(root, "/etc/group"),
    );
    let users = || passwd(&passwd_text);
    let groups = || groups(&group_text);
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
    let entry_for = |u: &str| -> Result<Option<Passwd<'_>>, UserError> {
        if u.is_empty() {
            return Ok(users().find(|p| p.uid == 0));
        }
        match u.parse::<u32>() {
            Ok(uid) => Ok(users().find(|p| p.uid == uid)),
            Err(_) => users()
                .find(|p| p.name == u)
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
            Err(_) => groups()
                .find(|x| x.name == g)
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
        for g in groups() {
            if g.has_member(p.name) && seen.insert(g.gid) {
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
            .map(|p| p.home)
            .filter(|h| !h.is_empty())
            .unwrap_or("/")
            .to_string(),
        name: entry.map(|p| p.name.to_string()),
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

    /// CVE-2026-47262: a hostile image's huge `/etc/group` and `/etc/passwd` are read to a
    /// bound, in whole lines. The group file is one line of 64 MiB that the bound cuts inside
    /// the member `appx`, leaving `app`: that line is not read. The user the passwd file names
    /// past the bound (after 2 MiB of other users and a 64 MiB hole) is not found, by name.
    #[test]
    fn huge_passwd_and_group_are_read_to_a_bound_in_whole_lines() {
        let r = root();
        let mut group = String::from("root:x:0:\napp:x:1000:\nbig:x:5000:");
        let fill = MAX_USER_FILE - 3 - group.len();
        if fill % 2 == 1 {
            group.push_str("mm,");
        }
        group.push_str(&"m,".repeat(fill / 2 - fill % 2));
        assert_eq!(group.len(), MAX_USER_FILE - 3);
        group.push_str("appx");
        group.push_str(&",m".repeat(32 << 20));
        std::fs::write(r.path().join("etc/group"), &group).unwrap();
        let u = resolve(r.path(), None, "app").unwrap();
        assert_eq!((u.uid, u.additional_gids), (1000, vec![1000]));

        let mut passwd = String::from("root:x:0:0:root:/root:/bin/sh\n");
        passwd.push_str(&"u:x:1:1::/:/bin/sh\n".repeat((2 << 20) / 19));
        passwd.push_str("far:x:3000:3000::/far:/bin/sh\n");
        let path = r.path().join("etc/passwd");
        std::fs::write(&path, &passwd).unwrap();
        let f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        f.set_len(64 << 20).unwrap();
        let bytes = read_regular(std::fs::File::open(&path).unwrap(), 1 << 20);
        assert_eq!(bytes.len(), 1 << 20);
        let e = resolve(r.path(), None, "far").unwrap_err();
        assert!(matches!(&e, UserError::UnknownUser(n) if n == "far"), "{e}");
        assert_eq!(resolve(r.path(), None, "").unwrap().home, "/root");
    }

    #[test]
    fn whole_lines_cut_at_the_last_line_end() {
        assert_eq!(whole_lines(b"a\nbc\nd".to_vec(), 10), b"a\nbc\nd");
        assert_eq!(whole_lines(b"a\nbc\nde".to_vec(), 7), b"a\nbc\nde");
        assert_eq!(whole_lines(b"a\nbc\nde".to_vec(), 6), b"a\nbc\n");
        assert_eq!(whole_lines(b"a\nbc\nde".to_vec(), 5), b"a\nbc\n");
        assert_eq!(whole_lines(b"a\nbc\nde".to_vec(), 4), b"a\n");
        assert_eq!(whole_lines(b"abc".to_vec(), 2), b"");
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
