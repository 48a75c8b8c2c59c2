//! `runp`, `create` and `start`: a pod sandbox or a container from a config file, as crictl makes
//! them. The files are CRI's `PodSandboxConfig` and `ContainerConfig` in JSON, or in YAML when
//! they are named `.yaml`/`.yml`, with crictl's field names; fields left out take their zero
//! value. Errors name the file and the line, or the field.

use std::path::Path;

use super::{Doing, Error, OrRefuse, Result, refuse};
use serde::de::DeserializeOwned;

use super::{connect, rpc_error};
use crate::cri::client;
use crate::cri::v1 as cri;

/// Reads a CRI message from a JSON or YAML file.
pub fn load_config<T: DeserializeOwned>(path: &Path) -> Result<T> {
    let text = std::fs::read_to_string(path).doing(|| format!("reading {}", path.display()))?;
    let yaml = matches!(
        path.extension().and_then(|e| e.to_str()),
        Some("yaml" | "yml")
    );
    let value: serde_json::Value = if yaml {
        serde_saphyr::from_str(&text)
            .map_err(|e| Error::Refused(format!("{}: {e}", path.display())))?
    } else {
        serde_json::from_str(&text).map_err(|e| {
            Error::Refused(format!(
                "{}:{}:{}: {e}",
                path.display(),
                e.line(),
                e.column()
            ))
        })?
    };
    from_partial(value).map_err(|e| Error::Refused(format!("{}: {e}", path.display())))
}

/// The zero values a left-out field may take, tried in turn: the message types only say which
/// field is missing, not its type.
const ZEROS: [fn() -> serde_json::Value; 5] = [
    || serde_json::Value::String(String::new()),
    || serde_json::Value::from(0),
    || serde_json::Value::Bool(false),
    || serde_json::Value::Array(Vec::new()),
    || serde_json::Value::Object(serde_json::Map::new()),
];

/// Deserializes `value`, giving every left-out field its zero value (protobuf's rule for
/// absent fields; the generated types want them all). Errors name the field's path.
pub fn from_partial<T: DeserializeOwned>(mut value: serde_json::Value) -> Result<T> {
    // Each round fills one missing field; a config has at most a few hundred.
    for _ in 0..1000 {
        let (path, field) = match try_from(&value) {
            Ok(t) => return Ok(t),
            Err(e) => match missing_field(&e) {
                Some(found) => found,
                None => refuse!("{e}"),
            },
        };
        let mut filled = false;
        for zero in ZEROS {
            let Some(obj) = object_at(&mut value, &path) else {
                break;
            };
            obj.insert(field.clone(), zero());
            match try_from::<T>(&value) {
                Ok(t) => return Ok(t),
                // The zero fit when the next complaint is about something else.
                Err(e) if !about_field(&e, &path, &field) => {
                    filled = true;
                    break;
                }
                Err(_) => {}
            }
        }
        if !filled {
            refuse!("{}: cannot be left out", join(&path, &field));
        }
    }
    refuse!("too many fields left out")
}

fn try_from<T: DeserializeOwned>(
    v: &serde_json::Value,
) -> Result<T, serde_path_to_error::Error<serde_json::Error>> {
    serde_path_to_error::deserialize(v.clone())
}

/// `missing field `x`` at a path: the path's segments and the field.
fn missing_field(e: &serde_path_to_error::Error<serde_json::Error>) -> Option<(Vec<Seg>, String)> {
    let msg = e.inner().to_string();
    let field = msg
        .strip_prefix("missing field `")?
        .split('`')
        .next()?
        .to_string();
    Some((segments(e.path()), field))
}

fn about_field(
    e: &serde_path_to_error::Error<serde_json::Error>,
    path: &[Seg],
    field: &str,
) -> bool {
    let mut at = path.to_vec();
    at.push(Seg::Key(field.to_string()));
    segments(e.path()) == at || missing_field(e).is_some_and(|(p, f)| p == path && f == field)
}

#[derive(Clone, Debug, PartialEq)]
enum Seg {
    Key(String),
    Index(usize),
}

fn segments(p: &serde_path_to_error::Path) -> Vec<Seg> {
    p.iter()
        .filter_map(|s| match s {
            serde_path_to_error::Segment::Map { key } => Some(Seg::Key(key.clone())),
            serde_path_to_error::Segment::Seq { index } => Some(Seg::Index(*index)),
            _ => None,
        })
        .collect()
}

fn object_at<'a>(
    v: &'a mut serde_json::Value,
    path: &[Seg],
) -> Option<&'a mut serde_json::Map<String, serde_json::Value>> {
    let mut at = v;
    for s in path {
        at = match s {
            Seg::Key(k) => at.get_mut(k)?,
            Seg::Index(i) => at.get_mut(*i)?,
        };
    }
    at.as_object_mut()
}

fn join(path: &[Seg], field: &str) -> String {
    let mut out = String::new();
    for s in path {
        match s {
            Seg::Key(k) => {
                out.push_str(k);
                out.push('.');
            }
            Seg::Index(i) => {
                if out.ends_with('.') {
                    out.pop();
                }
                out.push_str(&format!("[{i}]."));
            }
        }
    }
    out.push_str(field);
    out
}

/// `crius runp POD.json`: runs a pod sandbox; prints its ID.
pub async fn runp(socket: &Path, config: &Path, runtime_handler: &str) -> Result<()> {
    let config: cri::PodSandboxConfig = load_config(config)?;
    if config.metadata.as_ref().is_none_or(|m| m.name.is_empty()) {
        refuse!("the pod config needs metadata.name");
    }
    let id = client::runtime(connect(socket)?)
        .run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(config),
            runtime_handler: runtime_handler.to_string(),
        })
        .await
        .map_err(|s| rpc_error("running the pod", socket, s))?
        .into_inner()
        .pod_sandbox_id;
    println!("{id}");
    Ok(())
}

/// `crius create POD CONTAINER.json POD.json`: creates a container in a running pod, pulling
/// its image first unless it is there (or `no_pull`); prints its ID.
pub async fn create(
    socket: &Path,
    pod: &str,
    container: &Path,
    pod_config: &Path,
    no_pull: bool,
) -> Result<()> {
    let config: cri::ContainerConfig = load_config(container)?;
    let sandbox_config: cri::PodSandboxConfig = load_config(pod_config)?;
    let image = config
        .image
        .as_ref()
        .map(|i| i.image.clone())
        .filter(|i| !i.is_empty())
        .or_refuse(|| format!("{}: image.image is required", container.display()))?;
    let channel = connect(socket)?;
    if !no_pull {
        let mut images = client::images(channel.clone());
        let present = images
            .image_status(cri::ImageStatusRequest {
                image: Some(client::image_spec(&image)),
                verbose: false,
            })
            .await
            .map_err(|s| rpc_error("looking up the image", socket, s))?
            .into_inner()
            .image
            .is_some();
        if !present {
            images
                .pull_image(cri::PullImageRequest {
                    image: Some(client::image_spec(&image)),
                    auth: None,
                    sandbox_config: Some(sandbox_config.clone()),
                })
                .await
                .map_err(|s| rpc_error(&format!("pulling {image}"), socket, s))?;
        }
    }
    let id = client::runtime(channel)
        .create_container(cri::CreateContainerRequest {
            pod_sandbox_id: pod.to_string(),
            config: Some(config),
            sandbox_config: Some(sandbox_config),
        })
        .await
        .map_err(|s| rpc_error("creating the container", socket, s))?
        .into_inner()
        .container_id;
    println!("{id}");
    Ok(())
}

/// `crius start CTR...`.
pub async fn start(socket: &Path, ids: &[String]) -> Result<()> {
    let mut rt = client::runtime(connect(socket)?);
    for id in ids {
        rt.start_container(cri::StartContainerRequest {
            container_id: id.clone(),
        })
        .await
        .map_err(|s| rpc_error(&format!("starting {id}"), socket, s))?;
        println!("{id}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn left_out_fields_take_zero_values() {
        let v = serde_json::json!({
            "metadata": {"name": "web", "namespace": "default"},
            "log_directory": "/tmp/pods/web",
            "port_mappings": [{"container_port": 80, "host_port": 8080}],
            "linux": {"security_context": {"namespace_options": {"network": 2}}},
            "labels": {"app": "web"}
        });
        let c: cri::PodSandboxConfig = from_partial(v).unwrap();
        let m = c.metadata.unwrap();
        assert_eq!((m.name.as_str(), m.uid.as_str(), m.attempt), ("web", "", 0));
        assert_eq!(c.port_mappings[0].host_port, 8080);
        assert_eq!(c.port_mappings[0].host_ip, "");
        assert_eq!(c.labels["app"], "web");
        assert!(c.dns_config.is_none());
        let ns = c
            .linux
            .unwrap()
            .security_context
            .unwrap()
            .namespace_options
            .unwrap();
        assert_eq!(ns.network, 2);
        // A wrong type is named by its path.
        let bad = serde_json::json!({"metadata": {"name": 7}});
        let err = from_partial::<cri::PodSandboxConfig>(bad)
            .unwrap_err()
            .to_string();
        assert!(err.contains("metadata.name"), "{err}");
    }

    #[test]
    fn files_name_themselves_and_their_lines() {
        let dir = tempfile::tempdir().unwrap();
        let json = dir.path().join("pod.json");
        std::fs::write(&json, "{\n  \"metadata\": {\"name\": \"a\",}\n}\n").unwrap();
        let err = load_config::<cri::PodSandboxConfig>(&json)
            .unwrap_err()
            .to_string();
        assert!(err.starts_with(&format!("{}:2:", json.display())), "{err}");
        let yaml = dir.path().join("ctr.yaml");
        std::fs::write(
            &yaml,
            "metadata:\n  name: web\nimage:\n  image: busybox\ncommand: [sleep, \"3600\"]\n",
        )
        .unwrap();
        let c: cri::ContainerConfig = load_config(&yaml).unwrap();
        assert_eq!(c.image.unwrap().image, "busybox");
        assert_eq!(c.command, ["sleep", "3600"]);
    }
}
