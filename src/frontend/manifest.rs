//! Manifests: Pods, Secrets and ConfigMaps from YAML (or JSON) files, `---`-separated, checked
//! the way the API server would before anything runs. Every error names the file, the line and
//! the field. Fields the Pod type does not have are errors (as with strict decoding); fields it
//! has but crius does not implement are errors too, except scheduling and API-server fields,
//! which mean nothing on one node and are named in warnings.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use k8s_openapi::api::core::v1::{ConfigMap, Container, Pod, Probe, Secret};
use serde_json::Value;

use super::quantity;
use super::yaml::{self, Doc};

/// A bad manifest: where and why.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{}", self.lines())]
pub struct ManifestError {
    pub file: PathBuf,
    pub problems: Vec<Problem>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Problem {
    pub line: usize,
    pub field: String,
    pub reason: String,
}

impl ManifestError {
    fn lines(&self) -> String {
        self.problems
            .iter()
            .map(|p| {
                if p.field.is_empty() {
                    format!("{}:{}: {}", self.file.display(), p.line, p.reason)
                } else {
                    format!(
                        "{}:{}: {}: {}",
                        self.file.display(),
                        p.line,
                        p.field,
                        p.reason
                    )
                }
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn one(file: &Path, line: usize, field: &str, reason: impl Into<String>) -> ManifestError {
        ManifestError {
            file: file.to_path_buf(),
            problems: vec![Problem {
                line,
                field: field.to_string(),
                reason: reason.into(),
            }],
        }
    }
}

/// One object of a manifest file.
#[derive(Debug, Clone)]
pub enum Object {
    Pod(Box<Pod>),
    Secret(Box<Secret>),
    ConfigMap(Box<ConfigMap>),
}

impl Object {
    pub fn kind(&self) -> &'static str {
        match self {
            Object::Pod(_) => "Pod",
            Object::Secret(_) => "Secret",
            Object::ConfigMap(_) => "ConfigMap",
        }
    }

    /// `namespace/name`, the namespace defaulting to `default`.
    pub fn key(&self) -> String {
        let m = match self {
            Object::Pod(p) => &p.metadata,
            Object::Secret(s) => &s.metadata,
            Object::ConfigMap(c) => &c.metadata,
        };
        format!(
            "{}/{}",
            m.namespace.as_deref().unwrap_or("default"),
            m.name.as_deref().unwrap_or("")
        )
    }
}

#[derive(Debug, Clone)]
pub struct Loaded {
    pub object: Object,
    pub file: PathBuf,
    pub line: usize,
    /// Fields accepted but without meaning here, named.
    pub warnings: Vec<String>,
    /// A digest of the object as written, to tell a changed manifest.
    pub hash: String,
}

/// Loads every object of a file.
pub fn load_file(path: &Path) -> Result<Vec<Loaded>, ManifestError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| ManifestError::one(path, 0, "", format!("reading: {e}")))?;
    load_str(&text, path)
}

/// Loads every object of a YAML stream; `file` names it in errors.
pub fn load_str(text: &str, file: &Path) -> Result<Vec<Loaded>, ManifestError> {
    let docs = yaml::parse(text)
        .map_err(|e| ManifestError::one(file, e.line, "", format!("bad YAML: {}", e.message)))?;
    let mut out = Vec::new();
    let mut problems = Vec::new();
    for doc in docs {
        if doc.value.is_null() {
            continue;
        }
        match load_doc(&doc, file) {
            Ok(l) => out.push(l),
            Err(mut p) => problems.append(&mut p),
        }
    }
    if !problems.is_empty() {
        return Err(ManifestError {
            file: file.to_path_buf(),
            problems,
        });
    }
    let mut seen = HashMap::new();
    for l in &out {
        let id = format!("{} {}", l.object.kind(), l.object.key());
        if let Some(line) = seen.insert(id.clone(), l.line) {
            return Err(ManifestError::one(
                file,
                l.line,
                "metadata.name",
                format!("{id} is defined twice (first at line {line})"),
            ));
        }
    }
    Ok(out)
}

struct Check<'a> {
    doc: &'a Doc,
    problems: Vec<Problem>,
    warnings: Vec<String>,
}

impl Check<'_> {
    fn err(&mut self, field: &str, reason: impl Into<String>) {
        self.problems.push(Problem {
            line: self.doc.line_of(field),
            field: field.to_string(),
            reason: reason.into(),
        });
    }
}

fn load_doc(doc: &Doc, file: &Path) -> Result<Loaded, Vec<Problem>> {
    let mut c = Check {
        doc,
        problems: Vec::new(),
        warnings: Vec::new(),
    };
    let Value::Object(top) = &doc.value else {
        c.err("", "a manifest document must be a mapping");
        return Err(c.problems);
    };
    let kind = top.get("kind").and_then(Value::as_str).unwrap_or("");
    let api = top.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    if api.is_empty() {
        c.err("apiVersion", "is required");
    } else if api != "v1" {
        c.err(
            "apiVersion",
            format!("{api:?}: only v1 objects are supported"),
        );
    }
    if !matches!(kind, "Pod" | "Secret" | "ConfigMap") {
        c.err(
            "kind",
            if kind.is_empty() {
                "is required".to_string()
            } else {
                format!("{kind:?}: only Pod, Secret and ConfigMap are supported")
            },
        );
    }
    if !c.problems.is_empty() {
        return Err(c.problems);
    }
    let mut value = doc.value.clone();
    quantities_as_strings(&mut value);
    let object = match kind {
        "Pod" => typed::<Pod>(&mut c, &value).map(|p| Object::Pod(Box::new(p))),
        "Secret" => typed::<Secret>(&mut c, &value).map(|s| Object::Secret(Box::new(s))),
        _ => typed::<ConfigMap>(&mut c, &value).map(|m| Object::ConfigMap(Box::new(m))),
    };
    let Some(object) = object else {
        return Err(c.problems);
    };
    supported(&mut c, &value, kind);
    match &object {
        Object::Pod(p) => validate_pod(&mut c, p),
        Object::Secret(s) => validate_meta(&mut c, &s.metadata, "Secret"),
        Object::ConfigMap(m) => validate_meta(&mut c, &m.metadata, "ConfigMap"),
    }
    if !c.problems.is_empty() {
        return Err(c.problems);
    }
    let hash = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(
        serde_json::to_vec(&doc.value).unwrap_or_default(),
    ));
    Ok(Loaded {
        object,
        file: file.to_path_buf(),
        line: doc.line,
        warnings: c.warnings,
        hash,
    })
}

/// Quantities written as numbers (`cpu: 1`) are strings to the typed API.
fn quantities_as_strings(v: &mut Value) {
    match v {
        Value::Object(m) => {
            for (k, x) in m.iter_mut() {
                if matches!(
                    k.as_str(),
                    "limits" | "requests" | "overhead" | "sizeLimit" | "divisor"
                ) {
                    stringify_numbers(x);
                } else {
                    quantities_as_strings(x);
                }
            }
        }
        Value::Array(a) => a.iter_mut().for_each(quantities_as_strings),
        _ => {}
    }
}

fn stringify_numbers(v: &mut Value) {
    match v {
        Value::Number(n) => *v = Value::String(n.to_string()),
        Value::Object(m) => m.values_mut().for_each(stringify_numbers),
        _ => {}
    }
}

/// Decodes into the Kubernetes type; then every field of the input the type dropped is unknown.
fn typed<T: serde::de::DeserializeOwned + serde::Serialize>(
    c: &mut Check,
    value: &Value,
) -> Option<T> {
    let t: T = match serde_path_to_error::deserialize(value.clone()) {
        Ok(t) => t,
        Err(e) => {
            let path = e.path().to_string();
            let path = if path == "." { String::new() } else { path };
            c.err(&path, e.inner().to_string());
            return None;
        }
    };
    let back = serde_json::to_value(&t).unwrap_or(Value::Null);
    unknown_fields(c, value, &back, "");
    c.problems.is_empty().then_some(t)
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

fn unknown_fields(c: &mut Check, input: &Value, typed: &Value, path: &str) {
    match (input, typed) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in a {
                let p = join(path, k);
                match b.get(k) {
                    Some(t) => unknown_fields(c, v, t, &p),
                    None if v.is_null() => {}
                    None => c.err(&p, "unknown field"),
                }
            }
        }
        (Value::Array(a), Value::Array(b)) => {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                unknown_fields(c, x, y, &format!("{path}[{i}]"));
            }
        }
        _ => {}
    }
}

/// What crius implements, by normalized path (`[]` for any index): fields whose every key is
/// free (labels, resource lists, data) are `open`; scheduling and API-server fields are
/// `ignored` (a warning names them).
struct Schema {
    supported: HashSet<String>,
    open: HashSet<String>,
    ignored: HashSet<String>,
}

fn schema() -> &'static Schema {
    static SCHEMA: OnceLock<Schema> = OnceLock::new();
    SCHEMA.get_or_init(|| {
        let mut s = Schema {
            supported: HashSet::new(),
            open: HashSet::new(),
            ignored: HashSet::new(),
        };
        let mut add = |prefix: &str, fields: &[&str]| {
            for f in fields {
                s.supported.insert(join(prefix, f));
            }
        };
        let meta = [
            "metadata",
            "metadata.name",
            "metadata.namespace",
            "metadata.uid",
        ];
        add("", &["apiVersion", "kind", "spec"]);
        add("", &meta);
        // Pod.
        add(
            "spec",
            &[
                "containers",
                "initContainers",
                "restartPolicy",
                "terminationGracePeriodSeconds",
                "activeDeadlineSeconds",
                "volumes",
                "hostNetwork",
                "hostPID",
                "hostIPC",
                "shareProcessNamespace",
                "hostname",
                "hostAliases",
                "hostAliases[].ip",
                "hostAliases[].hostnames",
                "dnsPolicy",
                "dnsConfig",
                "dnsConfig.nameservers",
                "dnsConfig.searches",
                "dnsConfig.options",
                "dnsConfig.options[].name",
                "dnsConfig.options[].value",
                "securityContext",
                "imagePullSecrets",
                "imagePullSecrets[].name",
                "runtimeClassName",
                "hostUsers",
                "os",
                "os.name",
            ],
        );
        add("spec", &["hostNetwork"]);
        let sc = [
            "securityContext.runAsUser",
            "securityContext.runAsGroup",
            "securityContext.runAsNonRoot",
            "securityContext.seccompProfile",
            "securityContext.seccompProfile.type",
            "securityContext.seccompProfile.localhostProfile",
            "securityContext.appArmorProfile",
            "securityContext.appArmorProfile.type",
            "securityContext.appArmorProfile.localhostProfile",
            "securityContext.seLinuxOptions",
            "securityContext.seLinuxOptions.user",
            "securityContext.seLinuxOptions.role",
            "securityContext.seLinuxOptions.type",
            "securityContext.seLinuxOptions.level",
        ];
        add("spec", &sc);
        add(
            "spec",
            &[
                "securityContext.fsGroup",
                "securityContext.fsGroupChangePolicy",
                "securityContext.supplementalGroups",
                "securityContext.supplementalGroupsPolicy",
                "securityContext.sysctls",
                "securityContext.sysctls[].name",
                "securityContext.sysctls[].value",
            ],
        );
        for c in ["spec.containers[]", "spec.initContainers[]"] {
            add(
                c,
                &[
                    "name",
                    "image",
                    "imagePullPolicy",
                    "command",
                    "args",
                    "workingDir",
                    "env",
                    "env[].name",
                    "env[].value",
                    "env[].valueFrom",
                    "env[].valueFrom.fieldRef",
                    "env[].valueFrom.fieldRef.fieldPath",
                    "env[].valueFrom.fieldRef.apiVersion",
                    "env[].valueFrom.resourceFieldRef",
                    "env[].valueFrom.resourceFieldRef.containerName",
                    "env[].valueFrom.resourceFieldRef.resource",
                    "env[].valueFrom.resourceFieldRef.divisor",
                    "env[].valueFrom.secretKeyRef",
                    "env[].valueFrom.secretKeyRef.name",
                    "env[].valueFrom.secretKeyRef.key",
                    "env[].valueFrom.secretKeyRef.optional",
                    "env[].valueFrom.configMapKeyRef",
                    "env[].valueFrom.configMapKeyRef.name",
                    "env[].valueFrom.configMapKeyRef.key",
                    "env[].valueFrom.configMapKeyRef.optional",
                    "envFrom",
                    "envFrom[].prefix",
                    "envFrom[].secretRef",
                    "envFrom[].secretRef.name",
                    "envFrom[].secretRef.optional",
                    "envFrom[].configMapRef",
                    "envFrom[].configMapRef.name",
                    "envFrom[].configMapRef.optional",
                    "ports",
                    "ports[].name",
                    "ports[].containerPort",
                    "ports[].hostPort",
                    "ports[].hostIP",
                    "ports[].protocol",
                    "resources",
                    "volumeMounts",
                    "volumeMounts[].name",
                    "volumeMounts[].mountPath",
                    "volumeMounts[].subPath",
                    "volumeMounts[].subPathExpr",
                    "volumeMounts[].readOnly",
                    "volumeMounts[].recursiveReadOnly",
                    "volumeMounts[].mountPropagation",
                    "lifecycle",
                    "securityContext",
                    "securityContext.capabilities",
                    "securityContext.capabilities.add",
                    "securityContext.capabilities.drop",
                    "securityContext.privileged",
                    "securityContext.readOnlyRootFilesystem",
                    "securityContext.allowPrivilegeEscalation",
                    "securityContext.procMount",
                    "stdin",
                    "stdinOnce",
                    "tty",
                    "terminationMessagePath",
                    "terminationMessagePolicy",
                    "restartPolicy",
                ],
            );
            add(c, &sc);
            s.open.insert(format!("{c}.resources.limits"));
            s.open.insert(format!("{c}.resources.requests"));
            let handler = |h: &str| {
                vec![
                    format!("{h}.exec"),
                    format!("{h}.exec.command"),
                    format!("{h}.httpGet"),
                    format!("{h}.httpGet.path"),
                    format!("{h}.httpGet.port"),
                    format!("{h}.httpGet.host"),
                    format!("{h}.httpGet.scheme"),
                    format!("{h}.httpGet.httpHeaders"),
                    format!("{h}.httpGet.httpHeaders[].name"),
                    format!("{h}.httpGet.httpHeaders[].value"),
                ]
            };
            for p in ["livenessProbe", "readinessProbe", "startupProbe"] {
                let mut f = handler(p);
                for x in [
                    "",
                    ".tcpSocket",
                    ".tcpSocket.port",
                    ".tcpSocket.host",
                    ".grpc",
                    ".grpc.port",
                    ".grpc.service",
                    ".initialDelaySeconds",
                    ".periodSeconds",
                    ".timeoutSeconds",
                    ".successThreshold",
                    ".failureThreshold",
                    ".terminationGracePeriodSeconds",
                ] {
                    f.push(format!("{p}{x}"));
                }
                let f: Vec<&str> = f.iter().map(String::as_str).collect();
                add(c, &f);
            }
            for h in ["lifecycle.postStart", "lifecycle.preStop"] {
                let mut f = handler(h);
                f.push(h.to_string());
                f.push(format!("{h}.sleep"));
                f.push(format!("{h}.sleep.seconds"));
                let f: Vec<&str> = f.iter().map(String::as_str).collect();
                add(c, &f);
            }
        }
        let items = |p: &str| {
            vec![
                format!("{p}.items"),
                format!("{p}.items[].key"),
                format!("{p}.items[].path"),
                format!("{p}.items[].mode"),
                format!("{p}.optional"),
            ]
        };
        let downward = |p: &str| {
            vec![
                format!("{p}.items"),
                format!("{p}.items[].path"),
                format!("{p}.items[].mode"),
                format!("{p}.items[].fieldRef"),
                format!("{p}.items[].fieldRef.fieldPath"),
                format!("{p}.items[].fieldRef.apiVersion"),
                format!("{p}.items[].resourceFieldRef"),
                format!("{p}.items[].resourceFieldRef.containerName"),
                format!("{p}.items[].resourceFieldRef.resource"),
                format!("{p}.items[].resourceFieldRef.divisor"),
            ]
        };
        let mut v: Vec<String> = [
            "name",
            "emptyDir",
            "emptyDir.medium",
            "emptyDir.sizeLimit",
            "hostPath",
            "hostPath.path",
            "hostPath.type",
            "secret",
            "secret.secretName",
            "secret.defaultMode",
            "configMap",
            "configMap.name",
            "configMap.defaultMode",
            "downwardAPI",
            "downwardAPI.defaultMode",
            "projected",
            "projected.defaultMode",
            "projected.sources",
            "projected.sources[].secret",
            "projected.sources[].secret.name",
            "projected.sources[].configMap",
            "projected.sources[].configMap.name",
            "projected.sources[].downwardAPI",
        ]
        .iter()
        .map(|x| x.to_string())
        .collect();
        v.extend(items("secret"));
        v.extend(items("configMap"));
        v.extend(items("projected.sources[].secret"));
        v.extend(items("projected.sources[].configMap"));
        v.extend(downward("downwardAPI"));
        v.extend(downward("projected.sources[].downwardAPI"));
        let v: Vec<&str> = v.iter().map(String::as_str).collect();
        add("spec.volumes[]", &v);
        // Secret and ConfigMap.
        add(
            "",
            &["type", "immutable", "data", "stringData", "binaryData"],
        );
        for o in [
            "metadata.labels",
            "metadata.annotations",
            "data",
            "stringData",
            "binaryData",
            "spec.overhead",
        ] {
            s.open.insert(o.to_string());
        }
        for i in [
            "status",
            "metadata.creationTimestamp",
            "metadata.resourceVersion",
            "metadata.generation",
            "metadata.managedFields",
            "metadata.selfLink",
            "spec.nodeName",
            "spec.nodeSelector",
            "spec.affinity",
            "spec.tolerations",
            "spec.schedulerName",
            "spec.priority",
            "spec.priorityClassName",
            "spec.preemptionPolicy",
            "spec.topologySpreadConstraints",
            "spec.serviceAccountName",
            "spec.serviceAccount",
            "spec.automountServiceAccountToken",
            "spec.enableServiceLinks",
            "spec.schedulingGates",
        ] {
            s.ignored.insert(i.to_string());
        }
        s
    })
}

/// `spec.containers[3].env[0].name` -> `spec.containers[].env[].name`.
fn normalize(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    let mut skip = false;
    for ch in path.chars() {
        match ch {
            '[' => {
                out.push('[');
                skip = true;
            }
            ']' => {
                out.push(']');
                skip = false;
            }
            _ if skip => {}
            c => out.push(c),
        }
    }
    out
}

fn supported(c: &mut Check, value: &Value, kind: &str) {
    fn walk(c: &mut Check, v: &Value, path: &str, kind: &str) {
        match v {
            Value::Object(m) => {
                for (k, x) in m {
                    if x.is_null() {
                        continue;
                    }
                    let p = join(path, k);
                    let n = normalize(&p);
                    let s = schema();
                    if s.open.contains(&n) {
                        continue;
                    }
                    if s.ignored.contains(&n) {
                        c.warnings.push(format!(
                            "{}: ignored: it has no meaning on a single node without a control plane",
                            p
                        ));
                        continue;
                    }
                    let pod_only = n.starts_with("spec");
                    let meta_only = matches!(
                        n.as_str(),
                        "type" | "immutable" | "data" | "stringData" | "binaryData"
                    );
                    let ok = s.supported.contains(&n)
                        && !(kind != "Pod" && pod_only)
                        && !(kind == "Pod" && meta_only);
                    if !ok {
                        c.err(&p, "not supported by crius");
                        continue;
                    }
                    walk(c, x, &p, kind);
                }
            }
            Value::Array(a) => {
                for (i, x) in a.iter().enumerate() {
                    walk(c, x, &format!("{path}[{i}]"), kind);
                }
            }
            _ => {}
        }
    }
    walk(c, value, "", kind);
}

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

fn validate_meta(
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

fn validate_pod(c: &mut Check, pod: &Pod) {
    validate_meta(c, &pod.metadata, "Pod");
    let Some(spec) = &pod.spec else {
        c.err("spec", "is required");
        return;
    };
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
    // Volumes.
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
            c.err(&f, "exactly one volume source must be given");
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
                c.err(&format!("{f}.emptyDir.sizeLimit"), r);
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
    // Containers.
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
        validate_container(c, f, ctr, *init, &volumes, spec.host_network == Some(true));
    }
}

fn validate_container(
    c: &mut Check,
    f: &str,
    ctr: &Container,
    init: bool,
    volumes: &HashSet<String>,
    host_network: bool,
) {
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
    if let Some(r) = &ctr.resources {
        let mut cpu_mem: HashMap<(&str, &str), u64> = HashMap::new();
        for (which, list) in [("limits", &r.limits), ("requests", &r.requests)] {
            for (name, q) in list.iter().flatten() {
                let rf = format!("{f}.resources.{which}.{name}");
                match quantity::parse(&q.0) {
                    Err(e) => c.err(&rf, e),
                    Ok(v) => {
                        let known = matches!(name.as_str(), "cpu" | "memory" | "ephemeral-storage")
                            || name.starts_with("hugepages-");
                        if !known {
                            c.err(&rf, "unknown resource (cpu, memory, ephemeral-storage, hugepages-<size>)");
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
    if let Some(sc) = &ctr.security_context {
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
    use super::*;

    fn load(text: &str) -> Result<Vec<Loaded>, ManifestError> {
        load_str(text, Path::new("m.yaml"))
    }

    const POD: &str = "apiVersion: v1
kind: Pod
metadata:
  name: web
  labels:
    app: web
spec:
  restartPolicy: OnFailure
  nodeSelector:
    disk: ssd
  containers:
  - name: app
    image: busybox
    command: [sh, -c, 'echo hi']
    resources:
      limits: {cpu: 1, memory: 64Mi}
    ports:
    - {name: http, containerPort: 80}
    readinessProbe:
      httpGet: {port: http, path: /}
  volumes:
  - name: data
    emptyDir: {medium: Memory, sizeLimit: 1Mi}
---
apiVersion: v1
kind: Secret
metadata: {name: creds}
stringData: {password: hunter2}
";

    #[test]
    fn a_good_pod_and_secret() {
        let objs = load(POD).unwrap();
        assert_eq!(objs.len(), 2);
        let Object::Pod(p) = &objs[0].object else {
            panic!("a pod first")
        };
        assert_eq!(objs[0].object.key(), "default/web");
        let limits = p.spec.as_ref().unwrap().containers[0]
            .resources
            .as_ref()
            .unwrap()
            .limits
            .as_ref()
            .unwrap();
        assert_eq!(limits["cpu"].0, "1");
        assert_eq!(objs[0].warnings.len(), 1, "{:?}", objs[0].warnings);
        assert!(objs[0].warnings[0].contains("spec.nodeSelector"));
        // What crius cannot honour is named too.
        let odd = POD
            .replace("memory: 64Mi}", "memory: 64Mi, ephemeral-storage: 1Gi}")
            .replace("containerPort: 80}", "containerPort: 80, hostPort: 8080}");
        let objs = load(&odd).unwrap();
        let w = &objs[0].warnings;
        assert!(
            w.iter()
                .any(|x| x.contains("resources.limits.ephemeral-storage: ignored")),
            "{w:?}"
        );
        // hostPort is honoured (through the node's CNI network's portmap): no warning.
        assert!(!w.iter().any(|x| x.contains("hostPort")), "{w:?}");
        assert_eq!(objs[1].line, 24, "the --- line");
        assert!(matches!(objs[1].object, Object::Secret(_)));
    }

    fn problems(text: &str) -> Vec<String> {
        load(text)
            .unwrap_err()
            .problems
            .iter()
            .map(|p| format!("{}:{}:{}", p.line, p.field, p.reason))
            .collect()
    }

    #[test]
    fn unknown_unsupported_and_invalid_fields_are_named() {
        let bad = POD
            .replace(
                "    image: busybox\n",
                "    image: busybox\n    imagee: x\n",
            )
            .replace(
                "  restartPolicy: OnFailure\n",
                "  restartPolicy: Sometimes\n",
            );
        let p = problems(&bad);
        assert!(
            p.iter()
                .any(|x| x.starts_with("14:spec.containers[0].imagee:unknown field")),
            "{p:?}"
        );
        let bad = POD.replace(
            "  restartPolicy: OnFailure\n",
            "  restartPolicy: Sometimes\n",
        );
        let p = problems(&bad);
        assert!(
            p.iter()
                .any(|x| x.starts_with("8:spec.restartPolicy:\"Sometimes\"")),
            "{p:?}"
        );
        let bad = POD.replace(
            "  restartPolicy: OnFailure\n",
            "  activeDeadlineSeconds: 0\n",
        );
        let p = problems(&bad);
        assert!(
            p.iter()
                .any(|x| x.contains("spec.activeDeadlineSeconds:must be greater than 0")),
            "{p:?}"
        );
        let bad = POD.replace("memory: 64Mi", "memory: lots");
        let p = problems(&bad);
        assert!(
            p.iter()
                .any(|x| x.contains("resources.limits.memory") && x.contains("quantity")),
            "{p:?}"
        );
        let bad = POD.replace("port: http", "port: https");
        let p = problems(&bad);
        assert!(
            p.iter().any(|x| x.contains("readinessProbe.httpGet.port")),
            "{p:?}"
        );
        let bad = POD.replace("containerPort: 80", "containerPort: \"eighty\"");
        let p = problems(&bad);
        assert!(
            p.iter()
                .any(|x| x.contains("containerPort") && x.contains("invalid type")),
            "{p:?}"
        );
        let bad = POD.replace("name: web\n  labels", "name: Web_1\n  labels");
        let p = problems(&bad);
        assert!(p.iter().any(|x| x.starts_with("4:metadata.name:")), "{p:?}");
        let e = load("kind: Pod\napiVersion: v1\nmetadata: {name: a\n").unwrap_err();
        assert!(e.to_string().starts_with("m.yaml:"), "{e}");
        assert!(e.to_string().contains("bad YAML"), "{e}");
        let e = load("apiVersion: apps/v1\nkind: Deployment\n").unwrap_err();
        assert_eq!(e.problems.len(), 2);
    }

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

    #[test]
    fn normalized_paths() {
        assert_eq!(
            normalize("spec.containers[3].env[10].name"),
            "spec.containers[].env[].name"
        );
    }
}
