//! A pod's volumes on the node, under `<state>/pods/<uid>/volumes/<name>`: `emptyDir` (a
//! directory, or a tmpfs of `sizeLimit` for `medium: Memory`), `hostPath` with its type checks
//! and creation, and the data volumes (`secret`, `configMap`, `downwardAPI`, `projected`) written
//! kubelet's way: files in a timestamped directory, a `..data` symlink to it and a symlink per
//! top-level name, so an update swaps `..data` atomically. Secret, downward API and projected
//! data sit on a tmpfs mounted `noswap` where the kernel can. Everything is unmounted and removed
//! with the pod.

use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Component, Path, PathBuf};

use k8s_openapi::api::core::v1::{DownwardAPIVolumeFile, KeyToPath, Volume};

use super::convert::{self, PodContext};
use super::node as tmpfs;

#[derive(Debug, thiserror::Error)]
#[error("volume {volume:?}: {reason}")]
pub struct VolumeError {
    pub volume: String,
    pub reason: String,
}

fn err(volume: &str, reason: impl Into<String>) -> VolumeError {
    VolumeError {
        volume: volume.to_string(),
        reason: reason.into(),
    }
}

/// The directory of a pod's volumes.
pub fn volumes_dir(pod_dir: &Path) -> PathBuf {
    pod_dir.join("volumes")
}

fn is_data(v: &Volume) -> bool {
    v.secret.is_some()
        || v.config_map.is_some()
        || v.downward_api.is_some()
        || v.projected.is_some()
}

fn in_memory(v: &Volume) -> bool {
    v.secret.is_some() || v.downward_api.is_some() || v.projected.is_some()
}

/// Makes every volume of the pod ready (once; data volumes are rewritten by [`refresh`]) and
/// returns their host paths by name.
pub fn prepare(ctx: &PodContext, pod_dir: &Path) -> Result<HashMap<String, PathBuf>, VolumeError> {
    let dir = volumes_dir(pod_dir);
    let mut out = HashMap::new();
    for v in ctx.spec.volumes.iter().flatten() {
        let path = dir.join(&v.name);
        if let Some(h) = &v.host_path {
            host_path(
                &v.name,
                Path::new(&h.path),
                h.type_.as_deref().unwrap_or(""),
            )?;
            out.insert(v.name.clone(), PathBuf::from(&h.path));
            continue;
        }
        let fresh = !path.exists();
        std::fs::create_dir_all(&path).map_err(|e| err(&v.name, e.to_string()))?;
        if let Some(e) = &v.empty_dir {
            if fresh || !is_mounted(&path) {
                if e.medium.as_deref() == Some("Memory") {
                    let size = e
                        .size_limit
                        .as_ref()
                        .and_then(|q| super::quantity::parse(&q.0).ok())
                        .map(|q| q.value())
                        .unwrap_or(0);
                    if !is_mounted(&path) {
                        tmpfs::mount_tmpfs(&path, size, 0o777, false)
                            .map_err(|e| err(&v.name, format!("tmpfs: {e}")))?;
                    }
                }
                set_mode(&path, 0o777).map_err(|e| err(&v.name, e.to_string()))?;
                if let Some(g) = fs_group(ctx) {
                    let _ = std::os::unix::fs::chown(&path, None, Some(g));
                    set_mode(&path, 0o2777).map_err(|e| err(&v.name, e.to_string()))?;
                }
            }
        } else if is_data(v) && in_memory(v) && !is_mounted(&path) {
            tmpfs::mount_tmpfs(&path, 0, 0o755, true)
                .map_err(|e| err(&v.name, format!("tmpfs: {e}")))?;
        }
        if is_data(v) {
            write_data(ctx, v, &path)?;
        }
        out.insert(v.name.clone(), path);
    }
    Ok(out)
}

/// The eviction message for the first disk-backed emptyDir using more than its `sizeLimit`.
pub fn over_limit(spec: &k8s_openapi::api::core::v1::PodSpec, pod_dir: &Path) -> Option<String> {
    let dir = volumes_dir(pod_dir);
    for v in spec.volumes.iter().flatten() {
        let Some(e) = &v.empty_dir else { continue };
        if e.medium.as_deref() == Some("Memory") {
            continue; // its tmpfs is sized to the limit
        }
        let Some(q) = &e.size_limit else { continue };
        let Ok(limit) = super::quantity::parse(&q.0) else {
            continue;
        };
        let path = dir.join(&v.name);
        if disk_usage(&path) > limit.value() {
            return Some(format!(
                "Usage of EmptyDir volume {:?} exceeds the limit {:?}.",
                v.name, q.0
            ));
        }
    }
    None
}

/// Bytes of disk a tree takes (allocated blocks, each inode once), not crossing into mounts.
fn disk_usage(root: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(top) = std::fs::symlink_metadata(root) else {
        return 0;
    };
    let mut seen = std::collections::HashSet::new();
    let mut total = top.blocks() * 512;
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let Ok(m) = e.metadata() else { continue };
            if m.dev() != top.dev() || (m.nlink() > 1 && !seen.insert(m.ino())) {
                continue;
            }
            total += m.blocks() * 512;
            if m.is_dir() {
                stack.push(e.path());
            }
        }
    }
    total
}

fn fs_group(ctx: &PodContext) -> Option<u32> {
    ctx.spec
        .security_context
        .as_ref()
        .and_then(|s| s.fs_group)
        .and_then(|g| u32::try_from(g).ok())
}

fn set_mode(p: &Path, mode: u32) -> std::io::Result<()> {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))
}

fn is_mounted(p: &Path) -> bool {
    let t = p.display().to_string();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(t.as_str()))
}

/// Rewrites the data volumes whose content changed (Secrets and ConfigMaps edited since);
/// returns the names of the volumes that changed.
pub fn refresh(ctx: &PodContext, pod_dir: &Path) -> Vec<String> {
    let dir = volumes_dir(pod_dir);
    let mut changed = Vec::new();
    for v in ctx.spec.volumes.iter().flatten().filter(|v| is_data(v)) {
        let path = dir.join(&v.name);
        if !path.exists() {
            continue;
        }
        let Ok(files) = data_files(ctx, v) else {
            continue;
        };
        if current_files(&path) != files && write_files(&path, &files, fs_group(ctx)).is_ok() {
            changed.push(v.name.clone());
        }
    }
    changed
}

/// The files a data volume holds: relative path to (content, mode).
type Files = BTreeMap<String, (Vec<u8>, u32)>;

fn data_files(ctx: &PodContext, v: &Volume) -> Result<Files, VolumeError> {
    let mut files = Files::new();
    let default_mode = |m: Option<i32>| m.map(|m| m as u32).unwrap_or(0o644);
    let add_keys = |files: &mut Files,
                    data: Option<BTreeMap<String, Vec<u8>>>,
                    items: Option<&Vec<KeyToPath>>,
                    optional: bool,
                    what: &str,
                    mode: u32|
     -> Result<(), VolumeError> {
        let Some(data) = data else {
            if optional {
                return Ok(());
            }
            return Err(err(&v.name, format!("{what} not found")));
        };
        match items {
            None => {
                for (k, val) in data {
                    files.insert(k, (val, mode));
                }
            }
            Some(items) => {
                for it in items {
                    match data.get(&it.key) {
                        Some(val) => {
                            files.insert(
                                it.path.clone(),
                                (val.clone(), it.mode.map(|m| m as u32).unwrap_or(mode)),
                            );
                        }
                        None if optional => {}
                        None => {
                            return Err(err(&v.name, format!("key {:?} not in {what}", it.key)));
                        }
                    }
                }
            }
        }
        Ok(())
    };
    let ns = ctx.namespace;
    if let Some(s) = &v.secret {
        let name = s.secret_name.clone().unwrap_or_default();
        add_keys(
            &mut files,
            ctx.store.secret(ns, &name),
            s.items.as_ref(),
            s.optional.unwrap_or(false),
            &format!("secret {ns}/{name}"),
            default_mode(s.default_mode),
        )?;
    }
    if let Some(c) = &v.config_map {
        add_keys(
            &mut files,
            ctx.store.config_map(ns, &c.name),
            c.items.as_ref(),
            c.optional.unwrap_or(false),
            &format!("configmap {ns}/{}", c.name),
            default_mode(c.default_mode),
        )?;
    }
    if let Some(d) = &v.downward_api {
        downward(
            ctx,
            &v.name,
            d.items.iter().flatten(),
            default_mode(d.default_mode),
            &mut files,
        )?;
    }
    if let Some(p) = &v.projected {
        let mode = default_mode(p.default_mode);
        for src in p.sources.iter().flatten() {
            if let Some(s) = &src.secret {
                add_keys(
                    &mut files,
                    ctx.store.secret(ns, &s.name),
                    s.items.as_ref(),
                    s.optional.unwrap_or(false),
                    &format!("secret {ns}/{}", s.name),
                    mode,
                )?;
            }
            if let Some(c) = &src.config_map {
                add_keys(
                    &mut files,
                    ctx.store.config_map(ns, &c.name),
                    c.items.as_ref(),
                    c.optional.unwrap_or(false),
                    &format!("configmap {ns}/{}", c.name),
                    mode,
                )?;
            }
            if let Some(d) = &src.downward_api {
                downward(ctx, &v.name, d.items.iter().flatten(), mode, &mut files)?;
            }
        }
    }
    for p in files.keys() {
        let bad = p.is_empty()
            || Path::new(p)
                .components()
                .any(|c| !matches!(c, Component::Normal(_)))
            || p.starts_with("..");
        if bad {
            return Err(err(
                &v.name,
                format!("{p:?}: a file path must be relative, without '..'"),
            ));
        }
    }
    Ok(files)
}

fn downward<'a>(
    ctx: &PodContext,
    volume: &str,
    items: impl Iterator<Item = &'a DownwardAPIVolumeFile>,
    mode: u32,
    files: &mut Files,
) -> Result<(), VolumeError> {
    for it in items {
        let value = if let Some(f) = &it.field_ref {
            convert::field(ctx, &f.field_path)
                .ok_or_else(|| err(volume, format!("unsupported field {}", f.field_path)))?
        } else if let Some(r) = &it.resource_field_ref {
            let c = ctx
                .spec
                .containers
                .iter()
                .chain(ctx.spec.init_containers.iter().flatten())
                .find(|c| Some(c.name.as_str()) == r.container_name.as_deref())
                .ok_or_else(|| err(volume, "resourceFieldRef needs a containerName"))?;
            convert::resource_field(
                ctx,
                c,
                &r.resource,
                r.divisor.as_ref().map(|d| d.0.as_str()),
            )
            .ok_or_else(|| err(volume, format!("unsupported resource {}", r.resource)))?
        } else {
            continue;
        };
        files.insert(
            it.path.clone(),
            (
                value.into_bytes(),
                it.mode.map(|m| m as u32).unwrap_or(mode),
            ),
        );
    }
    Ok(())
}

fn write_data(ctx: &PodContext, v: &Volume, path: &Path) -> Result<(), VolumeError> {
    let files = data_files(ctx, v)?;
    if current_files(path) == files && path.join("..data").exists() {
        return Ok(());
    }
    write_files(path, &files, fs_group(ctx)).map_err(|e| err(&v.name, e.to_string()))
}

/// What a data volume holds now, read through `..data`.
fn current_files(dir: &Path) -> Files {
    let mut out = Files::new();
    let data = dir.join("..data");
    fn walk(base: &Path, rel: &Path, out: &mut Files) {
        let Ok(entries) = std::fs::read_dir(base.join(rel)) else {
            return;
        };
        for e in entries.flatten() {
            let r = rel.join(e.file_name());
            let p = base.join(&r);
            let Ok(m) = std::fs::metadata(&p) else {
                continue;
            };
            if m.is_dir() {
                walk(base, &r, out);
            } else if let Ok(content) = std::fs::read(&p) {
                out.insert(
                    r.display().to_string(),
                    (content, m.permissions().mode() & 0o7777),
                );
            }
        }
    }
    walk(&data, Path::new(""), &mut out);
    out
}

/// kubelet's atomic writer: a new timestamped directory, `..data` switched to it by rename,
/// top-level symlinks into `..data`, the old directory and stale symlinks removed.
fn write_files(dir: &Path, files: &Files, group: Option<u32>) -> std::io::Result<()> {
    let stamp = format!(
        "..{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    );
    let new = dir.join(&stamp);
    std::fs::create_dir(&new)?;
    set_mode(&new, 0o755)?;
    for (rel, (content, mode)) in files {
        let p = new.join(rel);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&p, content)?;
        set_mode(&p, *mode)?;
        if let Some(g) = group {
            std::os::unix::fs::chown(&p, None, Some(g))?;
        }
    }
    let old = std::fs::read_link(dir.join("..data")).ok();
    let tmp = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp);
    symlink(&stamp, &tmp)?;
    std::fs::rename(&tmp, dir.join("..data"))?;
    let tops: std::collections::BTreeSet<String> = files
        .keys()
        .filter_map(|k| k.split('/').next().map(String::from))
        .collect();
    for t in &tops {
        let link = dir.join(t);
        if std::fs::symlink_metadata(&link).is_err() {
            symlink(Path::new("..data").join(t), &link)?;
        }
    }
    // Names no longer in the data.
    for e in std::fs::read_dir(dir)?.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.starts_with("..") && !tops.contains(&name) {
            let _ = std::fs::remove_file(e.path());
        }
    }
    if let Some(old) = old
        && old != Path::new(&stamp)
    {
        let _ = std::fs::remove_dir_all(dir.join(old));
    }
    Ok(())
}

/// `hostPath` type checks, creating what the type allows.
fn host_path(volume: &str, path: &Path, kind: &str) -> Result<(), VolumeError> {
    use std::os::unix::fs::FileTypeExt;
    let meta = std::fs::metadata(path);
    // The path exists and passes `ok`, or the volume fails naming `what` it should be.
    let is = |ok: fn(&std::fs::Metadata) -> bool, what: &str| match &meta {
        Ok(m) if ok(m) => Ok(()),
        _ => Err(err(
            volume,
            format!("hostPath {} is not {what}", path.display()),
        )),
    };
    match kind {
        "" => Ok(()),
        "DirectoryOrCreate" => {
            if meta.is_err() {
                std::fs::create_dir_all(path).map_err(|e| err(volume, e.to_string()))?;
                set_mode(path, 0o755).map_err(|e| err(volume, e.to_string()))?;
                return Ok(());
            }
            is(|m| m.is_dir(), "a directory")
        }
        "Directory" => is(|m| m.is_dir(), "an existing directory"),
        "FileOrCreate" => {
            if meta.is_err() {
                if let Some(parent) = path.parent()
                    && !parent.exists()
                {
                    return Err(err(
                        volume,
                        format!("hostPath {}: its directory does not exist", path.display()),
                    ));
                }
                std::fs::OpenOptions::new()
                    .create(true)
                    .truncate(false)
                    .write(true)
                    .open(path)
                    .map_err(|e| err(volume, e.to_string()))?;
                set_mode(path, 0o644).map_err(|e| err(volume, e.to_string()))?;
                return Ok(());
            }
            is(|m| m.is_file(), "a file")
        }
        "File" => is(|m| m.is_file(), "an existing file"),
        "Socket" => is(|m| m.file_type().is_socket(), "a socket"),
        "CharDevice" => is(|m| m.file_type().is_char_device(), "a character device"),
        "BlockDevice" => is(|m| m.file_type().is_block_device(), "a block device"),
        other => Err(err(volume, format!("unknown hostPath type {other:?}"))),
    }
}

/// Unmounts and removes everything of a pod's directory.
pub fn cleanup(pod_dir: &Path) -> std::io::Result<()> {
    crate::mounttable::remove_tree(pod_dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_writer_layout_and_update() {
        let d = tempfile::tempdir().unwrap();
        let mut files = Files::new();
        files.insert("a".into(), (b"1".to_vec(), 0o644));
        files.insert("dir/b".into(), (b"2".to_vec(), 0o400));
        write_files(d.path(), &files, None).unwrap();
        assert_eq!(std::fs::read(d.path().join("a")).unwrap(), b"1");
        assert_eq!(std::fs::read(d.path().join("dir/b")).unwrap(), b"2");
        assert!(
            std::fs::read_link(d.path().join("a"))
                .unwrap()
                .starts_with("..data")
        );
        let first = std::fs::read_link(d.path().join("..data")).unwrap();
        assert_eq!(current_files(d.path()), files);
        let mut files2 = Files::new();
        files2.insert("a".into(), (b"3".to_vec(), 0o644));
        write_files(d.path(), &files2, None).unwrap();
        assert_eq!(std::fs::read(d.path().join("a")).unwrap(), b"3");
        assert!(
            !d.path().join("dir").exists(),
            "a name gone from the data goes"
        );
        assert!(!d.path().join(first).exists(), "the old version is removed");
    }

    #[test]
    fn host_path_types() {
        let d = tempfile::tempdir().unwrap();
        let sub = d.path().join("new");
        host_path("v", &sub, "DirectoryOrCreate").unwrap();
        assert!(sub.is_dir());
        host_path("v", &sub, "Directory").unwrap();
        assert!(host_path("v", &sub, "File").is_err());
        let f = d.path().join("f");
        host_path("v", &f, "FileOrCreate").unwrap();
        assert!(f.is_file());
        assert!(host_path("v", &d.path().join("nope"), "Directory").is_err());
        assert!(host_path("v", &f, "Socket").is_err());
        host_path("v", Path::new("/dev/null"), "CharDevice").unwrap();
    }
}
