//! Starting the pause process (`crius pause`) that holds a pod's namespaces, on the built-in
//! pause or a configured pause image mounted for it.

use super::{
    Digest, Duration, Error, MsFlags, PathBuf, Paths, PauseConfig, PauseImage, PauseReport,
    Placement, ProcessId, io_err, runtime,
};
use tokio::io::AsyncBufReadExt;

/// A configured pause image, resolved and unpacked by the caller: its layers and its command.
#[derive(Debug, Clone)]
pub struct SandboxImage {
    /// The image's top snapshot, held while a pod runs on it.
    pub chain: Option<Digest>,
    /// Overlay lower directories, topmost first.
    pub lowerdirs: Vec<PathBuf>,
    /// Entrypoint followed by command.
    pub args: Vec<String>,
    pub env: Vec<String>,
    /// The image config's `User`: numeric `uid[:gid]`, or empty for root.
    pub user: String,
    pub cwd: String,
}

impl SandboxImage {
    fn ids(&self) -> Result<(u32, u32), Error> {
        let bad = || Error::Pause {
            message: format!(
                "the pause image's user {:?} is not numeric (uid or uid:gid)",
                self.user
            ),
        };
        if self.user.is_empty() {
            return Ok((0, 0));
        }
        let (u, g) = self.user.split_once(':').unwrap_or((&self.user, ""));
        let uid: u32 = u.parse().map_err(|_| bad())?;
        let gid: u32 = if g.is_empty() {
            uid
        } else {
            g.parse().map_err(|_| bad())?
        };
        Ok((uid, gid))
    }
}

/// Starts the pause process and waits for its report. It then waits for `keep` to be called,
/// once the pod's record is written, and ends if that never comes.
pub(super) async fn spawn_pause(
    cfg: &PauseConfig,
    placement: Option<Placement>,
) -> Result<(ProcessId, Keeper), Error> {
    let json = serde_json::to_string(cfg).map_err(|e| Error::Pause {
        message: e.to_string(),
    })?;
    let spawned = tokio::process::Command::new(runtime::exe::helper())
        .arg0("crius")
        .arg("pause")
        .arg(json)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn();
    let mut child = spawned.map_err(|e| Error::Pause {
        message: format!("spawn: {e}"),
    })?;
    let stdout = child.stdout.take().ok_or_else(|| Error::Pause {
        message: "no stdout".into(),
    })?;
    let mut stdin = child.stdin.take();
    if let Some(p) = placement {
        let pid = child.id().unwrap_or(0) as i32;
        let placed = p.start(pid, &[]).await;
        Placement::answer(stdin.as_mut(), &placed).await;
        if let Err(e) = placed {
            let _ = child.start_kill();
            return Err(e.into());
        }
    }
    let mut line = String::new();
    let read = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::io::BufReader::new(stdout).read_line(&mut line),
    )
    .await;
    // The child is left to tokio, which reaps it when it exits.
    drop(child);
    match read {
        Err(_) => {
            return Err(Error::Pause {
                message: "no answer within 30 s".into(),
            });
        }
        Ok(Err(e)) => {
            return Err(Error::Pause {
                message: e.to_string(),
            });
        }
        Ok(Ok(_)) => {}
    }
    match serde_json::from_str::<PauseReport>(line.trim()) {
        Ok(PauseReport::Ready { pid, start_time }) => {
            crate::fault::point("pause.spawn.after");
            Ok((ProcessId { pid, start_time }, Keeper(stdin)))
        }
        Ok(PauseReport::Failed { message }) => Err(Error::Pause { message }),
        Ok(PauseReport::Refused { sysctl, message }) => Err(super::invalid(
            &format!("config.linux.sysctls[{sysctl}]"),
            message,
        )),
        Err(_) => Err(Error::Pause {
            message: format!("unexpected answer {:?}", line.trim()),
        }),
    }
}

/// Mounts the pause image's root filesystem (its layers under a writable layer of the pod's own)
/// at `rootfs` in the sandbox directory.
pub(super) fn mount_pause_image(
    paths: &Paths,
    image: &SandboxImage,
    label: Option<&str>,
) -> Result<PauseImage, Error> {
    let (uid, gid) = image.ids()?;
    let rootfs = paths.dir.join("rootfs");
    runtime::mounts::overlay(
        &rootfs,
        &image.lowerdirs,
        &paths.dir.join("layer"),
        MsFlags::MS_NODEV | MsFlags::MS_NOSUID,
        label,
    )
    .map_err(io_err(&rootfs))?;
    Ok(PauseImage {
        rootfs,
        args: image.args.clone(),
        env: image.env.clone(),
        uid,
        gid,
        cwd: image.cwd.clone(),
    })
}

/// The way to tell a helper (pause or monitor) that a record now owns what it started; a
/// helper whose keeper is dropped without `keep` ends (`runtime::await_kept`).
pub(crate) struct Keeper(pub(crate) Option<tokio::process::ChildStdin>);

impl Keeper {
    pub(crate) async fn keep(mut self) {
        if let Some(s) = self.0.as_mut() {
            let _ = tokio::io::AsyncWriteExt::write_all(s, runtime::KEPT).await;
        }
    }
}
