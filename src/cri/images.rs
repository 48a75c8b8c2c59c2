//! CRI ImageService: requests in, `image::ImageService` calls, CRI messages out.

use std::collections::HashMap;

use crate::cri::v1 as cri;
use crate::cri::v1::image_service_server::ImageService as CriImageService;
use tonic::{Request, Response, Status};

use super::rpc;
use super::status::missing;
use crate::image::{Credentials, Image, ImageService};

pub struct Images {
    svc: ImageService,
    /// The configured pause image: reported pinned, so kubelet's image GC leaves it alone.
    pause_image: Option<String>,
}

impl Images {
    pub fn new(svc: ImageService, pause_image: Option<String>) -> Images {
        Images { svc, pause_image }
    }

    fn to_cri(&self, img: &Image) -> cri::Image {
        let mut out = to_cri(img);
        out.pinned = self
            .pause_image
            .as_deref()
            .and_then(|r| self.svc.lookup(r).ok().flatten())
            .is_some_and(|p| p.record.id == img.record.id);
        out
    }
}

fn spec_image(spec: Option<&cri::ImageSpec>, field: &str) -> Result<String, Status> {
    match spec.map(|s| s.image.trim()) {
        Some(s) if !s.is_empty() => Ok(s.to_string()),
        _ => Err(missing(field)),
    }
}

/// The user an image runs as, split as CRI wants it: a numeric uid, or a name.
pub fn image_user(user: &str) -> (Option<i64>, String) {
    let u = user.split(':').next().unwrap_or("");
    if u.is_empty() {
        return (None, String::new());
    }
    match u.parse::<i64>() {
        Ok(uid) => (Some(uid), String::new()),
        Err(_) => (None, u.to_string()),
    }
}

pub fn to_cri(img: &Image) -> cri::Image {
    let (uid, username) = image_user(&img.config.config.user);
    let id = img.record.id.to_string();
    cri::Image {
        id: id.clone(),
        repo_tags: img.record.repo_tags.clone(),
        repo_digests: img.record.repo_digests.clone(),
        size: img.record.size,
        uid: uid.map(|value| cri::Int64Value { value }),
        username,
        spec: Some(cri::ImageSpec {
            image: id,
            ..Default::default()
        }),
        pinned: false,
    }
}

#[tonic::async_trait]
impl CriImageService for Images {
    async fn list_images(
        &self,
        req: Request<cri::ListImagesRequest>,
    ) -> Result<Response<cri::ListImagesResponse>, Status> {
        rpc("ListImages", async {
            let filter = req
                .into_inner()
                .filter
                .and_then(|f| f.image)
                .map(|s| s.image)
                .filter(|s| !s.is_empty());
            let images = match filter {
                Some(f) => self.svc.lookup(&f)?.into_iter().collect(),
                None => self.svc.list(),
            };
            Ok(cri::ListImagesResponse {
                images: images.iter().map(|i| self.to_cri(i)).collect(),
            })
        })
        .await
    }

    type StreamImagesStream = super::lists::Listing<cri::StreamImagesResponse>;

    async fn stream_images(
        &self,
        req: Request<cri::StreamImagesRequest>,
    ) -> Result<Response<Self::StreamImagesStream>, Status> {
        rpc("StreamImages", async {
            let filter = req
                .into_inner()
                .filter
                .and_then(|f| f.image)
                .map(|s| s.image)
                .filter(|s| !s.is_empty());
            let images = match filter {
                Some(f) => self.svc.lookup(&f)?.into_iter().collect(),
                None => self.svc.list(),
            };
            let items = images.iter().map(|i| self.to_cri(i)).collect();
            Ok(super::lists::chunked(items, |images| {
                cri::StreamImagesResponse { images }
            }))
        })
        .await
    }

    async fn image_status(
        &self,
        req: Request<cri::ImageStatusRequest>,
    ) -> Result<Response<cri::ImageStatusResponse>, Status> {
        rpc("ImageStatus", async {
            let req = req.into_inner();
            let name = spec_image(req.image.as_ref(), "image.image")?;
            let Some(img) = self.svc.lookup(&name)? else {
                // Absent images are not an error: kubelet asks before pulling.
                return Ok(cri::ImageStatusResponse::default());
            };
            let mut info = HashMap::new();
            if req.verbose {
                let config: serde_json::Value = self
                    .svc
                    .config_blob(&img.record.id)
                    .ok()
                    .and_then(|b| serde_json::from_slice(&b).ok())
                    .unwrap_or(serde_json::Value::Null);
                let r = &img.record;
                let v = serde_json::json!({
                    "id": r.id,
                    "manifest": r.manifest,
                    "index": r.index,
                    "chainID": img.top_chain(),
                    "layers": r.layers,
                    "pulledAt": r.pulled_at,
                    "imageSpec": config,
                });
                info.insert("info".to_string(), v.to_string());
            }
            Ok(cri::ImageStatusResponse {
                image: Some(self.to_cri(&img)),
                info,
            })
        })
        .await
    }

    async fn pull_image(
        &self,
        req: Request<cri::PullImageRequest>,
    ) -> Result<Response<cri::PullImageResponse>, Status> {
        rpc("PullImage", async {
            let req = req.into_inner();
            let name = spec_image(req.image.as_ref(), "image.image")?;
            let creds = match req.auth {
                Some(a) => Some(
                    Credentials::from_cri(
                        &a.username,
                        &a.password,
                        &a.auth,
                        &a.identity_token,
                        &a.registry_token,
                    )
                    .map_err(|e| crate::image::Error::Credentials(format!("auth: {e}")))?,
                ),
                None => None,
            };
            let img = self.svc.pull(&name, creds).await?;
            Ok(cri::PullImageResponse {
                image_ref: img.record.id.to_string(),
            })
        })
        .await
    }

    async fn remove_image(
        &self,
        req: Request<cri::RemoveImageRequest>,
    ) -> Result<Response<cri::RemoveImageResponse>, Status> {
        rpc("RemoveImage", async {
            let name = spec_image(req.into_inner().image.as_ref(), "image.image")?;
            self.svc.remove(&name).await?;
            Ok(cri::RemoveImageResponse {})
        })
        .await
    }

    async fn image_fs_info(
        &self,
        _req: Request<cri::ImageFsInfoRequest>,
    ) -> Result<Response<cri::ImageFsInfoResponse>, Status> {
        rpc("ImageFsInfo", async {
            let u = self.svc.fs_usage()?;
            let usage = cri::FilesystemUsage {
                timestamp: crate::records::now_nanos(),
                fs_id: Some(cri::FilesystemIdentifier {
                    mountpoint: u.mountpoint.display().to_string(),
                }),
                used_bytes: Some(cri::UInt64Value {
                    value: u.used_bytes,
                }),
                inodes_used: Some(cri::UInt64Value {
                    value: u.inodes_used,
                }),
            };
            Ok(cri::ImageFsInfoResponse {
                image_filesystems: vec![usage],
                container_filesystems: Vec::new(),
            })
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_users() {
        assert_eq!(image_user(""), (None, String::new()));
        assert_eq!(image_user("1000"), (Some(1000), String::new()));
        assert_eq!(image_user("1000:1000"), (Some(1000), String::new()));
        assert_eq!(image_user("nobody"), (None, "nobody".to_string()));
        assert_eq!(image_user("www:www"), (None, "www".to_string()));
    }
}
