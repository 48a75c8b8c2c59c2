//! `crius pods`, `ps`, `exec`, `logs`, `stop`, `rm`, `stopp`, `rmp`, `inspect`, `inspectp`.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::time::{Duration, SystemTime};

use super::{Doing, OrRefuse, Result, refuse};
use crate::cri::v1 as cri;

use super::{
    Output, connect, json_text, json_value, print_structured, print_table, rpc_error, short_id,
};
use crate::cri::client;

/// "3 minutes ago" for a Unix time in nanoseconds.
pub fn ago(ns: i64) -> String {
    let then = SystemTime::UNIX_EPOCH + Duration::from_nanos(ns.max(0) as u64);
    let secs = SystemTime::now()
        .duration_since(then)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (n, unit) = match secs {
        0..=59 => (secs, "second"),
        60..=3599 => (secs / 60, "minute"),
        3600..=86399 => (secs / 3600, "hour"),
        _ => (secs / 86400, "day"),
    };
    if secs < 2 {
        return "just now".into();
    }
    format!("{n} {unit}{} ago", if n == 1 { "" } else { "s" })
}

fn pod_state(s: i32) -> &'static str {
    if s == cri::PodSandboxState::SandboxReady as i32 {
        "Ready"
    } else {
        "NotReady"
    }
}

fn container_state(s: i32) -> &'static str {
    match cri::ContainerState::try_from(s) {
        Ok(cri::ContainerState::ContainerCreated) => "Created",
        Ok(cri::ContainerState::ContainerRunning) => "Running",
        Ok(cri::ContainerState::ContainerExited) => "Exited",
        _ => "Unknown",
    }
}

pub async fn pods(socket: &Path, name: Option<&str>, quiet: bool, output: Output) -> Result<()> {
    let items = client::runtime(connect(socket)?)
        .list_pod_sandbox(cri::ListPodSandboxRequest { filter: None })
        .await
        .map_err(|s| rpc_error("listing pods", socket, s))?
        .into_inner()
        .items;
    let items: Vec<cri::PodSandbox> = items
        .into_iter()
        .filter(|p| name.is_none_or(|n| p.metadata.as_ref().is_some_and(|m| m.name.contains(n))))
        .collect();
    if print_structured(&serde_json::json!({ "items": items }), output)? {
        return Ok(());
    }
    if quiet {
        items.iter().for_each(|p| println!("{}", p.id));
        return Ok(());
    }
    let mut rows = vec![
        [
            "POD ID",
            "CREATED",
            "STATE",
            "NAME",
            "NAMESPACE",
            "ATTEMPT",
            "RUNTIME",
        ]
        .map(String::from)
        .to_vec(),
    ];
    for p in &items {
        let m = p.metadata.clone().unwrap_or_default();
        let runtime = if p.runtime_handler.is_empty() {
            "(default)".to_string()
        } else {
            p.runtime_handler.clone()
        };
        rows.push(vec![
            short_id(&p.id),
            ago(p.created_at),
            pod_state(p.state).into(),
            m.name,
            m.namespace,
            m.attempt.to_string(),
            runtime,
        ]);
    }
    print_table(&rows);
    Ok(())
}

pub async fn ps(
    socket: &Path,
    all: bool,
    pod: Option<&str>,
    quiet: bool,
    output: Output,
) -> Result<()> {
    let filter = cri::ContainerFilter {
        pod_sandbox_id: pod.unwrap_or_default().to_string(),
        state: (!all).then_some(cri::ContainerStateValue {
            state: cri::ContainerState::ContainerRunning as i32,
        }),
        ..Default::default()
    };
    let containers = client::runtime(connect(socket)?)
        .list_containers(cri::ListContainersRequest {
            filter: Some(filter),
        })
        .await
        .map_err(|s| rpc_error("listing containers", socket, s))?
        .into_inner()
        .containers;
    if print_structured(&serde_json::json!({ "containers": containers }), output)? {
        return Ok(());
    }
    if quiet {
        containers.iter().for_each(|c| println!("{}", c.id));
        return Ok(());
    }
    let mut rows = vec![
        [
            "CONTAINER",
            "IMAGE",
            "CREATED",
            "STATE",
            "NAME",
            "ATTEMPT",
            "POD ID",
        ]
        .map(String::from)
        .to_vec(),
    ];
    for c in &containers {
        let m = c.metadata.clone().unwrap_or_default();
        let image = c
            .image
            .as_ref()
            .map(|i| i.image.clone())
            .unwrap_or_default();
        let image = if image.starts_with("sha256:") {
            short_id(&image)
        } else {
            image
        };
        rows.push(vec![
            short_id(&c.id),
            image,
            ago(c.created_at),
            container_state(c.state).into(),
            m.name,
            m.attempt.to_string(),
            short_id(&c.pod_sandbox_id),
        ]);
    }
    print_table(&rows);
    Ok(())
}

/// Runs a command in a container (ExecSync) and exits with its code.
pub async fn exec(socket: &Path, container: &str, cmd: &[String], timeout: i64) -> Result<i32> {
    let resp = client::runtime(connect(socket)?)
        .exec_sync(cri::ExecSyncRequest {
            container_id: container.to_string(),
            cmd: cmd.to_vec(),
            timeout,
        })
        .await
        .map_err(|s| rpc_error(&format!("exec in {container}"), socket, s))?
        .into_inner();
    std::io::stdout()
        .write_all(&resp.stdout)
        .doing(|| "writing the command's output".into())?;
    std::io::stderr()
        .write_all(&resp.stderr)
        .doing(|| "writing the command's errors".into())?;
    Ok(resp.exit_code)
}

async fn container_status(socket: &Path, id: &str) -> Result<cri::ContainerStatus> {
    client::runtime(connect(socket)?)
        .container_status(cri::ContainerStatusRequest {
            container_id: id.into(),
            verbose: false,
        })
        .await
        .map_err(|s| rpc_error(&format!("container {id}"), socket, s))?
        .into_inner()
        .status
        .or_refuse(|| format!("container {id}: the runtime returned no status"))
}

/// Prints CRI log lines: partial pieces are joined, each line goes to stdout or stderr as it
/// came. Returns the bytes of `data` consumed (a trailing incomplete line waits).
fn print_log(data: &[u8], timestamps: bool, partial: &mut Vec<u8>) -> Result<usize> {
    let mut used = 0;
    let mut out = std::io::stdout().lock();
    let mut err = std::io::stderr().lock();
    while let Some(nl) = data[used..].iter().position(|&b| b == b'\n') {
        let line = &data[used..used + nl];
        used += nl + 1;
        let mut parts = line.splitn(4, |&b| b == b' ');
        let (Some(ts), Some(stream), Some(tag)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        partial.extend_from_slice(parts.next().unwrap_or_default());
        if tag == b"P" {
            continue;
        }
        let mut text = Vec::new();
        if timestamps {
            text.extend_from_slice(ts);
            text.push(b' ');
        }
        text.append(partial);
        text.push(b'\n');
        let printing = || "printing the log".to_string();
        if stream == b"stderr" {
            err.write_all(&text).doing(printing)?
        } else {
            out.write_all(&text).doing(printing)?
        }
    }
    out.flush().doing(|| "printing the log".into())?;
    Ok(used)
}

pub async fn logs(
    socket: &Path,
    container: &str,
    follow: bool,
    tail: Option<usize>,
    timestamps: bool,
) -> Result<()> {
    let status = container_status(socket, container).await?;
    if status.log_path.is_empty() {
        refuse!("container {container} has no log file");
    }
    let path = std::path::PathBuf::from(&status.log_path);
    let mut file = std::fs::File::open(&path).doing(|| format!("opening {}", path.display()))?;
    let mut data = Vec::new();
    let reading = || format!("reading {}", path.display());
    file.read_to_end(&mut data).doing(reading)?;
    if let Some(n) = tail {
        let lines: Vec<&[u8]> = data.split_inclusive(|&b| b == b'\n').collect();
        let keep = lines.len().saturating_sub(n);
        data = lines[keep..].concat();
    }
    let mut partial = Vec::new();
    let used = print_log(&data, timestamps, &mut partial)?;
    let mut pending = data[used..].to_vec();
    if !follow {
        return Ok(());
    }
    let mut inode = std::os::unix::fs::MetadataExt::ino(&file.metadata().doing(reading)?);
    let mut pos = file.stream_position().doing(reading)?;
    loop {
        let mut chunk = Vec::new();
        file.seek(SeekFrom::Start(pos)).doing(reading)?;
        file.read_to_end(&mut chunk).doing(reading)?;
        pos += chunk.len() as u64;
        if !chunk.is_empty() {
            pending.extend_from_slice(&chunk);
            let used = print_log(&pending, timestamps, &mut partial)?;
            pending.drain(..used);
            continue;
        }
        // kubelet may have rotated the file: follow the new one.
        if let Ok(m) = std::fs::metadata(&path)
            && std::os::unix::fs::MetadataExt::ino(&m) != inode
        {
            file = std::fs::File::open(&path).doing(|| format!("opening {}", path.display()))?;
            inode = std::os::unix::fs::MetadataExt::ino(&m);
            pos = 0;
            continue;
        }
        let st = container_status(socket, container).await?;
        if st.state != cri::ContainerState::ContainerRunning as i32 {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

pub async fn stop(socket: &Path, ids: &[String], timeout: i64) -> Result<()> {
    let mut rt = client::runtime(connect(socket)?);
    for id in ids {
        rt.stop_container(cri::StopContainerRequest {
            container_id: id.clone(),
            timeout,
        })
        .await
        .map_err(|s| rpc_error(&format!("stopping {id}"), socket, s))?;
        println!("{id}");
    }
    Ok(())
}

pub async fn rm(socket: &Path, ids: &[String], force: bool) -> Result<()> {
    let mut rt = client::runtime(connect(socket)?);
    for id in ids {
        if !force {
            let st = container_status(socket, id).await?;
            if st.state == cri::ContainerState::ContainerRunning as i32 {
                refuse!("container {id} is running: stop it first or use --force");
            }
        }
        rt.remove_container(cri::RemoveContainerRequest {
            container_id: id.clone(),
        })
        .await
        .map_err(|s| rpc_error(&format!("removing {id}"), socket, s))?;
        println!("{id}");
    }
    Ok(())
}

pub async fn stop_pods(socket: &Path, ids: &[String]) -> Result<()> {
    let mut rt = client::runtime(connect(socket)?);
    for id in ids {
        rt.stop_pod_sandbox(cri::StopPodSandboxRequest {
            pod_sandbox_id: id.clone(),
        })
        .await
        .map_err(|s| rpc_error(&format!("stopping pod {id}"), socket, s))?;
        println!("Stopped sandbox {id}");
    }
    Ok(())
}

pub async fn rm_pods(socket: &Path, ids: &[String]) -> Result<()> {
    let mut rt = client::runtime(connect(socket)?);
    for id in ids {
        rt.remove_pod_sandbox(cri::RemovePodSandboxRequest {
            pod_sandbox_id: id.clone(),
        })
        .await
        .map_err(|s| rpc_error(&format!("removing pod {id}"), socket, s))?;
        println!("Removed sandbox {id}");
    }
    Ok(())
}

fn with_info(
    status: serde_json::Value,
    info: &std::collections::HashMap<String, String>,
) -> serde_json::Value {
    // "info" is the runtime's own object; every other key (the pod's network attachment, say)
    // joins it, as JSON where it is JSON.
    let parse = |v: &String| {
        serde_json::from_str(v).unwrap_or_else(|_| serde_json::Value::String(v.clone()))
    };
    let mut merged = match info.get("info").map(parse) {
        Some(serde_json::Value::Object(m)) => m,
        _ => serde_json::Map::new(),
    };
    for (k, v) in info.iter().filter(|(k, _)| *k != "info") {
        merged.insert(k.clone(), parse(v));
    }
    serde_json::json!({ "status": status, "info": merged })
}

pub async fn inspect(socket: &Path, id: &str) -> Result<()> {
    let r = client::runtime(connect(socket)?)
        .container_status(cri::ContainerStatusRequest {
            container_id: id.into(),
            verbose: true,
        })
        .await
        .map_err(|s| rpc_error(&format!("container {id}"), socket, s))?
        .into_inner();
    println!(
        "{}",
        json_text(&with_info(json_value(&r.status)?, &r.info))?
    );
    Ok(())
}

pub async fn inspect_pod(socket: &Path, id: &str) -> Result<()> {
    let r = client::runtime(connect(socket)?)
        .pod_sandbox_status(cri::PodSandboxStatusRequest {
            pod_sandbox_id: id.into(),
            verbose: true,
        })
        .await
        .map_err(|s| rpc_error(&format!("pod {id}"), socket, s))?
        .into_inner();
    println!(
        "{}",
        json_text(&with_info(json_value(&r.status)?, &r.info))?
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_times() {
        let now = crate::records::now_nanos();
        assert_eq!(ago(now), "just now");
        assert_eq!(ago(now - 90 * 1_000_000_000), "1 minute ago");
        assert_eq!(ago(now - 3 * 3600 * 1_000_000_000), "3 hours ago");
    }

    #[test]
    fn log_lines_join_partials() {
        let mut partial = Vec::new();
        let data = b"2024-01-01T00:00:00Z stdout P ab\n2024-01-01T00:00:00Z stdout F cd\n2024-01-01T00:00:00Z stdout F inc";
        let used = print_log(data, false, &mut partial).unwrap();
        assert_eq!(used, data.len() - "2024-01-01T00:00:00Z stdout F inc".len());
        assert!(partial.is_empty());
    }
}
