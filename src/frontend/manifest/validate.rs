//! The checks the API server would make of the values: names (DNS labels and subdomains),
//! restart and DNS policies, volumes, containers (ports, env, resources, mounts, probes, hooks,
//! security context), each error named by its field.

use std::collections::{HashMap, HashSet};

use k8s_openapi::api::core::v1::{
    Container, Lifecycle, Pod, PodSpec, Probe, ResourceRequirements, SecurityContext, Volume,
};

use super::Check;
use crate::frontend::quantity;

fn dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn dns_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(dns_label)
}

pub(super) fn validate_meta(
    c: &mut Check,
    m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    kind: &str,
) {
    match m.name.as_deref() {
        None | Some("") => c.err("metadata.name", "is required"),
        Some(n) if !dns_subdomain(n) => c.err(
            "metadata.name",
            format!(
                "{n:?}: a {kind} name must be lowercase letters, digits, '-' and '.' (at most 253)"
            ),
        ),
        _ => {}
    }
    if let Some(ns) = m.namespace.as_deref()
        && !dns_label(ns)
    {
        c.err(
            "metadata.namespace",
            format!("{ns:?}: a namespace must be a DNS label (lowercase letters, digits, '-')"),
        );
    }
}

pub(super) fn validate_pod(c: &mut Check, pod: &Pod) {
    validate_meta(c, &pod.metadata, "Pod");
    let Some(spec) = &pod.spec else {
        c.err("spec", "is required");
        return;
    };
    validate_pod_policies(c, spec);
    validate_host_namespaces(c, spec);
    let volumes = validate_volumes(c, spec);
    validate_containers(c, spec, &volumes);
}

/// The pod-wide settings: at least one container, restart and DNS policies, grace period,
/// active deadline.
fn validate_pod_policies(c: &mut Check, spec: &PodSpec) {
    if spec.containers.is_empty() {
        c.err("spec.containers", "at least one container is required");
    }
    match spec.restart_policy.as_deref() {
        None | Some("Always" | "OnFailure" | "Never") => {}
        Some(p) => c.err(
            "spec.restartPolicy",
            format!("{p:?}: must be Always, OnFailure or Never"),
        ),
    }
    if spec.termination_grace_period_seconds.is_some_and(|g| g < 0) {
        c.err("spec.terminationGracePeriodSeconds", "must not be negative");
    }
    if spec.active_deadline_seconds.is_some_and(|d| d <= 0) {
        c.err("spec.activeDeadlineSeconds", "must be greater than 0");
    }
    match spec.dns_policy.as_deref() {
        None | Some("ClusterFirst" | "ClusterFirstWithHostNet" | "Default") => {}
        Some("None") => {
            if spec.dns_config.is_none() {
                c.err("spec.dnsConfig", "is required when dnsPolicy is None");
            }
        }
        Some(p) => c.err(
            "spec.dnsPolicy",
            format!("{p:?}: must be ClusterFirst, ClusterFirstWithHostNet, Default or None"),
        ),
    }
}

/// The host's namespaces (none with a user namespace of the pod's own) and the OS.
fn validate_host_namespaces(c: &mut Check, spec: &PodSpec) {
    if spec.host_users == Some(false) {
        for (on, f) in [
            (spec.host_network, "spec.hostNetwork"),
            (spec.host_pid, "spec.hostPID"),
            (spec.host_ipc, "spec.hostIPC"),
        ] {
            if on == Some(true) {
                c.err(f, "cannot be combined with hostUsers: false");
            }
        }
    }
    if let Some(os) = &spec.os
        && os.name != "linux"
    {
        c.err(
            "spec.os.name",
            format!("{:?}: this node runs linux", os.name),
        );
    }
}

/// `spec.volumes`: unique DNS-label names, each with its source checked; returns the names.
fn validate_volumes(c: &mut Check, spec: &PodSpec) -> HashSet<String> {
    let mut volumes = HashSet::new();
    for (i, v) in spec.volumes.iter().flatten().enumerate() {
        let f = format!("spec.volumes[{i}]");
        if !dns_label(&v.name) {
            c.err(
                &format!("{f}.name"),
                format!("{:?}: must be a DNS label", v.name),
            );
        }
        if !volumes.insert(v.name.clone()) {
            c.err(
                &format!("{f}.name"),
                format!("{:?}: duplicate volume name", v.name),
            );
        }
        validate_volume_source(c, &f, v);
    }
    volumes
}

/// One volume's source: exactly one, a valid hostPath or emptyDir, file modes in range.
fn validate_volume_source(c: &mut Check, f: &str, v: &Volume) {
    let sources = [
        v.empty_dir.is_some(),
        v.host_path.is_some(),
        v.secret.is_some(),
        v.config_map.is_some(),
        v.downward_api.is_some(),
        v.projected.is_some(),
    ]
    .iter()
    .filter(|x| **x)
    .count();
    if sources != 1 {
        c.err(f, "exactly one volume source must be given");
    }
    if let Some(h) = &v.host_path {
        if !h.path.starts_with('/') {
            c.err(&format!("{f}.hostPath.path"), "must be an absolute path");
        }
        if let Some(t) = h.type_.as_deref()
            && !matches!(
                t,
                "" | "DirectoryOrCreate"
                    | "Directory"
                    | "FileOrCreate"
                    | "File"
                    | "Socket"
                    | "CharDevice"
                    | "BlockDevice"
            )
        {
            c.err(
                &format!("{f}.hostPath.type"),
                format!("{t:?}: unknown type"),
            );
        }
    }
    if let Some(e) = &v.empty_dir {
        match e.medium.as_deref() {
            None | Some("" | "Memory") => {}
            Some(m) => c.err(
                &format!("{f}.emptyDir.medium"),
                format!("{m:?}: only \"\" (disk) and Memory are supported"),
            ),
        }
        if let Some(q) = &e.size_limit
            && let Err(r) = quantity::parse(&q.0)
        {
            c.err(&format!("{f}.emptyDir.sizeLimit"), r.to_string());
        }
    }
    let modes = [
        v.secret.as_ref().and_then(|s| s.default_mode),
        v.config_map.as_ref().and_then(|s| s.default_mode),
        v.downward_api.as_ref().and_then(|s| s.default_mode),
        v.projected.as_ref().and_then(|s| s.default_mode),
    ];
    for m in modes.into_iter().flatten() {
        if !(0..=0o777).contains(&m) {
            c.err(
                &format!("{f}.defaultMode"),
                format!("{m}: must be 0 to 0777"),
            );
        }
    }
}

/// Init containers then app containers: unique DNS-label names, each container checked.
fn validate_containers(c: &mut Check, spec: &PodSpec, volumes: &HashSet<String>) {
    let mut names = HashSet::new();
    let all: Vec<(String, &Container, bool)> = spec
        .init_containers
        .iter()
        .flatten()
        .enumerate()
        .map(|(i, c)| (format!("spec.initContainers[{i}]"), c, true))
        .chain(
            spec.containers
                .iter()
                .enumerate()
                .map(|(i, c)| (format!("spec.containers[{i}]"), c, false)),
        )
        .collect();
    for (f, ctr, init) in &all {
        if !dns_label(&ctr.name) {
            c.err(
                &format!("{f}.name"),
                format!(
                    "{:?}: must be a DNS label (lowercase letters, digits, '-')",
                    ctr.name
                ),
            );
        } else if !names.insert(ctr.name.clone()) {
            c.err(
                &format!("{f}.name"),
                format!("{:?}: duplicate container name", ctr.name),
            );
        }
        validate_container(c, f, ctr, *init, volumes, spec.host_network == Some(true));
    }
}

/// One container at field path `f`, part by part.
fn validate_container(
    c: &mut Check,
    f: &str,
    ctr: &Container,
    init: bool,
    volumes: &HashSet<String>,
    host_network: bool,
) {
    validate_image(c, f, ctr);
    validate_restart_policy(c, f, ctr, init);
    validate_ports(c, f, ctr, host_network);
    validate_env(c, f, ctr);
    if let Some(r) = &ctr.resources {
        validate_resources(c, f, r);
    }
    validate_volume_mounts(c, f, ctr, volumes);
    for (p, name, liveness_like) in [
        (&ctr.liveness_probe, "livenessProbe", true),
        (&ctr.readiness_probe, "readinessProbe", false),
        (&ctr.startup_probe, "startupProbe", true),
    ] {
        if let Some(p) = p {
            validate_probe(c, &format!("{f}.{name}"), p, liveness_like, ctr);
        }
    }
    if let Some(l) = &ctr.lifecycle {
        validate_lifecycle(c, f, l);
    }
    if let Some(sc) = &ctr.security_context {
        validate_security_context(c, f, sc);
    }
}

/// The image (required) and its pull policy.
fn validate_image(c: &mut Check, f: &str, ctr: &Container) {
    if ctr.image.as_deref().unwrap_or("").is_empty() {
        c.err(&format!("{f}.image"), "is required");
    }
    match ctr.image_pull_policy.as_deref() {
        None | Some("Always" | "IfNotPresent" | "Never") => {}
        Some(p) => c.err(
            &format!("{f}.imagePullPolicy"),
            format!("{p:?}: must be Always, IfNotPresent or Never"),
        ),
    }
}

/// A container's restart policy (only sidecars, init containers with Always, have one), and
/// what init containers that are not sidecars may not have: hooks and probes.
fn validate_restart_policy(c: &mut Check, f: &str, ctr: &Container, init: bool) {
    let sidecar = match ctr.restart_policy.as_deref() {
        None => false,
        Some("Always") if init => true,
        Some(p) if init => {
            c.err(
                &format!("{f}.restartPolicy"),
                format!("{p:?}: an init container may only have restartPolicy Always (a sidecar)"),
            );
            false
        }
        Some(_) => {
            c.err(
                &format!("{f}.restartPolicy"),
                "only init containers (sidecars) may set a restart policy",
            );
            false
        }
    };
    if init && !sidecar {
        for (set, what) in [
            (ctr.lifecycle.is_some(), "lifecycle"),
            (ctr.liveness_probe.is_some(), "livenessProbe"),
            (ctr.readiness_probe.is_some(), "readinessProbe"),
            (ctr.startup_probe.is_some(), "startupProbe"),
        ] {
            if set {
                c.err(
                    &format!("{f}.{what}"),
                    "may not be set for init containers without restartPolicy Always",
                );
            }
        }
    }
}

/// `ports`: numbers and protocol in range, unique valid names, host ports with hostNetwork.
fn validate_ports(c: &mut Check, f: &str, ctr: &Container, host_network: bool) {
    let mut port_names = HashSet::new();
    for (i, p) in ctr.ports.iter().flatten().enumerate() {
        let pf = format!("{f}.ports[{i}]");
        if !(1..=65535).contains(&p.container_port) {
            c.err(&format!("{pf}.containerPort"), "must be 1 to 65535");
        }
        if let Some(h) = p.host_port
            && !(0..=65535).contains(&h)
        {
            c.err(&format!("{pf}.hostPort"), "must be 0 to 65535");
        }
        if let Some(proto) = p.protocol.as_deref()
            && !matches!(proto, "TCP" | "UDP" | "SCTP")
        {
            c.err(
                &format!("{pf}.protocol"),
                format!("{proto:?}: must be TCP, UDP or SCTP"),
            );
        }
        if let Some(n) = &p.name {
            let valid = !n.is_empty()
                && n.len() <= 15
                && n.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && n.bytes().any(|b| b.is_ascii_lowercase());
            if !valid {
                c.err(
                    &format!("{pf}.name"),
                    format!("{n:?}: a port name is at most 15 lowercase letters, digits and '-'"),
                );
            } else if !port_names.insert(n.clone()) {
                c.err(&format!("{pf}.name"), format!("{n:?}: duplicate port name"));
            }
        }
        if p.host_port.is_some_and(|h| h != 0)
            && host_network
            && p.host_port != Some(p.container_port)
        {
            c.err(
                &format!("{pf}.hostPort"),
                "must equal containerPort with hostNetwork",
            );
        }
    }
}

/// `env`: names without '=', and one source for each `valueFrom`.
fn validate_env(c: &mut Check, f: &str, ctr: &Container) {
    for (i, e) in ctr.env.iter().flatten().enumerate() {
        let ef = format!("{f}.env[{i}]");
        if e.name.is_empty() || e.name.contains('=') {
            c.err(
                &format!("{ef}.name"),
                format!("{:?}: must be non-empty, without '='", e.name),
            );
        }
        if let Some(vf) = &e.value_from {
            let n = [
                vf.field_ref.is_some(),
                vf.resource_field_ref.is_some(),
                vf.secret_key_ref.is_some(),
                vf.config_map_key_ref.is_some(),
            ]
            .iter()
            .filter(|x| **x)
            .count();
            if n != 1 || e.value.is_some() {
                c.err(
                    &format!("{ef}.valueFrom"),
                    "exactly one source is needed, and no value beside it",
                );
            }
            if let Some(fr) = &vf.field_ref
                && !env_field_path(&fr.field_path)
            {
                c.err(
                    &format!("{ef}.valueFrom.fieldRef.fieldPath"),
                    format!("{:?}: not a supported field", fr.field_path),
                );
            }
        }
    }
}

/// `resources`: known resources with valid quantities, requests of CPU and memory no more
/// than their limits.
fn validate_resources(c: &mut Check, f: &str, r: &ResourceRequirements) {
    let mut cpu_mem: HashMap<(&str, &str), u64> = HashMap::new();
    for (which, list) in [("limits", &r.limits), ("requests", &r.requests)] {
        for (name, q) in list.iter().flatten() {
            let rf = format!("{f}.resources.{which}.{name}");
            match quantity::parse(&q.0) {
                Err(e) => c.err(&rf, e.to_string()),
                Ok(v) => {
                    let known = matches!(name.as_str(), "cpu" | "memory" | "ephemeral-storage")
                        || name.starts_with("hugepages-");
                    if !known {
                        c.err(
                            &rf,
                            "unknown resource (cpu, memory, ephemeral-storage, hugepages-<size>)",
                        );
                    }
                    if name == "ephemeral-storage" {
                        c.warnings.push(format!(
                            "{rf}: ignored: container storage is not limited (emptyDir sizeLimit is)"
                        ));
                    }
                    if name == "cpu" {
                        cpu_mem.insert((which, "cpu"), v.milli());
                    } else if name == "memory" {
                        cpu_mem.insert((which, "memory"), v.value());
                    }
                }
            }
        }
    }
    for res in ["cpu", "memory"] {
        if let (Some(req), Some(lim)) = (
            cpu_mem.get(&("requests", res)),
            cpu_mem.get(&("limits", res)),
        ) && req > lim
        {
            c.err(
                &format!("{f}.resources.requests.{res}"),
                "must be less than or equal to the limit",
            );
        }
    }
}

/// `volumeMounts`: of declared volumes, at unique absolute paths, relative sub-paths, and
/// Bidirectional propagation only for privileged containers.
fn validate_volume_mounts(c: &mut Check, f: &str, ctr: &Container, volumes: &HashSet<String>) {
    let mut paths = HashSet::new();
    for (i, m) in ctr.volume_mounts.iter().flatten().enumerate() {
        let mf = format!("{f}.volumeMounts[{i}]");
        if !volumes.contains(&m.name) {
            c.err(
                &format!("{mf}.name"),
                format!("{:?}: no volume of that name", m.name),
            );
        }
        if !m.mount_path.starts_with('/') {
            c.err(&format!("{mf}.mountPath"), "must be an absolute path");
        } else if !paths.insert(m.mount_path.trim_end_matches('/').to_string()) {
            c.err(&format!("{mf}.mountPath"), "must be unique");
        }
        for (sp, name) in [(&m.sub_path, "subPath"), (&m.sub_path_expr, "subPathExpr")] {
            if let Some(s) = sp
                && (s.starts_with('/') || s.split('/').any(|x| x == ".."))
            {
                c.err(
                    &format!("{mf}.{name}"),
                    "must be a relative path without '..'",
                );
            }
        }
        if m.sub_path.is_some() && m.sub_path_expr.is_some() {
            c.err(
                &format!("{mf}.subPathExpr"),
                "subPath and subPathExpr are exclusive",
            );
        }
        match m.mount_propagation.as_deref() {
            None | Some("None" | "HostToContainer") => {}
            Some("Bidirectional") => {
                if !ctr
                    .security_context
                    .as_ref()
                    .and_then(|s| s.privileged)
                    .unwrap_or(false)
                {
                    c.err(
                        &format!("{mf}.mountPropagation"),
                        "Bidirectional is only for privileged containers",
                    );
                }
            }
            Some(p) => c.err(
                &format!("{mf}.mountPropagation"),
                format!("{p:?}: must be None, HostToContainer or Bidirectional"),
            ),
        }
    }
}

/// `lifecycle`: postStart and preStop with one handler each, sleeps not negative.
fn validate_lifecycle(c: &mut Check, f: &str, l: &Lifecycle) {
    for (h, name) in [(&l.post_start, "postStart"), (&l.pre_stop, "preStop")] {
        if let Some(h) = h {
            let n = [h.exec.is_some(), h.http_get.is_some(), h.sleep.is_some()]
                .iter()
                .filter(|x| **x)
                .count();
            if n != 1 || h.tcp_socket.is_some() {
                c.err(
                    &format!("{f}.lifecycle.{name}"),
                    "exactly one handler (exec, httpGet or sleep) is needed",
                );
            }
            if let Some(s) = &h.sleep
                && s.seconds < 0
            {
                c.err(
                    &format!("{f}.lifecycle.{name}.sleep.seconds"),
                    "must not be negative",
                );
            }
        }
    }
}

/// `securityContext`: procMount, privilege escalation, seccomp and AppArmor profiles.
fn validate_security_context(c: &mut Check, f: &str, sc: &SecurityContext) {
    if let Some(pm) = sc.proc_mount.as_deref()
        && !matches!(pm, "Default" | "Unmasked")
    {
        c.err(
            &format!("{f}.securityContext.procMount"),
            format!("{pm:?}: must be Default or Unmasked"),
        );
    }
    if sc.allow_privilege_escalation == Some(false) && sc.privileged == Some(true) {
        c.err(
            &format!("{f}.securityContext.allowPrivilegeEscalation"),
            "cannot be false for a privileged container",
        );
    }
    if let Some(s) = &sc.seccomp_profile {
        profile_type(
            c,
            &format!("{f}.securityContext.seccompProfile"),
            &s.type_,
            &s.localhost_profile,
        );
    }
    if let Some(s) = &sc.app_armor_profile {
        profile_type(
            c,
            &format!("{f}.securityContext.appArmorProfile"),
            &s.type_,
            &s.localhost_profile,
        );
    }
}

fn profile_type(c: &mut Check, f: &str, t: &str, local: &Option<String>) {
    match t {
        "RuntimeDefault" | "Unconfined" => {
            if local.is_some() {
                c.err(
                    &format!("{f}.localhostProfile"),
                    "is only for type Localhost",
                );
            }
        }
        "Localhost" => {
            if local.as_deref().unwrap_or("").is_empty() {
                c.err(
                    &format!("{f}.localhostProfile"),
                    "is required for type Localhost",
                );
            }
        }
        t => c.err(
            &format!("{f}.type"),
            format!("{t:?}: must be RuntimeDefault, Unconfined or Localhost"),
        ),
    }
}

/// Pod fields an env var may take (`fieldRef`).
pub fn env_field_path(p: &str) -> bool {
    matches!(
        p,
        "metadata.name"
            | "metadata.namespace"
            | "metadata.uid"
            | "spec.nodeName"
            | "spec.serviceAccountName"
            | "status.hostIP"
            | "status.hostIPs"
            | "status.podIP"
            | "status.podIPs"
    ) || p.starts_with("metadata.labels['")
        || p.starts_with("metadata.annotations['")
}

fn validate_probe(c: &mut Check, f: &str, p: &Probe, liveness_like: bool, ctr: &Container) {
    let n = [
        p.exec.is_some(),
        p.http_get.is_some(),
        p.tcp_socket.is_some(),
        p.grpc.is_some(),
    ]
    .iter()
    .filter(|x| **x)
    .count();
    if n != 1 {
        c.err(
            f,
            "exactly one handler (exec, httpGet, tcpSocket or grpc) is needed",
        );
    }
    for (v, name, min) in [
        (p.initial_delay_seconds, "initialDelaySeconds", 0),
        (p.period_seconds, "periodSeconds", 1),
        (p.timeout_seconds, "timeoutSeconds", 1),
        (p.success_threshold, "successThreshold", 1),
        (p.failure_threshold, "failureThreshold", 1),
    ] {
        if let Some(v) = v
            && v < min
        {
            c.err(&format!("{f}.{name}"), format!("must be at least {min}"));
        }
    }
    if liveness_like && p.success_threshold.is_some_and(|s| s != 1) {
        c.err(&format!("{f}.successThreshold"), "must be 1");
    }
    let named = |port: &k8s_openapi::apimachinery::pkg::util::intstr::IntOrString| match port {
        k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(s) => ctr
            .ports
            .iter()
            .flatten()
            .any(|x| x.name.as_deref() == Some(s.as_str())),
        k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(i) => {
            (1..=65535).contains(i)
        }
    };
    if let Some(h) = &p.http_get
        && !named(&h.port)
    {
        c.err(
            &format!("{f}.httpGet.port"),
            "must be 1 to 65535 or the name of a container port",
        );
    }
    if let Some(t) = &p.tcp_socket
        && !named(&t.port)
    {
        c.err(
            &format!("{f}.tcpSocket.port"),
            "must be 1 to 65535 or the name of a container port",
        );
    }
    if let Some(g) = &p.grpc
        && !(1..=65535).contains(&g.port)
    {
        c.err(&format!("{f}.grpc.port"), "must be 1 to 65535");
    }
}

#[cfg(test)]
mod tests {
    use crate::frontend::manifest::testing::problems;

    #[test]
    fn containers_volumes_and_probes_rules() {
        let text = "apiVersion: v1
kind: Pod
metadata: {name: p}
spec:
  initContainers:
  - name: init
    image: busybox
    readinessProbe: {exec: {command: ['true']}}
  - name: side
    image: busybox
    restartPolicy: Always
    readinessProbe: {exec: {command: ['true']}}
  containers:
  - name: init
    image: busybox
    volumeMounts:
    - {name: nope, mountPath: rel}
    livenessProbe: {exec: {command: ['true']}, tcpSocket: {port: 1}, successThreshold: 2}
  volumes:
  - name: v
    emptyDir: {}
    hostPath: {path: /x}
";
        let p = problems(text);
        let has = |s: &str| p.iter().any(|x| x.contains(s));
        assert!(
            has("spec.initContainers[0].readinessProbe:may not be set"),
            "{p:?}"
        );
        assert!(!has("spec.initContainers[1].readinessProbe"), "{p:?}");
        assert!(has("spec.containers[0].name:\"init\": duplicate"), "{p:?}");
        assert!(has("volumeMounts[0].name:\"nope\""), "{p:?}");
        assert!(
            has("volumeMounts[0].mountPath:must be an absolute"),
            "{p:?}"
        );
        assert!(has("livenessProbe:exactly one handler"), "{p:?}");
        assert!(has("livenessProbe.successThreshold:must be 1"), "{p:?}");
        assert!(has("spec.volumes[0]:exactly one volume source"), "{p:?}");
    }
}
