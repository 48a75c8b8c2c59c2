//! A container's image: pulled by its pull policy (defaulted as the API server does), with
//! credentials from the pod's imagePullSecrets (docker config JSON, matched as kubelet does by
//! `image::dockercfg`); and the runAsNonRoot check against the image's user.

use crate::cri::v1 as cri;
use k8s_openapi::api::core::v1::Container;

use super::Worker;
use crate::frontend::status::now;
use crate::image::dockercfg::DockerConfig;
use crate::image::reference::Reference;

/// Why a container with runAsNonRoot may not run (kubelet's wording).
#[derive(Debug, thiserror::Error)]
pub(super) enum NonRootError {
    /// The user is root, or the image names none.
    #[error("container has runAsNonRoot and image will run as root")]
    Root,
    /// The image's user is a name, which cannot be checked.
    #[error(
        "container has runAsNonRoot and image has non-numeric user, cannot verify user is non-root"
    )]
    NonNumericUser,
}

/// The image pull policy, defaulted as the API server does: Always for `:latest` or no tag.
fn pull_policy(c: &Container) -> String {
    if let Some(p) = &c.image_pull_policy {
        return p.clone();
    }
    let image = c.image.as_deref().unwrap_or("");
    if image.contains('@') {
        return "IfNotPresent".into();
    }
    let last = image.rsplit('/').next().unwrap_or(image);
    match last.split_once(':') {
        None => "Always".into(),
        Some((_, "latest")) => "Always".into(),
        Some(_) => "IfNotPresent".into(),
    }
}

impl Worker {
    /// The runtime's record of `image`, if it has the image.
    async fn image_status(&mut self, image: &str) -> Option<cri::Image> {
        self.sh
            .img
            .image_status(cri::ImageStatusRequest {
                image: Some(crate::cri::client::image_spec(image)),
                verbose: false,
            })
            .await
            .ok()
            .and_then(|r| r.into_inner().image)
    }

    /// The image to run: pulled by policy, with the pod's pull secrets.
    pub(super) async fn ensure_image(&mut self, c: &Container) -> Result<String, (String, String)> {
        let image = c.image.clone().unwrap_or_default();
        let policy = pull_policy(c);
        let present = self.image_status(&image).await;
        match (policy.as_str(), &present) {
            ("Never", None) => {
                let msg =
                    format!("Container image {image:?} is not present with pull policy of Never");
                self.rec
                    .event("Warning", "ErrImageNeverPull", &c.name, msg.clone());
                return Err(("ErrImageNeverPull".into(), msg));
            }
            ("Never" | "IfNotPresent", Some(i)) => {
                self.rec.event(
                    "Normal",
                    "Pulled",
                    &c.name,
                    format!("Container image {image:?} already present on machine"),
                );
                return Ok(i.id.clone());
            }
            _ => {}
        }
        self.rec.event(
            "Normal",
            "Pulling",
            &c.name,
            format!("Pulling image {image:?}"),
        );
        self.save();
        let started = std::time::Instant::now();
        let auth = self.pull_auth(&image);
        match self
            .sh
            .img
            .pull_image(cri::PullImageRequest {
                image: Some(crate::cri::client::image_spec(&image)),
                auth,
                sandbox_config: None,
            })
            .await
        {
            Ok(r) => {
                self.rec.event(
                    "Normal",
                    "Pulled",
                    &c.name,
                    format!(
                        "Successfully pulled image {image:?} in {:.3}s",
                        started.elapsed().as_secs_f64()
                    ),
                );
                if let Some(rec) = self.rec.container(&c.name) {
                    rec.pull_backoff = Default::default();
                }
                Ok(r.into_inner().image_ref)
            }
            Err(s) => {
                let msg = format!("Failed to pull image {image:?}: {}", s.message());
                self.rec.event("Warning", "Failed", &c.name, msg.clone());
                if let Some(rec) = self.rec.container(&c.name) {
                    rec.pull_backoff.step(now());
                }
                Err(("ErrImagePull".into(), msg))
            }
        }
    }

    /// Credentials for an image from the pod's imagePullSecrets (docker config JSON), by
    /// kubelet's matching rules (`image::dockercfg`), secrets in order, the most specific entry
    /// of each first.
    fn pull_auth(&self, image: &str) -> Option<cri::AuthConfig> {
        let reference = Reference::parse(image).ok()?;
        let store = self.sh.store.borrow().clone();
        for s in self.spec().image_pull_secrets.iter().flatten() {
            let Some(data) = store.secret(&self.rec.namespace, &s.name) else {
                continue;
            };
            let Some(raw) = data
                .get(".dockerconfigjson")
                .or_else(|| data.get(".dockercfg"))
            else {
                continue;
            };
            let Ok(cfg) = DockerConfig::parse(raw) else {
                continue;
            };
            if let Some((server, e)) = cfg.matching(&reference.domain, &reference.path).first() {
                return Some(cri::AuthConfig {
                    username: e.username.clone(),
                    password: e.password.clone(),
                    auth: e.auth.clone(),
                    server_address: server.to_string(),
                    identity_token: e.identitytoken.clone(),
                    registry_token: e.registrytoken.clone(),
                });
            }
        }
        None
    }

    /// runAsNonRoot: the user must be known and not root (from the spec, else the image).
    pub(super) async fn check_non_root(
        &mut self,
        c: &Container,
        image: &str,
    ) -> Result<(), NonRootError> {
        let pod_sc = self
            .pod
            .spec
            .as_ref()
            .and_then(|s| s.security_context.as_ref());
        let sc = c.security_context.as_ref();
        let non_root = sc
            .and_then(|s| s.run_as_non_root)
            .or_else(|| pod_sc.and_then(|s| s.run_as_non_root))
            .unwrap_or(false);
        if !non_root {
            return Ok(());
        }
        let uid = sc
            .and_then(|s| s.run_as_user)
            .or_else(|| pod_sc.and_then(|s| s.run_as_user));
        let uid = match uid {
            Some(u) => Some(u),
            None => self.image_status(image).await.and_then(|i| {
                if !i.username.is_empty() {
                    return Some(-1);
                }
                i.uid.map(|u| u.value)
            }),
        };
        match uid {
            Some(0) | None => Err(NonRootError::Root),
            Some(-1) => Err(NonRootError::NonNumericUser),
            Some(_) => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pull_policy_defaults() {
        let c = |image: &str| Container {
            image: Some(image.into()),
            ..Default::default()
        };
        assert_eq!(pull_policy(&c("busybox")), "Always");
        assert_eq!(pull_policy(&c("busybox:latest")), "Always");
        assert_eq!(pull_policy(&c("localhost:5000/busybox")), "Always");
        assert_eq!(pull_policy(&c("localhost:5000/busybox:1")), "IfNotPresent");
        assert_eq!(pull_policy(&c("busybox@sha256:00")), "IfNotPresent");
    }
}
