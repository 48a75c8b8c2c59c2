//! A container's environment: `envFrom` and `env` in order, values from the downward API (pod
//! fields, container resources), Secrets and ConfigMaps, with `$(VAR)` expansion (also used for
//! command, args and subPathExpr).

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::{Container, EnvVar};

use super::resources::req_lim;
use super::{ConfigError, PodContext, all_containers};
use crate::frontend::quantity;

/// `$(VAR)` references to earlier variables expanded, `$$` as a literal `$`; unknown references
/// stay as written (as kubelet does).
pub fn expand(s: &str, env: &HashMap<String, String>) -> String {
    let mut out = String::with_capacity(s.len());
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'$' && i + 1 < b.len() {
            if b[i + 1] == b'$' {
                out.push('$');
                i += 2;
                continue;
            }
            if b[i + 1] == b'('
                && let Some(end) = s[i + 2..].find(')')
            {
                let name = &s[i + 2..i + 2 + end];
                if let Some(v) = env.get(name) {
                    out.push_str(v);
                    i += end + 3;
                    continue;
                }
            }
        }
        let ch = s[i..].chars().next().unwrap_or('\u{fffd}');
        out.push(ch);
        i += ch.len_utf8();
    }
    out
}

/// A pod field by its downward API path.
pub fn field(ctx: &PodContext, path: &str) -> Option<String> {
    let m = &ctx.pod.metadata;
    let lookup = |map: &Option<BTreeMap<String, String>>, rest: &str| {
        let key = rest.strip_prefix("['")?.strip_suffix("']")?;
        Some(map.as_ref()?.get(key).cloned().unwrap_or_default())
    };
    match path {
        "metadata.name" => Some(ctx.name.to_string()),
        "metadata.namespace" => Some(ctx.namespace.to_string()),
        "metadata.uid" => Some(ctx.uid.to_string()),
        "metadata.labels" | "metadata.annotations" => {
            let map = if path.ends_with("labels") {
                &m.labels
            } else {
                &m.annotations
            };
            Some(
                map.iter()
                    .flatten()
                    .map(|(k, v)| format!("{k}={v:?}"))
                    .collect::<Vec<_>>()
                    .join("\n"),
            )
        }
        "spec.nodeName" => Some(ctx.node.name.clone()),
        "spec.serviceAccountName" => Some(
            ctx.spec
                .service_account_name
                .clone()
                .unwrap_or_else(|| "default".into()),
        ),
        "status.podIP" => Some(ctx.pod_ips.first().cloned().unwrap_or_default()),
        // All of them, comma-separated, as kubelet gives a dual-stack pod.
        "status.podIPs" => Some(ctx.pod_ips.join(",")),
        "status.hostIP" | "status.hostIPs" => Some("127.0.0.1".into()),
        p => {
            if let Some(rest) = p.strip_prefix("metadata.labels") {
                lookup(&m.labels, rest)
            } else if let Some(rest) = p.strip_prefix("metadata.annotations") {
                lookup(&m.annotations, rest)
            } else {
                None
            }
        }
    }
}

/// A container's resource by the downward API (`limits.cpu`, `requests.memory`), in units of
/// `divisor`, rounded up; a limit not set is the node's capacity.
pub fn resource_field(
    ctx: &PodContext,
    container: &Container,
    resource: &str,
    divisor: Option<&str>,
) -> Option<String> {
    let (which, name) = resource.split_once('.')?;
    let r = container.resources.as_ref();
    let cpu = name == "cpu";
    let (req, lim) = req_lim(r, name, cpu);
    let mut v = if which == "limits" { lim } else { req };
    if which == "limits" && v == 0 {
        v = if cpu {
            std::thread::available_parallelism()
                .map(|n| n.get() as u64 * 1000)
                .unwrap_or(1000)
        } else {
            ctx.node.memory
        };
    }
    let div = match divisor {
        Some(d) => quantity::parse(d).ok()?,
        None => quantity::parse("1").ok()?,
    };
    let (num, den) = if cpu {
        (v, div.milli().max(1))
    } else {
        (v, div.value().max(1))
    };
    Some(num.div_ceil(den).to_string())
}

/// The environment of a container, in order, with `$(VAR)` expanded.
pub fn environment(ctx: &PodContext, c: &Container) -> Result<Vec<(String, String)>, ConfigError> {
    let mut env: Vec<(String, String)> = Vec::new();
    let mut map: HashMap<String, String> = HashMap::new();
    let set = |env: &mut Vec<(String, String)>,
               map: &mut HashMap<String, String>,
               k: String,
               v: String| {
        map.insert(k.clone(), v.clone());
        match env.iter_mut().find(|(x, _)| *x == k) {
            Some(e) => e.1 = v,
            None => env.push((k, v)),
        }
    };
    for from in c.env_from.iter().flatten() {
        let prefix = from.prefix.clone().unwrap_or_default();
        let (data, name, optional, what) = if let Some(s) = &from.secret_ref {
            (
                ctx.store.secret(ctx.namespace, &s.name),
                s.name.clone(),
                s.optional.unwrap_or(false),
                "secret",
            )
        } else if let Some(m) = &from.config_map_ref {
            (
                ctx.store.config_map(ctx.namespace, &m.name),
                m.name.clone(),
                m.optional.unwrap_or(false),
                "configmap",
            )
        } else {
            continue;
        };
        match data {
            Some(d) => {
                for (k, v) in d {
                    set(
                        &mut env,
                        &mut map,
                        format!("{prefix}{k}"),
                        String::from_utf8_lossy(&v).into_owned(),
                    );
                }
            }
            None if optional => {}
            None => return Err(ConfigError(format!("{what} {name:?} not found"))),
        }
    }
    for e in c.env.iter().flatten() {
        let value = match (&e.value, &e.value_from) {
            (_, Some(vf)) => match value_from(ctx, c, e, vf)? {
                Some(v) => v,
                None => continue,
            },
            (Some(v), None) => expand(v, &map),
            (None, None) => String::new(),
        };
        set(&mut env, &mut map, e.name.clone(), value);
    }
    Ok(env)
}

fn value_from(
    ctx: &PodContext,
    c: &Container,
    e: &EnvVar,
    vf: &k8s_openapi::api::core::v1::EnvVarSource,
) -> Result<Option<String>, ConfigError> {
    if let Some(f) = &vf.field_ref {
        return field(ctx, &f.field_path).map(Some).ok_or_else(|| {
            ConfigError(format!(
                "env {}: unsupported field {}",
                e.name, f.field_path
            ))
        });
    }
    if let Some(r) = &vf.resource_field_ref {
        let target = match r.container_name.as_deref() {
            None | Some("") => c,
            Some(n) => all_containers(ctx.spec)
                .find(|x| x.name == n)
                .ok_or_else(|| ConfigError(format!("env {}: no container {n:?}", e.name)))?,
        };
        return resource_field(
            ctx,
            target,
            &r.resource,
            r.divisor.as_ref().map(|d| d.0.as_str()),
        )
        .map(Some)
        .ok_or_else(|| {
            ConfigError(format!(
                "env {}: unsupported resource {}",
                e.name, r.resource
            ))
        });
    }
    let (data, name, key, optional, what) = if let Some(s) = &vf.secret_key_ref {
        (
            ctx.store.secret(ctx.namespace, &s.name),
            s.name.clone(),
            s.key.clone(),
            s.optional.unwrap_or(false),
            "secret",
        )
    } else if let Some(m) = &vf.config_map_key_ref {
        (
            ctx.store.config_map(ctx.namespace, &m.name),
            m.name.clone(),
            m.key.clone(),
            m.optional.unwrap_or(false),
            "configmap",
        )
    } else {
        return Ok(None);
    };
    match data.and_then(|d| d.get(&key).cloned()) {
        Some(v) => Ok(Some(String::from_utf8_lossy(&v).into_owned())),
        None if optional => Ok(None),
        None => Err(ConfigError(format!(
            "couldn't find key {key} in {what} {}/{name}",
            ctx.namespace
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dollar_escapes() {
        let env: HashMap<String, String> = [("A".to_string(), "1".to_string())].into();
        assert_eq!(expand("$(A)-$$(A)-$(B)-$", &env), "1-$(A)-$(B)-$");
        assert_eq!(expand("ü$(A)", &env), "ü1");
    }
}
