//! The confinement a container gets beyond its spec (seccomp, AppArmor, SELinux): resolved and
//! checked at CreateContainer before anything is made, then put in the container's spec and
//! monitor configuration, with the SELinux relabelling of the mounts that ask for it. Uses
//! `sandbox::security` (profiles, filters, labels), `spec` (the capability set the filter is
//! resolved against), `runtime` (the relabelling) and `atomic`.

use super::{
    Bundle, Confinement, ContainerConfig, ContainerService, Error, MonitorConfig, Path, atomic,
    config, invalid, io_err, runtime, sandbox, spec,
};

impl ContainerService {
    /// The seccomp filter and AppArmor profile of a container, checked before anything is made.
    // The deprecated profile fields are still what older kubelets send.
    #[allow(deprecated)]
    pub(super) fn confinement(
        &self,
        sc: Option<&config::ContainerSecurity>,
        pod_selinux: Option<&sandbox::security::SelinuxLabels>,
    ) -> Result<Confinement, Error> {
        const FIELD: &str = "config.linux.security_context";
        let privileged = sc.is_some_and(|s| s.privileged);
        let (caps, _) = spec::capabilities(sc)?;
        let mut bounding: Vec<String> = caps.iter().map(|c| c.to_string()).collect();
        bounding.sort();
        let choice = sandbox::security::seccomp_choice(
            sc.and_then(|s| s.seccomp.as_ref()),
            sc.map(|s| s.seccomp_profile_path.as_str()).unwrap_or(""),
            FIELD,
        )?;
        // A privileged container runs without a filter, whatever it asked for (as containerd).
        let seccomp = if privileged {
            None
        } else {
            let field = match &choice {
                sandbox::security::SeccompChoice::Localhost(_)
                    if sc.is_some_and(|s| s.seccomp.is_some()) =>
                {
                    format!("{FIELD}.seccomp.localhost_ref")
                }
                _ => format!("{FIELD}.seccomp"),
            };
            self.inner.filters.resolve(&choice, &bounding, &field)?
        };
        let apparmor = sandbox::security::apparmor_profile(
            sc.and_then(|s| s.apparmor.as_ref()),
            sc.map(|s| s.apparmor_profile.as_str()).unwrap_or(""),
            privileged,
            &self.inner.root,
            FIELD,
        )?;
        // A privileged container runs with the runtime's own label, as with containerd.
        let selinux = if privileged {
            None
        } else {
            sandbox::security::selinux_labels(
                sc.and_then(|s| s.selinux_options.as_ref()),
                pod_selinux,
                false,
                &|_| false,
                FIELD,
            )?
        };
        Ok(Confinement {
            seccomp,
            apparmor,
            selinux,
        })
    }
}

/// Puts the container's confinement in its spec and monitor configuration: the seccomp filter
/// (its program written to the bundle), the AppArmor profile, the SELinux labels (with the
/// mounts that ask for it relabelled).
pub(super) fn apply_confinement(
    confinement: &Confinement,
    b: &Bundle,
    config: &ContainerConfig,
    oci: &mut oci_spec::runtime::Spec,
    monitor: &mut MonitorConfig,
) -> Result<(), Error> {
    if let Some(f) = &confinement.seccomp {
        let path = b.dir.join("seccomp.bpf");
        atomic::write(&path, &f.program, 0o600).map_err(io_err(&path))?;
        monitor.seccomp = Some(runtime::SeccompFilter {
            program: path,
            flags: f.flags,
        });
        if let Some(l) = oci.linux_mut() {
            l.set_seccomp(Some(f.profile.clone()));
        }
    }
    if let (Some(name), Some(p)) = (&confinement.apparmor, oci.process_mut()) {
        p.set_apparmor_profile(Some(name.clone()));
    }
    if let Some(l) = &confinement.selinux {
        label_spec(oci, l);
        relabel_mounts(config, l)?;
    }
    Ok(())
}

/// Relabels the host paths of the mounts that ask for it with the container's file label,
/// refusing paths whose relabelling would break the node.
fn relabel_mounts(
    config: &ContainerConfig,
    l: &sandbox::security::SelinuxLabels,
) -> Result<(), Error> {
    for (i, m) in config.mounts.iter().enumerate() {
        if !m.selinux_relabel {
            continue;
        }
        let field = format!("config.mounts[{i}].selinux_relabel");
        if !sandbox::security::relabel_allowed(&m.host_path) {
            return Err(invalid(
                &field,
                format!("relabelling {} would break the node", m.host_path),
            ));
        }
        runtime::selinux::relabel(Path::new(&m.host_path), &l.mount)
            .map_err(|e| invalid(&field, e.to_string()))?;
    }
    Ok(())
}

/// Puts SELinux labels in a container's spec: the process's (set on its exec by the init), the
/// files' (the rootfs is mounted with it) and a `context=` on its tmpfs mounts.
pub(super) fn label_spec(oci: &mut oci_spec::runtime::Spec, l: &sandbox::security::SelinuxLabels) {
    if let Some(p) = oci.process_mut() {
        p.set_selinux_label(Some(l.process.clone()));
    }
    if let Some(linux) = oci.linux_mut() {
        linux.set_mount_label(Some(l.mount.clone()));
    }
    if let Some(mounts) = oci.mounts_mut() {
        for m in mounts.iter_mut() {
            if m.typ().as_deref() == Some("tmpfs") {
                let mut opts = m.options().clone().unwrap_or_default();
                opts.push(format!("context=\"{}\"", l.mount));
                m.set_options(Some(opts));
            }
        }
    }
}
