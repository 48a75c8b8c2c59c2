//! Pod start under an upstream kubelet, with its relisting PLEG and with EventedPLEG (crius's
//! GetContainerEvents): `tests/pod_start.rs` run in the VM (kubelet changes the machine it runs
//! on), against the benchmark's crius binary. crius only, for now.

use std::path::Path;

use anyhow::{Context, Result, bail};

pub struct PodStart {
    pub relist_ms: Vec<f64>,
    pub evented_ms: Vec<f64>,
}

/// `pods` pods started one after another in each mode; None (with a line saying why) where
/// there is no kubelet or no VM.
pub fn pod_start(crius_bin: &Path, pods: usize) -> Result<Option<PodStart>> {
    if crate::upstream::find("kubernetes", "kubelet")?.is_none() {
        eprintln!(
            "bench: skipped: pod start under kubelet: run hack/install-upstream.sh kubernetes"
        );
        return Ok(None);
    }
    let qemu = std::process::Command::new("sh")
        .args(["-c", "command -v qemu-system-x86_64"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !qemu {
        eprintln!(
            "bench: skipped: pod start under kubelet: no qemu (hack/install-vm-deps.sh installs it)"
        );
        return Ok(None);
    }
    let bins = crate::test_binaries(&["pod_start"])?;
    let Some((_, exe)) = bins.first() else {
        bail!("building tests/pod_start.rs gave no executable");
    };
    let mut bin =
        std::fs::canonicalize(crius_bin).with_context(|| format!("{}", crius_bin.display()))?;
    // The VM sees the host's root, but not its /tmp: a binary given from outside the project
    // (`--crius /tmp/...`) is copied into it first, or the run ends here, after all the rest.
    let project = std::env::current_dir()?;
    if !bin.starts_with(&project) {
        let copy = project.join("target/bench/crius-for-the-vm");
        std::fs::create_dir_all(project.join("target/bench"))?;
        std::fs::copy(&bin, &copy).with_context(|| format!("copying {}", bin.display()))?;
        bin = copy;
    }
    let mut cmd = crate::vm::command(&[], 1500)?;
    cmd.args(["--", "env"])
        .arg(format!("CRIUS_TEST_BIN={}", bin.display()))
        .arg(format!("CRIUS_BENCH_PODS={pods}"))
        .arg(exe)
        .args([
            "--include-ignored",
            "--exact",
            "pod_start_latency",
            "--nocapture",
        ]);
    eprintln!("bench: running {cmd:?}");
    let out = cmd
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("running the pod start measurement in the VM")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let Some(line) = text.lines().find_map(|l| l.strip_prefix("BENCH ")) else {
        bail!(
            "the pod start measurement printed no result ({}):\n{text}",
            out.status
        );
    };
    let v: serde_json::Value = serde_json::from_str(line)?;
    let list = |k: &str| -> Vec<f64> {
        v[k].as_array()
            .into_iter()
            .flatten()
            .filter_map(|x| x.as_f64())
            .collect()
    };
    Ok(Some(PodStart {
        relist_ms: list("relist_ms"),
        evented_ms: list("evented_ms"),
    }))
}
