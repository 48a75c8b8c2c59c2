//! The schema: which fields of the objects crius implements, by normalized path; the open ones
//! (labels, resource lists, data) whose keys are free, and the scheduling and API-server ones it
//! ignores with a warning. Anything else set in a manifest is refused as not supported.

use std::collections::HashSet;
use std::sync::OnceLock;

use serde_json::Value;

use super::{Check, join};

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

pub(super) fn supported(c: &mut Check, value: &Value, kind: &str) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalized_paths() {
        assert_eq!(
            normalize("spec.containers[3].env[10].name"),
            "spec.containers[].env[].name"
        );
    }
}
