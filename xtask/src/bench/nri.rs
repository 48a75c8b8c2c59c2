//! A container start with an NRI logger connected (crius's own test plugin on NRI's published
//! stub, `hack/clients/nri-logger`: it is told of every event and validates every adjustment),
//! beside the same operation with no plugin, in the same run: what a plugin costs a container
//! start, for every runtime. Skipped, with a line, when the plugin is not built.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::report::Results;
use super::{Rt, timed};

/// The logger (crius's own NRI test plugin, `hack/clients`), or None when it is not built.
pub fn logger() -> Result<Option<std::path::PathBuf>> {
    let found = crate::upstream::find("clients", "nri-logger")?;
    if found.is_none() {
        eprintln!("bench: skipped the nri-logger rows: run hack/install-upstream.sh clients");
    }
    Ok(found)
}

/// Five container starts in a ready pod with the logger connected to `socket`.
pub async fn logger_rows(
    rt: &mut Rt,
    logger: &Path,
    socket: &Path,
    busybox: &str,
    res: &mut Results,
) -> Result<()> {
    let log = socket.with_file_name("nri-logger.log");
    let _ = std::fs::remove_file(&log);
    let mut child = Command::new(logger)
        .args(["-idx", "10", "-socket-path"])
        .arg(socket)
        .arg("-log-file")
        .arg(&log)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting nri-logger")?;
    let started = Instant::now();
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("Synchronize")
    {
        if started.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            let _ = child.wait();
            bail!("nri-logger did not connect to {}", socket.display());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let result = async {
        let (pod, sb) = rt.run_pod().await?;
        for _ in 0..5 {
            let (_, ms) = timed(rt.start_container(&pod, &sb, busybox)).await?;
            res.add(
                "container create+start, nri-logger connected",
                "ms",
                rt.name(),
                ms,
            );
        }
        rt.remove_pod(&pod).await
    }
    .await;
    let _ = child.kill();
    let _ = child.wait();
    result
}
