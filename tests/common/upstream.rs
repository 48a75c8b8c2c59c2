//! The upstream parts the tests drive (critest, crictl, kubelet, the CNI plugins, crius's own
//! client-go and NRI programs), each built from its published module by
//! `hack/install-upstream.sh` into a directory per part and version. The script answers where a
//! role's part is, so the versions file is read in one place.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The directory `role` (a role of `hack/upstream.versions`) is installed in, whether or not
/// it is there.
pub fn dir(role: &str) -> PathBuf {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("hack/install-upstream.sh");
    let out = Command::new(&script)
        .args(["--path", role])
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", script.display()));
    assert!(
        out.status.success(),
        "{} --path {role}: {}",
        script.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// `bin` of `role`'s part, if it is installed.
pub fn find(role: &str, bin: &str) -> Option<PathBuf> {
    let d = dir(role);
    d.join(".built")
        .is_file()
        .then(|| d.join(bin))
        .filter(|p| p.is_file())
}

/// `bin` of `role`'s part; when it is not installed the test is skipped, or fails under
/// `CRIUS_REQUIRE_ALL=1`, naming it and how to install it.
pub fn need(role: &str, bin: &str) -> Option<PathBuf> {
    let found = find(role, bin);
    if found.is_none() {
        super::missing(&format!(
            "{bin} of {role} ({}: run hack/install-upstream.sh {role})",
            dir(role).display()
        ));
    }
    found
}
