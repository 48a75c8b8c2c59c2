//! Image volumes (KEP-4639): a mount whose source is an image, not a host path. The image's
//! layers are mounted read-only (no upper layer, `nodev`, executable) under the container's
//! writable-layer directory, straight from the snapshots crius already has (no copy), and the
//! container binds that, or a directory inside it (`image_sub_path`, resolved inside the image
//! without leaving it), read-only at its path. The image is held while any container mounts it
//! (its snapshots kept; RemoveImage refused, naming the container), and its digest is what
//! ContainerStatus reports for the mount.

use std::path::{Component, Path, PathBuf};

use nix::fcntl::{OFlag, OpenHow, ResolveFlag, openat2};
use nix::mount::MsFlags;
use nix::sys::stat::Mode;
use serde::{Deserialize, Serialize};

use super::config::{ContainerConfig, Mount};
use super::{Bundle, ContainerService, Error, invalid, io_err};
use crate::content::Digest;
use crate::runtime;
use crate::sandbox;

/// One image volume of a container, as its record keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ImageVolume {
    /// The mount's index in the container's config.
    pub mount: usize,
    /// The image's ID (what PullImage answered as its `image_ref`).
    pub image: Digest,
    /// The image's top snapshot, held while the container lives.
    pub chain: Option<Digest>,
    /// What the container binds: the read-only image, or the directory of it the sub path
    /// names, resolved.
    pub source: PathBuf,
}

/// The sub path as components inside the image; refused when it climbs out or is absolute.
pub fn sub_path(path: &str, field: &str) -> Result<PathBuf, Error> {
    let p = Path::new(path);
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::Normal(s) => out.push(s),
            Component::CurDir => {}
            Component::ParentDir | Component::RootDir | Component::Prefix(_) => {
                return Err(invalid(
                    field,
                    format!("{path:?} must be a relative path inside the image"),
                ));
            }
        }
    }
    Ok(out)
}

/// Whether a mount is an image volume; checks what the request says of it.
pub fn check(m: &Mount, field: &str) -> Result<bool, Error> {
    let Some(spec) = &m.image else {
        if !m.image_sub_path.is_empty() {
            return Err(invalid(
                format!("{field}.image_sub_path"),
                "is only for an image volume (image)",
            ));
        }
        return Ok(false);
    };
    if spec.image.is_empty() {
        return Err(invalid(format!("{field}.image.image"), "is required"));
    }
    if !m.host_path.is_empty() {
        return Err(invalid(
            format!("{field}.host_path"),
            "must be empty for an image volume",
        ));
    }
    if !m.readonly {
        return Err(invalid(
            format!("{field}.readonly"),
            "an image volume is read-only: readonly must be true",
        ));
    }
    if m.selinux_relabel {
        return Err(invalid(
            format!("{field}.selinux_relabel"),
            "an image volume cannot be relabelled",
        ));
    }
    sub_path(&m.image_sub_path, &format!("{field}.image_sub_path"))?;
    Ok(true)
}

impl ContainerService {
    /// Mounts every image volume of `config` for container `id` and holds their images; on
    /// failure nothing stays held (the caller removes the bundle's mounts).
    pub(super) fn mount_image_volumes(
        &self,
        id: &str,
        b: &Bundle,
        config: &ContainerConfig,
        pod: &sandbox::Record,
    ) -> Result<Vec<ImageVolume>, Error> {
        let mut out = Vec::new();
        for (i, m) in config.mounts.iter().enumerate() {
            let field = format!("config.mounts[{i}]");
            if !check(m, &field)? {
                continue;
            }
            match self.mount_one(id, b, i, m, pod) {
                Ok(v) => out.push(v),
                Err(e) => {
                    self.release_image_volumes(id, &out);
                    return Err(e);
                }
            }
        }
        Ok(out)
    }

    fn mount_one(
        &self,
        id: &str,
        b: &Bundle,
        i: usize,
        m: &Mount,
        pod: &sandbox::Record,
    ) -> Result<ImageVolume, Error> {
        let field = format!("config.mounts[{i}]");
        let name = m
            .image
            .as_ref()
            .map(|s| s.image.clone())
            .unwrap_or_default();
        let image = self
            .inner
            .images
            .lookup(&name)?
            .ok_or_else(|| Error::ImageNotFound {
                image: format!("{name} (the image volume of {field})"),
            })?;
        let chain = image.top_chain().cloned();
        let dir = b.layer.join("images").join(i.to_string());
        let mut lowers = match &chain {
            Some(_) => self.inner.images.lowerdirs(&image)?,
            None => Vec::new(),
        };
        if lowers.is_empty() {
            let empty = dir.join("empty");
            std::fs::create_dir_all(&empty).map_err(io_err(&empty))?;
            lowers.push(empty);
        }
        if pod.userns.is_some() {
            // Seen through the pod's user namespace, as the rootfs's layers are.
            let ns = self.inner.sandboxes.paths(&pod.id).ns("user");
            let mut mapped = Vec::new();
            for (k, l) in lowers.iter().enumerate() {
                let to = dir.join("idmap").join(k.to_string());
                std::fs::create_dir_all(&to).map_err(io_err(&to))?;
                let tree =
                    runtime::mounts::idmapped(l, &ns, false, runtime::mounts::ATTR_RDONLY, false)
                        .map_err(io_err(l))?;
                runtime::mounts::attach(&tree, &to).map_err(io_err(&to))?;
                mapped.push(to);
            }
            lowers = mapped;
        }
        let root = dir.join("root");
        runtime::mounts::overlay_readonly(&root, &lowers, MsFlags::MS_NODEV)
            .map_err(io_err(&root))?;
        let sub = sub_path(&m.image_sub_path, &format!("{field}.image_sub_path"))?;
        let source = if sub.as_os_str().is_empty() {
            root.clone()
        } else {
            // Inside the image whatever its links say; the bind takes the path they lead to.
            let rootfd: std::os::fd::OwnedFd = nix::fcntl::open(
                &root,
                OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
                Mode::empty(),
            )
            .map_err(|e| io_err(&root)(e.into()))?;
            let found = openat2(
                &rootfd,
                &sub,
                OpenHow::new()
                    .flags(OFlag::O_PATH | OFlag::O_CLOEXEC)
                    .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS),
            )
            .map_err(|e| {
                invalid(
                    format!("{field}.image_sub_path"),
                    format!(
                        "{:?} is not in image {}: {e}",
                        m.image_sub_path, image.record.id
                    ),
                )
            })?;
            std::fs::read_link(runtime::mounts::fd_path(&found)).map_err(io_err(&root))?
        };
        if let Some(c) = &chain {
            self.inner.images.hold(c);
        }
        self.inner.images.pin(&image.record.id, id);
        Ok(ImageVolume {
            mount: i,
            image: image.record.id.clone(),
            chain,
            source,
        })
    }

    /// Lets go of what a container's image volumes held (their mounts go with its files).
    pub(super) fn release_image_volumes(&self, id: &str, volumes: &[ImageVolume]) {
        for v in volumes {
            if let Some(c) = &v.chain {
                self.inner.images.release(c);
            }
            self.inner.images.unpin(&v.image, id);
        }
    }

    /// Holds again what a container's image volumes held (a restarted daemon's records).
    pub(super) fn hold_image_volumes(&self, id: &str, volumes: &[ImageVolume]) {
        for v in volumes {
            if let Some(c) = &v.chain {
                self.inner.images.hold(c);
            }
            self.inner.images.pin(&v.image, id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sub_paths_stay_inside() {
        assert_eq!(sub_path("etc/ssl", "f").unwrap(), PathBuf::from("etc/ssl"));
        assert_eq!(sub_path("./etc", "f").unwrap(), PathBuf::from("etc"));
        assert_eq!(sub_path("", "f").unwrap(), PathBuf::new());
        assert!(sub_path("../etc", "f").is_err());
        assert!(sub_path("etc/../../x", "f").is_err());
        assert!(sub_path("/etc", "f").is_err());
    }
}
