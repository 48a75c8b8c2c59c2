//! `cargo xtask deb`: the Debian package, built with Debian's own `dpkg-deb` from a staged
//! tree: the static binary, the systemd unit, the default configuration (a conffile), the
//! default CNI network list when the tree has one, shell completions and man pages generated
//! by the binary itself (clap), and maintainer scripts that reload systemd and enable the unit
//! on install, and stop it only on removal (an upgrade restarts the daemon; pods keep running).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

fn write(path: &Path, text: &str, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    Ok(())
}

fn output(cmd: &mut Command) -> Result<Vec<u8>> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(out.stdout)
}

fn gzip(path: &Path) -> Result<()> {
    output(Command::new("gzip").args(["-9n", "-f"]).arg(path))?;
    Ok(())
}

const POSTINST: &str = "#!/bin/sh
set -e
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload
    if [ \"$1\" = configure ] && [ -z \"$2\" ]; then
        systemctl enable crius.service >/dev/null
    fi
    # An upgrade restarts the daemon; KillMode=process leaves the pods running.
    if [ -n \"$2\" ] && systemctl is-active --quiet crius.service; then
        systemctl restart crius.service
    fi
fi
";

const PRERM: &str = "#!/bin/sh
set -e
if [ -d /run/systemd/system ] && [ \"$1\" = remove ]; then
    systemctl stop crius.service || true
    systemctl disable crius.service >/dev/null || true
fi
";

const POSTRM: &str = "#!/bin/sh
set -e
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload || true
fi
";

/// Builds `target/deb/crius_<version>_<arch>.deb` from the binary at `binary`.
pub fn build(binary: &Path) -> Result<PathBuf> {
    let version = env!("CARGO_PKG_VERSION");
    let arch = String::from_utf8(output(Command::new("dpkg").arg("--print-architecture"))?)?
        .trim()
        .to_string();
    let root = PathBuf::from("target/deb");
    let stage = root.join(format!("crius_{version}_{arch}"));
    if stage.exists() {
        std::fs::remove_dir_all(&stage)?;
    }
    let bin = stage.join("usr/bin/crius");
    std::fs::create_dir_all(bin.parent().context("bin dir")?)?;
    std::fs::copy(binary, &bin).with_context(|| format!("copying {}", binary.display()))?;
    write(
        &stage.join("lib/systemd/system/crius.service"),
        &std::fs::read_to_string("dist/crius.service")?,
        0o644,
    )?;
    write(
        &stage.join("etc/crius/config.toml"),
        &std::fs::read_to_string("dist/config.toml")?,
        0o644,
    )?;
    // The default network list, for hack/run.sh-style installs into an empty /etc/cni/net.d.
    if let Ok(entries) = std::fs::read_dir("dist/cni") {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            write(
                &stage.join("usr/share/crius/cni").join(&name),
                &std::fs::read_to_string(e.path())?,
                0o644,
            )?;
        }
    }
    for (shell, path) in [
        ("bash", "usr/share/bash-completion/completions/crius"),
        ("zsh", "usr/share/zsh/vendor-completions/_crius"),
        ("fish", "usr/share/fish/vendor_completions.d/crius.fish"),
    ] {
        let text = output(Command::new(&bin).args(["completions", shell]))?;
        write(&stage.join(path), &String::from_utf8(text)?, 0o644)?;
    }
    let man = stage.join("usr/share/man/man1");
    output(Command::new(&bin).arg("man").arg(&man))?;
    for page in std::fs::read_dir(&man)?.flatten() {
        gzip(&page.path())?;
    }
    let docs = stage.join("usr/share/doc/crius");
    write(
        &docs.join("copyright"),
        "crius\nLicense: Apache-2.0\nOn Debian systems the full text is in /usr/share/common-licenses/Apache-2.0.\n",
        0o644,
    )?;
    let size_kib: u64 = walk_size(&stage)? / 1024;
    let debian = stage.join("DEBIAN");
    write(
        &debian.join("control"),
        &format!(
            "Package: crius\n\
             Version: {version}\n\
             Architecture: {arch}\n\
             Maintainer: crius developers <crius@localhost>\n\
             Installed-Size: {size_kib}\n\
             Depends: iptables\n\
             Recommends: containernetworking-plugins\n\
             Section: admin\n\
             Priority: optional\n\
             Homepage: https://localhost/crius\n\
             Description: Kubernetes container runtime (CRI) on Linux primitives\n \
             crius serves the CRI runtime.v1 API that kubelet and crictl use, pulls and\n \
             verifies OCI images, and runs pods with namespaces, cgroup v2, seccomp and\n \
             overlayfs, in one static binary.\n"
        ),
        0o644,
    )?;
    write(&debian.join("conffiles"), "/etc/crius/config.toml\n", 0o644)?;
    write(&debian.join("postinst"), POSTINST, 0o755)?;
    write(&debian.join("prerm"), PRERM, 0o755)?;
    write(&debian.join("postrm"), POSTRM, 0o755)?;
    let deb = root.join(format!("crius_{version}_{arch}.deb"));
    output(
        Command::new("dpkg-deb")
            .args(["--root-owner-group", "-Zxz", "--build"])
            .arg(&stage)
            .arg(&deb),
    )?;
    eprintln!("xtask: {} is ready", deb.display());
    Ok(deb)
}

fn walk_size(dir: &Path) -> Result<u64> {
    let mut total = 0;
    for e in std::fs::read_dir(dir)?.flatten() {
        let m = e.metadata()?;
        total += if m.is_dir() {
            walk_size(&e.path())?
        } else {
            m.len()
        };
    }
    Ok(total)
}
