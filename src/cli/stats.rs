//! `stats`, `statsp` and `imagefsinfo`: what the runtime measures for containers, pods and its
//! image filesystem (CRI's stats calls, as kubelet reads them), as a table, JSON or YAML.

use std::path::Path;

use super::Result;

use super::{Output, connect, human_size, print_structured, print_table, rpc_error};
use crate::cri::client;
use crate::cri::v1 as cri;

/// The ID the runtime filters by: only when exactly one is asked for (it takes one).
fn single(ids: &[String]) -> String {
    match ids {
        [one] => one.clone(),
        _ => String::new(),
    }
}

/// With several IDs asked for, keeps the entries whose ID one of them starts; sorted by ID.
fn select<T>(stats: &mut Vec<T>, ids: &[String], id_of: impl Fn(&T) -> &str) {
    if ids.len() > 1 {
        stats.retain(|s| ids.iter().any(|i| id_of(s).starts_with(i.as_str())));
    }
    stats.sort_by(|a, b| id_of(a).cmp(id_of(b)));
}

fn container_id(s: &cri::ContainerStats) -> &str {
    s.attributes.as_ref().map_or("", |a| a.id.as_str())
}

fn pod_id(s: &cri::PodSandboxStats) -> &str {
    s.attributes.as_ref().map_or("", |a| a.id.as_str())
}

/// CPU use as crictl shows it: percent of one core.
fn cpu_percent(cpu: Option<&cri::CpuUsage>) -> String {
    cpu.and_then(|c| c.usage_nano_cores.as_ref())
        .map(|n| format!("{:.2}", n.value as f64 / 1e7))
        .unwrap_or_else(|| "-".into())
}

fn bytes(v: Option<&cri::UInt64Value>) -> String {
    v.map(|v| human_size(v.value)).unwrap_or_else(|| "-".into())
}

/// `crius stats [CTR...] [--pod POD]`: running containers' CPU, memory and writable layer.
pub async fn stats(socket: &Path, ids: &[String], pod: Option<&str>, output: Output) -> Result<()> {
    let filter = cri::ContainerStatsFilter {
        id: single(ids),
        pod_sandbox_id: pod.unwrap_or_default().to_string(),
        ..Default::default()
    };
    let mut stats = client::runtime(connect(socket)?)
        .list_container_stats(cri::ListContainerStatsRequest {
            filter: Some(filter),
        })
        .await
        .map_err(|s| rpc_error("listing container stats", socket, s))?
        .into_inner()
        .stats;
    select(&mut stats, ids, container_id);
    if print_structured(&serde_json::json!({ "stats": stats }), output)? {
        return Ok(());
    }
    let mut rows = vec![
        ["CONTAINER", "NAME", "CPU %", "MEM", "DISK", "INODES"]
            .map(String::from)
            .to_vec(),
    ];
    for s in &stats {
        let name = s
            .attributes
            .as_ref()
            .and_then(|a| a.metadata.as_ref())
            .map(|m| m.name.clone())
            .unwrap_or_default();
        let layer = s.writable_layer.as_ref();
        rows.push(vec![
            super::short_id(container_id(s)),
            name,
            cpu_percent(s.cpu.as_ref()),
            bytes(s.memory.as_ref().and_then(|m| m.working_set_bytes.as_ref())),
            bytes(layer.and_then(|l| l.used_bytes.as_ref())),
            layer
                .and_then(|l| l.inodes_used.as_ref())
                .map(|i| i.value.to_string())
                .unwrap_or_else(|| "-".into()),
        ]);
    }
    print_table(&rows);
    Ok(())
}

/// `crius statsp [POD...]`: pods' CPU, memory, network and processes.
pub async fn statsp(socket: &Path, ids: &[String], output: Output) -> Result<()> {
    let filter = cri::PodSandboxStatsFilter {
        id: single(ids),
        ..Default::default()
    };
    let mut stats = client::runtime(connect(socket)?)
        .list_pod_sandbox_stats(cri::ListPodSandboxStatsRequest {
            filter: Some(filter),
        })
        .await
        .map_err(|s| rpc_error("listing pod stats", socket, s))?
        .into_inner()
        .stats;
    select(&mut stats, ids, pod_id);
    if print_structured(&serde_json::json!({ "stats": stats }), output)? {
        return Ok(());
    }
    let mut rows = vec![
        [
            "POD",
            "NAME",
            "CPU %",
            "MEM",
            "NET RX",
            "NET TX",
            "PROCESSES",
        ]
        .map(String::from)
        .to_vec(),
    ];
    for s in &stats {
        let name = s
            .attributes
            .as_ref()
            .and_then(|a| a.metadata.as_ref())
            .map(|m| m.name.clone())
            .unwrap_or_default();
        let linux = s.linux.as_ref();
        let iface = linux
            .and_then(|l| l.network.as_ref())
            .and_then(|n| n.default_interface.as_ref());
        rows.push(vec![
            super::short_id(pod_id(s)),
            name,
            cpu_percent(linux.and_then(|l| l.cpu.as_ref())),
            bytes(
                linux
                    .and_then(|l| l.memory.as_ref())
                    .and_then(|m| m.working_set_bytes.as_ref()),
            ),
            bytes(iface.and_then(|i| i.rx_bytes.as_ref())),
            bytes(iface.and_then(|i| i.tx_bytes.as_ref())),
            linux
                .and_then(|l| l.process.as_ref())
                .and_then(|p| p.process_count.as_ref())
                .map(|c| c.value.to_string())
                .unwrap_or_else(|| "-".into()),
        ]);
    }
    print_table(&rows);
    Ok(())
}

/// `crius imagefsinfo`: where images and writable layers live, and how full.
pub async fn imagefsinfo(socket: &Path, output: Output) -> Result<()> {
    let info = client::images(connect(socket)?)
        .image_fs_info(cri::ImageFsInfoRequest {})
        .await
        .map_err(|s| rpc_error("image filesystem info", socket, s))?
        .into_inner();
    if print_structured(&info, output)? {
        return Ok(());
    }
    let mut rows = vec![
        ["KIND", "MOUNTPOINT", "USED", "INODES"]
            .map(String::from)
            .to_vec(),
    ];
    let kinds = info
        .image_filesystems
        .iter()
        .map(|f| ("images", f))
        .chain(info.container_filesystems.iter().map(|f| ("containers", f)));
    for (kind, f) in kinds {
        rows.push(vec![
            kind.to_string(),
            f.fs_id
                .as_ref()
                .map(|i| i.mountpoint.clone())
                .unwrap_or_default(),
            bytes(f.used_bytes.as_ref()),
            f.inodes_used
                .as_ref()
                .map(|i| i.value.to_string())
                .unwrap_or_else(|| "-".into()),
        ]);
    }
    print_table(&rows);
    Ok(())
}
