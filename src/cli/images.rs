//! `crius pull`, `images`, `rmi`, `inspecti`.

use std::path::Path;
use std::time::Duration;

use super::{OrRefuse, Result, refuse};
use crate::cri::v1 as cri;
use indicatif::{ProgressBar, ProgressStyle};

use super::{Output, connect, human_size, print_table, rpc_error, short_id};
use crate::cri::client;
use crate::cri::proto::WatchRequest;

/// Pulls an image, with a progress bar when the runtime reports progress.
pub async fn pull(socket: &Path, image: &str, creds: Option<&str>, quiet: bool) -> Result<()> {
    let ch = connect(socket)?;
    let auth = match creds {
        Some(c) => {
            let (user, pass) = c
                .split_once(':')
                .or_refuse(|| "--creds must be USER:PASSWORD".into())?;
            Some(cri::AuthConfig {
                username: user.to_string(),
                password: pass.to_string(),
                ..Default::default()
            })
        }
        None => None,
    };
    let bar = if quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::new_spinner()
    };
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} {msg} {bytes}/{total_bytes} {wide_bar} {bytes_per_sec}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    bar.set_message(format!("pulling {image}"));
    bar.enable_steady_tick(Duration::from_millis(120));

    let watcher = {
        let bar = bar.clone();
        let mut pulls = client::pulls(ch.clone());
        let image = image.to_string();
        tokio::spawn(async move {
            let Ok(resp) = pulls
                .watch(WatchRequest {
                    image: image.clone(),
                    wait_seconds: 30,
                })
                .await
            else {
                return; // not crius: a spinner is all we can show
            };
            let mut stream = resp.into_inner();
            while let Ok(Some(p)) = stream.message().await {
                bar.set_length(p.bytes_total);
                bar.set_position(p.bytes_done);
                bar.set_message(format!(
                    "pulling {image} (layers {}/{})",
                    p.layers_done, p.layers_total
                ));
                if p.done {
                    break;
                }
            }
        })
    };
    let result = client::images(ch)
        .pull_image(cri::PullImageRequest {
            image: Some(client::image_spec(image)),
            auth,
            sandbox_config: None,
        })
        .await;
    watcher.abort();
    bar.finish_and_clear();
    let resp = result.map_err(|s| rpc_error(&format!("pulling {image}"), socket, s))?;
    println!("Image is up to date for {}", resp.into_inner().image_ref);
    Ok(())
}

/// Splits `name:tag` into name and tag (a `:` before the last `/` is a port).
fn name_tag(repo_tag: &str) -> (String, String) {
    let slash = repo_tag.rfind('/').map(|i| i + 1).unwrap_or(0);
    match repo_tag[slash..].rfind(':') {
        Some(i) => (
            repo_tag[..slash + i].to_string(),
            repo_tag[slash + i + 1..].to_string(),
        ),
        None => (repo_tag.to_string(), "<none>".to_string()),
    }
}

pub async fn images(
    socket: &Path,
    filter: Option<&str>,
    quiet: bool,
    output: Output,
) -> Result<()> {
    let ch = connect(socket)?;
    let resp = client::images(ch)
        .list_images(cri::ListImagesRequest {
            filter: filter.map(|f| cri::ImageFilter {
                image: Some(client::image_spec(f)),
            }),
        })
        .await
        .map_err(|s| rpc_error("listing images", socket, s))?
        .into_inner();
    if super::print_structured(&resp, output)? {
        return Ok(());
    }
    if quiet {
        for i in &resp.images {
            println!("{}", i.id);
        }
        return Ok(());
    }
    let mut rows = vec![vec![
        "IMAGE".into(),
        "TAG".into(),
        "DIGEST".into(),
        "IMAGE ID".into(),
        "SIZE".into(),
    ]];
    for i in &resp.images {
        let digest = i
            .repo_digests
            .first()
            .and_then(|d| d.split_once('@'))
            .map(|(_, d)| short_id(d))
            .unwrap_or_else(|| "<none>".into());
        let names: Vec<(String, String)> = if i.repo_tags.is_empty() {
            let name = i
                .repo_digests
                .first()
                .and_then(|d| d.split_once('@'))
                .map(|(n, _)| n.to_string());
            vec![(name.unwrap_or_else(|| "<none>".into()), "<none>".into())]
        } else {
            i.repo_tags.iter().map(|t| name_tag(t)).collect()
        };
        for (name, tag) in names {
            rows.push(vec![
                name,
                tag,
                digest.clone(),
                short_id(&i.id),
                human_size(i.size),
            ]);
        }
    }
    print_table(&rows);
    Ok(())
}

pub async fn remove_images(socket: &Path, names: &[String]) -> Result<()> {
    let ch = connect(socket)?;
    let mut images = client::images(ch);
    let mut failed = false;
    for name in names {
        let status = images
            .image_status(cri::ImageStatusRequest {
                image: Some(client::image_spec(name)),
                verbose: false,
            })
            .await
            .map_err(|s| rpc_error(&format!("looking up {name}"), socket, s))?
            .into_inner();
        let Some(img) = status.image else {
            eprintln!("crius: no such image: {name}");
            failed = true;
            continue;
        };
        images
            .remove_image(cri::RemoveImageRequest {
                image: Some(client::image_spec(&img.id)),
            })
            .await
            .map_err(|s| rpc_error(&format!("removing {name}"), socket, s))?;
        for t in &img.repo_tags {
            println!("Untagged: {t}");
        }
        println!("Deleted: {}", img.id);
    }
    if failed {
        refuse!("some images were not found");
    }
    Ok(())
}

pub async fn inspect_image(socket: &Path, name: &str) -> Result<()> {
    let ch = connect(socket)?;
    let status = client::images(ch)
        .image_status(cri::ImageStatusRequest {
            image: Some(client::image_spec(name)),
            verbose: true,
        })
        .await
        .map_err(|s| rpc_error(&format!("inspecting {name}"), socket, s))?
        .into_inner();
    let Some(img) = status.image else {
        refuse!("no such image: {name}");
    };
    let info: serde_json::Value = status
        .info
        .get("info")
        .and_then(|i| serde_json::from_str(i).ok())
        .unwrap_or(serde_json::Value::Null);
    let out = serde_json::json!({ "status": img, "info": info });
    println!("{}", super::json_text(&out)?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_name_and_tag() {
        assert_eq!(
            name_tag("docker.io/library/busybox:1.36"),
            ("docker.io/library/busybox".into(), "1.36".into())
        );
        assert_eq!(
            name_tag("127.0.0.1:5000/busybox:x"),
            ("127.0.0.1:5000/busybox".into(), "x".into())
        );
        assert_eq!(
            name_tag("127.0.0.1:5000/busybox"),
            ("127.0.0.1:5000/busybox".into(), "<none>".into())
        );
    }
}
