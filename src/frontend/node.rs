//! node: what the agent does on the node itself, as kubelet does, rather than through CRI:
//! tmpfs mounts for volumes that must stay in memory (secret and configMap data, emptyDir with
//! `medium: Memory`). Secrets must never reach a swap device, so they are mounted `noswap`
//! where the kernel has it (6.4 and later); on an older kernel crius warns, once, that swapped
//! secrets may reach the disk. Uses `nix` only.

use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use nix::mount::{MsFlags, mount};

static WARNED: AtomicBool = AtomicBool::new(false);

/// Mounts a tmpfs at `target` with `mode`, and `size` bytes when not zero. With `noswap`, asks
/// the kernel to keep it out of swap; returns whether it did.
pub fn mount_tmpfs(target: &Path, size: u64, mode: u32, noswap: bool) -> io::Result<bool> {
    let mut opts = format!("mode={mode:o}");
    if size > 0 {
        opts.push_str(&format!(",size={size}"));
    }
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    if noswap {
        let with = format!("{opts},noswap");
        match mount(
            Some("tmpfs"),
            target,
            Some("tmpfs"),
            flags,
            Some(with.as_str()),
        ) {
            Ok(()) => return Ok(true),
            // An older kernel does not know the option.
            Err(nix::errno::Errno::EINVAL) => {
                if !WARNED.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        "this kernel has no tmpfs noswap (Linux 6.4+): secret volumes may be swapped to disk"
                    );
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
    mount(
        Some("tmpfs"),
        target,
        Some("tmpfs"),
        flags,
        Some(opts.as_str()),
    )?;
    Ok(false)
}

/// Whether a mount point's options include `noswap` (from /proc/self/mountinfo).
pub fn is_noswap(target: &Path) -> bool {
    let t = target.display().to_string();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .rfind(|l| l.split(' ').nth(4) == Some(t.as_str()))
        .is_some_and(|l| l.contains("noswap"))
}
