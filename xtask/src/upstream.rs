//! The upstream parts the bench and the VM tier use, each built from its published module by
//! `hack/install-upstream.sh` into a directory per part and version; the script answers where
//! a role's part is, so the versions file is read in one place.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, Result, bail};

/// The directory `role` (a role of `hack/upstream.versions`) is installed in, whether or not
/// it is there.
pub fn dir(role: &str) -> Result<PathBuf> {
    let out = Command::new("hack/install-upstream.sh")
        .args(["--path", role])
        .output()
        .context("running hack/install-upstream.sh --path")?;
    if !out.status.success() {
        bail!(
            "hack/install-upstream.sh --path {role}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// `bin` of `role`'s part, if it is installed.
pub fn find(role: &str, bin: &str) -> Result<Option<PathBuf>> {
    let d = dir(role)?;
    Ok((d.join(".built").is_file() && d.join(bin).is_file()).then(|| d.join(bin)))
}

/// Installs the parts of `roles` that are missing (`hack/install-upstream.sh`).
pub fn install(roles: &[&str]) -> Result<()> {
    let status = Command::new("hack/install-upstream.sh")
        .args(roles)
        .status()
        .context("running hack/install-upstream.sh")?;
    if !status.success() {
        bail!(
            "hack/install-upstream.sh {} failed ({status})",
            roles.join(" ")
        );
    }
    Ok(())
}
