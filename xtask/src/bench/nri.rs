//! crius's container start with upstream's `nri-logger` connected (it is told of every event
//! and validates every adjustment), beside the same operation with no plugin, in the same
//! run: what a plugin costs a container start. Skipped, with a line, when the plugin is not in
//! `../shared/bin/nri/`.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::report::Results;
use super::{Rt, timed};

const LOGGER: &str = "../shared/bin/nri/nri-logger.xz";

/// Unpacks the logger into `dir`; None when it is not here.
pub fn unpack_logger(dir: &Path) -> Result<Option<std::path::PathBuf>> {
    if !Path::new(LOGGER).is_file() {
        eprintln!("bench: skipped the nri-logger rows: {LOGGER} is missing");
        return Ok(None);
    }
    std::fs::create_dir_all(dir)?;
    let bin = dir.join("nri-logger");
    let ok = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "xz -dc {LOGGER} > '{0}' && chmod 755 '{0}'",
            bin.display()
        ))
        .status()?
        .success();
    if !ok {
        bail!("unpacking {LOGGER}");
    }
    Ok(Some(bin))
}

/// Five container starts in a ready pod with the logger connected to `socket`.
pub async fn logger_rows(
    rt: &mut Rt,
    logger: &Path,
    socket: &Path,
    busybox: &str,
    res: &mut Results,
) -> Result<()> {
    let log = logger.with_extension("log");
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
