//! Running one CNI plugin as the CNI specification says: the executable named by `type` from
//! the plugin directories, the operation and the pod in environment variables (`CNI_COMMAND`,
//! `CNI_CONTAINERID`, `CNI_NETNS`, `CNI_IFNAME`, `CNI_ARGS`, `CNI_PATH`), the plugin's
//! configuration on stdin with the list's `name` and `cniVersion`, the previous plugin's result
//! (`prevResult`) and the runtime's values for the capabilities it declares (`runtimeConfig`).
//! A plugin is a program crius did not write: its output is bounded, its time is limited, and
//! its failures (the spec's error object, or whatever it printed) become errors that name it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Map, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// What a plugin may print before it is cut off.
const MAX_OUTPUT: u64 = 1 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Add,
    Del,
    Check,
    /// CNI 1.1: whether the plugin is ready for ADDs.
    Status,
    /// CNI 1.1: the plugin drops what it holds for attachments the runtime no longer has.
    Gc,
}

impl Op {
    pub fn word(self) -> &'static str {
        match self {
            Op::Add => "ADD",
            Op::Del => "DEL",
            Op::Check => "CHECK",
            Op::Status => "STATUS",
            Op::Gc => "GC",
        }
    }

    /// Whether the operation is about one attachment (the spec's per-container variables go
    /// with it); STATUS and GC are about the network as a whole.
    fn per_attachment(self) -> bool {
        matches!(self, Op::Add | Op::Del | Op::Check)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    #[error("CNI plugin {plugin:?} is not in {dirs}")]
    NotFound { plugin: String, dirs: String },
    #[error("CNI plugin {path}: {source}")]
    Spawn {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("CNI plugin {plugin} ({network}) {op}: {message}")]
    Failed {
        plugin: String,
        network: String,
        op: &'static str,
        message: String,
    },
    #[error("CNI plugin {plugin} ({network}) {op} gave no result in {seconds} s")]
    Timeout {
        plugin: String,
        network: String,
        op: &'static str,
        seconds: u64,
    },
}

/// One operation for one pod.
pub struct Call<'a> {
    pub op: Op,
    pub container_id: &'a str,
    pub netns: &'a Path,
    pub ifname: &'a str,
    /// `CNI_ARGS`: `K=V;K=V`.
    pub args: &'a str,
    pub bin_dirs: &'a [PathBuf],
    pub timeout: Duration,
}

/// Plugin processes running for `container_id` (their `CNI_CONTAINERID`): those a killed
/// daemon started are still running after it, and a DEL must not race them (an ADD that ends
/// after the DEL holds an address no one owns).
fn running_for(container_id: &str) -> Vec<nix::unistd::Pid> {
    let want = format!("CNI_CONTAINERID={container_id}");
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(env) = std::fs::read(e.path().join("environ")) else {
            continue;
        };
        if env.split(|b| *b == 0).any(|v| v == want.as_bytes()) {
            out.push(nix::unistd::Pid::from_raw(pid));
        }
    }
    out
}

/// Waits, up to `limit`, for the plugins a killed daemon left running for `container_id` to
/// end, then kills those that have not.
pub async fn settle_orphans(container_id: &str, limit: Duration) {
    let started = std::time::Instant::now();
    loop {
        let id = container_id.to_string();
        let left = tokio::task::spawn_blocking(move || running_for(&id))
            .await
            .unwrap_or_default();
        if left.is_empty() {
            return;
        }
        if started.elapsed() >= limit {
            tracing::warn!(
                container = container_id,
                plugins = left.len(),
                "killing CNI plugins a killed daemon left running"
            );
            for pid in left {
                let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
            }
            return;
        }
        tracing::info!(
            container = container_id,
            plugins = left.len(),
            "waiting for CNI plugins a killed daemon left running"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The executable of plugin `kind` in the first directory that has it.
pub fn find(kind: &str, dirs: &[PathBuf]) -> Result<PathBuf, PluginError> {
    dirs.iter()
        .map(|d| d.join(kind))
        .find(|p| p.is_file())
        .ok_or_else(|| PluginError::NotFound {
            plugin: kind.to_string(),
            dirs: dirs
                .iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
        })
}

/// The configuration a plugin of the list reads on stdin.
pub fn stdin_config(
    plugin: &Value,
    name: &str,
    cni_version: &str,
    prev_result: Option<&Value>,
    runtime: &Map<String, Value>,
) -> Value {
    let mut conf = plugin.as_object().cloned().unwrap_or_default();
    conf.insert("name".into(), Value::String(name.to_string()));
    conf.insert("cniVersion".into(), Value::String(cni_version.to_string()));
    if let Some(prev) = prev_result {
        conf.insert("prevResult".into(), prev.clone());
    }
    // Only what the plugin says it can take.
    let mut rc = Map::new();
    if let Some(caps) = plugin.get("capabilities").and_then(Value::as_object) {
        for (cap, on) in caps {
            if on.as_bool() == Some(true)
                && let Some(v) = runtime.get(cap)
            {
                rc.insert(cap.clone(), v.clone());
            }
        }
    }
    if !rc.is_empty() {
        conf.insert("runtimeConfig".into(), Value::Object(rc));
    }
    Value::Object(conf)
}

/// Runs the plugin with `conf` on stdin; its result for ADD (none for the others).
pub async fn run(call: &Call<'_>, conf: &Value) -> Result<Option<Value>, PluginError> {
    let kind = conf.get("type").and_then(Value::as_str).unwrap_or_default();
    run_kind(call, kind, conf).await
}

/// Runs plugin `kind` with `conf` on stdin, as a plugin runs its IPAM plugin (`conf` is the
/// delegating plugin's).
pub async fn run_kind(
    call: &Call<'_>,
    kind: &str,
    conf: &Value,
) -> Result<Option<Value>, PluginError> {
    let kind = kind.to_string();
    let network = conf
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let path = find(&kind, call.bin_dirs)?;
    let failed = |message: String| PluginError::Failed {
        plugin: kind.clone(),
        network: network.clone(),
        op: call.op.word(),
        message,
    };
    let cni_path = std::env::join_paths(call.bin_dirs)
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    match call.op {
        Op::Add => crate::fault::point("cni.add.before"),
        Op::Del => crate::fault::point("cni.del.before"),
        Op::Check | Op::Status | Op::Gc => {}
    }
    let started = std::time::Instant::now();
    let mut cmd = tokio::process::Command::new(&path);
    cmd.env_clear()
        // Plugins run iptables, ip and the like.
        .env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        )
        .env("CNI_COMMAND", call.op.word())
        .env("CNI_PATH", cni_path);
    if call.op.per_attachment() {
        cmd.env("CNI_CONTAINERID", call.container_id)
            .env("CNI_NETNS", call.netns)
            .env("CNI_IFNAME", call.ifname)
            .env("CNI_ARGS", call.args);
    }
    let mut child = cmd
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|source| PluginError::Spawn {
            path: path.clone(),
            source,
        })?;
    let input = serde_json::to_vec(conf).unwrap_or_default();
    let mut stdin = child.stdin.take();
    let mut stdout = child.stdout.take();
    let mut stderr = child.stderr.take();
    let work = async {
        if let Some(s) = stdin.as_mut() {
            // A plugin that exits without reading its input is judged by its exit status.
            let _ = s.write_all(&input).await;
        }
        drop(stdin.take());
        let mut out = Vec::new();
        let mut err = Vec::new();
        let read_out = async {
            if let Some(s) = stdout.as_mut() {
                let _ = s.take(MAX_OUTPUT).read_to_end(&mut out).await;
            }
        };
        let read_err = async {
            if let Some(s) = stderr.as_mut() {
                let _ = s.take(MAX_OUTPUT).read_to_end(&mut err).await;
            }
        };
        tokio::join!(read_out, read_err);
        let status = child.wait().await;
        (status, out, err)
    };
    let (status, out, err) = match tokio::time::timeout(call.timeout, work).await {
        Ok(r) => r,
        Err(_) => {
            return Err(PluginError::Timeout {
                plugin: kind,
                network,
                op: call.op.word(),
                seconds: call.timeout.as_secs(),
            });
        }
    };
    let status = status.map_err(|source| PluginError::Spawn {
        path: path.clone(),
        source,
    })?;
    let elapsed = started.elapsed();
    tracing::debug!(plugin = kind, op = call.op.word(), container = call.container_id, ?elapsed, status = ?status.code(), "CNI plugin ran");
    crate::metrics::global()
        .plugin_seconds
        .get_or_create(&crate::metrics::PluginRun {
            plugin: kind.clone(),
            operation: call.op.word().to_ascii_lowercase(),
        })
        .observe(elapsed.as_secs_f64());
    match call.op {
        Op::Add => crate::fault::point("cni.add.after"),
        Op::Del => crate::fault::point("cni.del.after"),
        Op::Check | Op::Status | Op::Gc => {}
    }
    if !status.success() {
        return Err(failed(error_message(&out, &err, status.code())));
    }
    if call.op != Op::Add {
        return Ok(None);
    }
    let result: Value = serde_json::from_slice(&out).map_err(|e| {
        failed(format!(
            "its result is not JSON ({e}): {}",
            String::from_utf8_lossy(&out)
                .chars()
                .take(200)
                .collect::<String>()
        ))
    })?;
    if !result.is_object() {
        return Err(failed("its result is not a JSON object".into()));
    }
    Ok(Some(result))
}

/// The spec's error object (`code`, `msg`, `details`), else what the plugin printed.
pub fn error_message(out: &[u8], err: &[u8], code: Option<i32>) -> String {
    if let Ok(v) = serde_json::from_slice::<Value>(out)
        && let Some(msg) = v.get("msg").and_then(Value::as_str)
    {
        let mut m = format!(
            "error {}: {msg}",
            v.get("code").and_then(Value::as_u64).unwrap_or(0)
        );
        if let Some(d) = v.get("details").and_then(Value::as_str)
            && !d.is_empty()
        {
            m.push_str(&format!(" ({d})"));
        }
        return m;
    }
    let text = String::from_utf8_lossy(if err.is_empty() { out } else { err });
    let text: String = text.trim().chars().take(500).collect();
    match code {
        Some(c) => format!("exit status {c}: {text}"),
        None => format!("killed by a signal: {text}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stdin_config_carries_list_values_prev_result_and_capabilities() {
        let plugin = serde_json::json!({
            "type": "portmap",
            "capabilities": {"portMappings": true, "bandwidth": false},
            "snat": true,
        });
        let mut rc = Map::new();
        rc.insert(
            "portMappings".into(),
            serde_json::json!([{"hostPort": 8080}]),
        );
        rc.insert("bandwidth".into(), serde_json::json!({"ingressRate": 1}));
        rc.insert("dns".into(), serde_json::json!({}));
        let prev = serde_json::json!({"ips": []});
        let c = stdin_config(&plugin, "net", "1.0.0", Some(&prev), &rc);
        assert_eq!(c["name"], "net");
        assert_eq!(c["cniVersion"], "1.0.0");
        assert_eq!(c["prevResult"], prev);
        assert_eq!(c["runtimeConfig"]["portMappings"][0]["hostPort"], 8080);
        assert!(c["runtimeConfig"].get("bandwidth").is_none());
        assert!(c["runtimeConfig"].get("dns").is_none());
        let bare = stdin_config(
            &serde_json::json!({"type": "bridge"}),
            "n",
            "1.0.0",
            None,
            &rc,
        );
        assert!(bare.get("runtimeConfig").is_none() && bare.get("prevResult").is_none());
    }

    #[test]
    fn errors_say_what_the_plugin_said() {
        let m = error_message(
            br#"{"cniVersion":"1.0.0","code":7,"msg":"failed to allocate","details":"range full"}"#,
            b"",
            Some(1),
        );
        assert_eq!(m, "error 7: failed to allocate (range full)");
        assert_eq!(
            error_message(b"", b"boom\n", Some(2)),
            "exit status 2: boom"
        );
        assert!(
            find("no-such-plugin", &[PathBuf::from("/nonexistent")])
                .unwrap_err()
                .to_string()
                .contains("/nonexistent")
        );
    }
}
