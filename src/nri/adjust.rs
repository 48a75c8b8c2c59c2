//! The adjustments plugins ask of a container being created, merged in index order: each
//! entry of a field (an annotation, mount, variable, device, rlimit) and each single field
//! belongs to the first plugin that sets it, and a second plugin setting it is refused by
//! name. A key starting with `-` removes the entry. Hooks add up. Fields crius does not apply
//! are refused by name rather than dropped.

use std::collections::HashMap;

use super::api::{self, Field};

/// Two plugins claimed the same thing, or a plugin asked for what crius cannot do.
#[derive(Debug, thiserror::Error)]
pub enum Conflict {
    #[error("plugins {first:?} and {second:?} both tried to set {field} {key}")]
    Claimed {
        first: String,
        second: String,
        field: &'static str,
        key: String,
    },
    #[error("plugin {plugin:?} asked to adjust {field}, which crius does not apply")]
    Unsupported { plugin: String, field: &'static str },
    #[error("plugin {plugin:?} tried to update container {id}, which is being created")]
    SelfUpdate { plugin: String, id: String },
}

/// The merge so far.
pub struct Merged {
    id: String,
    adjust: api::ContainerAdjustment,
    updates: Vec<api::ContainerUpdate>,
    evictions: Vec<api::ContainerEviction>,
    simple: HashMap<i32, String>,
    compound: HashMap<i32, HashMap<String, String>>,
}

/// The merge, done: what is applied, and who owns what (for validators).
#[derive(Debug, Default)]
pub struct Finished {
    pub adjust: api::ContainerAdjustment,
    pub updates: Vec<api::ContainerUpdate>,
    pub evictions: Vec<api::ContainerEviction>,
    pub owners: api::OwningPlugins,
}

impl From<Finished> for super::Adjusted {
    fn from(f: Finished) -> super::Adjusted {
        super::Adjusted {
            adjust: f.adjust,
            updates: f.updates,
            evictions: f.evictions,
        }
    }
}

/// The name an entry is kept under (a removal names the entry it removes).
fn entry_key(key: &str) -> &str {
    key.strip_prefix('-').unwrap_or(key)
}

impl Merged {
    pub fn new(id: &str) -> Merged {
        Merged {
            id: id.to_string(),
            adjust: api::ContainerAdjustment::default(),
            updates: Vec::new(),
            evictions: Vec::new(),
            simple: HashMap::new(),
            compound: HashMap::new(),
        }
    }

    fn claim(&mut self, plugin: &str, field: Field, key: Option<&str>) -> Result<(), Conflict> {
        let owner = match key {
            None => self
                .simple
                .entry(field as i32)
                .or_insert_with(|| plugin.to_string()),
            Some(k) => self
                .compound
                .entry(field as i32)
                .or_default()
                .entry(entry_key(k).to_string())
                .or_insert_with(|| plugin.to_string()),
        };
        if owner == plugin {
            return Ok(());
        }
        Err(Conflict::Claimed {
            first: owner.clone(),
            second: plugin.to_string(),
            field: field.as_str_name(),
            key: key.map(entry_key).unwrap_or_default().to_string(),
        })
    }

    /// Takes one plugin's answer to CreateContainer.
    pub fn take(
        &mut self,
        plugin: &str,
        answer: api::CreateContainerResponse,
    ) -> Result<(), Conflict> {
        if let Some(a) = answer.adjust {
            self.take_adjustment(plugin, a)?;
        }
        for u in answer.update {
            if u.container_id == self.id {
                return Err(Conflict::SelfUpdate {
                    plugin: plugin.into(),
                    id: u.container_id,
                });
            }
            self.updates.push(u);
        }
        self.evictions.extend(answer.evict);
        Ok(())
    }

    fn take_adjustment(
        &mut self,
        plugin: &str,
        a: api::ContainerAdjustment,
    ) -> Result<(), Conflict> {
        for (k, v) in a.annotations {
            self.claim(plugin, Field::Annotations, Some(&k))?;
            self.adjust
                .annotations
                .remove(&format!("-{}", entry_key(&k)));
            self.adjust.annotations.remove(entry_key(&k));
            self.adjust.annotations.insert(k, v);
        }
        for m in a.mounts {
            self.claim(plugin, Field::Mounts, Some(&m.destination))?;
            let key = entry_key(&m.destination).to_string();
            self.adjust
                .mounts
                .retain(|o| entry_key(&o.destination) != key);
            self.adjust.mounts.push(m);
        }
        for e in a.env {
            self.claim(plugin, Field::Env, Some(&e.key))?;
            let key = entry_key(&e.key).to_string();
            self.adjust.env.retain(|o| entry_key(&o.key) != key);
            self.adjust.env.push(e);
        }
        if let Some(h) = a.hooks {
            let mine = self.adjust.hooks.get_or_insert_default();
            mine.prestart.extend(h.prestart);
            mine.create_runtime.extend(h.create_runtime);
            mine.create_container.extend(h.create_container);
            mine.start_container.extend(h.start_container);
            mine.poststart.extend(h.poststart);
            mine.poststop.extend(h.poststop);
        }
        for r in a.rlimits {
            self.claim(plugin, Field::Rlimits, Some(&r.r#type))?;
            self.adjust.rlimits.retain(|o| o.r#type != r.r#type);
            self.adjust.rlimits.push(r);
        }
        for d in a.cdi_devices {
            self.claim(plugin, Field::CdiDevices, Some(&d.name))?;
            if !self.adjust.cdi_devices.iter().any(|o| o.name == d.name) {
                self.adjust.cdi_devices.push(d);
            }
        }
        if !a.args.is_empty() {
            self.claim(plugin, Field::Args, None)?;
            self.adjust.args = a.args;
        }
        if let Some(l) = a.linux {
            self.take_linux(plugin, l)?;
        }
        Ok(())
    }

    fn take_linux(
        &mut self,
        plugin: &str,
        l: api::LinuxContainerAdjustment,
    ) -> Result<(), Conflict> {
        let unsupported = |field: &'static str| Conflict::Unsupported {
            plugin: plugin.to_string(),
            field,
        };
        if !l.cgroups_path.is_empty() {
            return Err(unsupported("linux.cgroups_path"));
        }
        if l.io_priority.is_some() {
            return Err(unsupported("linux.io_priority"));
        }
        if l.seccomp_policy.is_some() {
            return Err(unsupported("linux.seccomp_policy"));
        }
        if !l.namespaces.is_empty() {
            return Err(unsupported("linux.namespaces"));
        }
        if !l.sysctl.is_empty() {
            return Err(unsupported("linux.sysctl"));
        }
        if !l.net_devices.is_empty() {
            return Err(unsupported("linux.net_devices"));
        }
        if l.scheduler.is_some() {
            return Err(unsupported("linux.scheduler"));
        }
        if l.rdt.is_some() {
            return Err(unsupported("linux.rdt"));
        }
        if l.memory_policy.is_some() {
            return Err(unsupported("linux.memory_policy"));
        }
        let mine = self.adjust.linux.get_or_insert_default();
        let mut devices = std::mem::take(&mut mine.devices);
        for d in l.devices {
            self.claim(plugin, Field::Devices, Some(&d.path))?;
            let key = entry_key(&d.path).to_string();
            devices.retain(|o| entry_key(&o.path) != key);
            devices.push(d);
        }
        let mine = self.adjust.linux.get_or_insert_default();
        mine.devices = devices;
        if let Some(o) = l.oom_score_adj {
            self.claim(plugin, Field::OomScoreAdj, None)?;
            self.adjust.linux.get_or_insert_default().oom_score_adj = Some(o);
        }
        if let Some(r) = l.resources {
            self.take_resources(plugin, r)?;
        }
        Ok(())
    }

    fn take_resources(&mut self, plugin: &str, r: api::LinuxResources) -> Result<(), Conflict> {
        let unsupported = |field: &'static str| Conflict::Unsupported {
            plugin: plugin.to_string(),
            field,
        };
        if !r.hugepage_limits.is_empty() {
            return Err(unsupported("linux.resources.hugepage_limits"));
        }
        if r.blockio_class.is_some() {
            return Err(unsupported("linux.resources.blockio_class"));
        }
        if r.rdt_class.is_some() {
            return Err(unsupported("linux.resources.rdt_class"));
        }
        let mut mine = self
            .adjust
            .linux
            .get_or_insert_default()
            .resources
            .take()
            .unwrap_or_default();
        let result = self.merge_resources(plugin, r, &mut mine);
        self.adjust.linux.get_or_insert_default().resources = Some(mine);
        result
    }

    fn merge_resources(
        &mut self,
        plugin: &str,
        r: api::LinuxResources,
        mine: &mut api::LinuxResources,
    ) -> Result<(), Conflict> {
        let unsupported = |field: &'static str| Conflict::Unsupported {
            plugin: plugin.to_string(),
            field,
        };
        if let Some(m) = &r.memory
            && (m.kernel.is_some()
                || m.kernel_tcp.is_some()
                || m.swappiness.is_some()
                || m.disable_oom_killer.is_some()
                || m.use_hierarchy.is_some())
        {
            // cgroup v2 has none of these.
            return Err(unsupported(
                "linux.resources.memory (kernel, kernel_tcp, swappiness, disable_oom_killer, use_hierarchy)",
            ));
        }
        if let Some(c) = &r.cpu
            && (c.realtime_runtime.is_some() || c.realtime_period.is_some())
        {
            return Err(unsupported("linux.resources.cpu realtime"));
        }
        if let Some(m) = r.memory {
            let to = mine.memory.get_or_insert_default();
            if m.limit.is_some() {
                self.claim(plugin, Field::MemLimit, None)?;
                to.limit = m.limit;
            }
            if m.reservation.is_some() {
                self.claim(plugin, Field::MemReservation, None)?;
                to.reservation = m.reservation;
            }
            if m.swap.is_some() {
                self.claim(plugin, Field::MemSwapLimit, None)?;
                to.swap = m.swap;
            }
        }
        if let Some(c) = r.cpu {
            let to = mine.cpu.get_or_insert_default();
            if c.shares.is_some() {
                self.claim(plugin, Field::CpuShares, None)?;
                to.shares = c.shares;
            }
            if c.quota.is_some() {
                self.claim(plugin, Field::CpuQuota, None)?;
                to.quota = c.quota;
            }
            if c.period.is_some() {
                self.claim(plugin, Field::CpuPeriod, None)?;
                to.period = c.period;
            }
            if !c.cpus.is_empty() {
                self.claim(plugin, Field::CpuSetCpUs, None)?;
                to.cpus = c.cpus;
            }
            if !c.mems.is_empty() {
                self.claim(plugin, Field::CpuSetMems, None)?;
                to.mems = c.mems;
            }
        }
        if let Some(p) = r.pids {
            self.claim(plugin, Field::PidsLimit, None)?;
            mine.pids = Some(p);
        }
        for (k, v) in r.unified {
            self.claim(plugin, Field::CgroupsUnified, Some(&k))?;
            mine.unified.insert(k, v);
        }
        Ok(())
    }

    /// The container as the next plugin sees it: the merge so far applied.
    pub fn applied_to(&self, c: &api::Container) -> api::Container {
        let mut c = c.clone();
        let a = &self.adjust;
        for (k, v) in &a.annotations {
            match k.strip_prefix('-') {
                Some(k) => {
                    c.annotations.remove(k);
                }
                None => {
                    c.annotations.insert(k.clone(), v.clone());
                }
            }
        }
        for e in &a.env {
            let key = entry_key(&e.key);
            c.env.retain(|v| v.split('=').next() != Some(key));
            if !e.key.starts_with('-') {
                c.env.push(format!("{}={}", e.key, e.value));
            }
        }
        for m in &a.mounts {
            let key = entry_key(&m.destination);
            c.mounts.retain(|o| o.destination != key);
            if !m.destination.starts_with('-') {
                c.mounts.push(m.clone());
            }
        }
        if !a.args.is_empty() {
            c.args = a.args.clone();
        }
        for r in &a.rlimits {
            c.rlimits.retain(|o| o.r#type != r.r#type);
            c.rlimits.push(r.clone());
        }
        c.cdi_devices.extend(a.cdi_devices.iter().cloned());
        c
    }

    pub fn finish(self) -> Finished {
        let owners = api::FieldOwners {
            simple: self.simple,
            compound: self
                .compound
                .into_iter()
                .map(|(f, owners)| (f, api::CompoundFieldOwners { owners }))
                .collect(),
        };
        Finished {
            adjust: self.adjust,
            updates: self.updates,
            evictions: self.evictions,
            owners: api::OwningPlugins {
                owners: HashMap::from([(self.id, owners)]),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(k: &str, v: &str) -> api::KeyValue {
        api::KeyValue {
            key: k.into(),
            value: v.into(),
        }
    }

    fn answer(a: api::ContainerAdjustment) -> api::CreateContainerResponse {
        api::CreateContainerResponse {
            adjust: Some(a),
            ..Default::default()
        }
    }

    #[test]
    fn entries_belong_to_the_first_plugin_that_sets_them() {
        let mut m = Merged::new("c1");
        m.take(
            "00-a",
            answer(api::ContainerAdjustment {
                env: vec![env("A", "1"), env("B", "1")],
                ..Default::default()
            }),
        )
        .unwrap();
        m.take(
            "10-b",
            answer(api::ContainerAdjustment {
                env: vec![env("C", "2")],
                ..Default::default()
            }),
        )
        .unwrap();
        let e = m
            .take(
                "20-c",
                answer(api::ContainerAdjustment {
                    env: vec![env("-B", "")],
                    ..Default::default()
                }),
            )
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "plugins \"00-a\" and \"20-c\" both tried to set Env B"
        );
        let f = m.finish();
        let keys: Vec<_> = f.adjust.env.iter().map(|e| e.key.as_str()).collect();
        assert_eq!(keys, ["A", "B", "C"]);
        assert_eq!(
            f.owners.owners["c1"].compound[&(Field::Env as i32)].owners["C"],
            "10-b"
        );
    }

    #[test]
    fn the_next_plugin_sees_the_container_adjusted() {
        let mut m = Merged::new("c1");
        m.take(
            "00-a",
            answer(api::ContainerAdjustment {
                env: vec![env("X", "new"), env("-GONE", "")],
                rlimits: vec![api::PosixRlimit {
                    r#type: "RLIMIT_NOFILE".into(),
                    hard: 64,
                    soft: 32,
                }],
                ..Default::default()
            }),
        )
        .unwrap();
        let c = api::Container {
            env: vec!["X=old".into(), "GONE=1".into(), "KEEP=1".into()],
            ..Default::default()
        };
        let seen = m.applied_to(&c);
        assert_eq!(seen.env, ["KEEP=1", "X=new"]);
        assert_eq!(seen.rlimits[0].soft, 32);
    }

    #[test]
    fn single_fields_and_refusals() {
        let mut m = Merged::new("c1");
        let oom = |v| {
            answer(api::ContainerAdjustment {
                linux: Some(api::LinuxContainerAdjustment {
                    oom_score_adj: Some(api::OptionalInt { value: v }),
                    ..Default::default()
                }),
                ..Default::default()
            })
        };
        m.take("00-a", oom(100)).unwrap();
        assert!(matches!(
            m.take("01-b", oom(200)),
            Err(Conflict::Claimed { .. })
        ));
        let sysctl = answer(api::ContainerAdjustment {
            linux: Some(api::LinuxContainerAdjustment {
                sysctl: HashMap::from([("net.x".into(), "1".into())]),
                ..Default::default()
            }),
            ..Default::default()
        });
        assert_eq!(
            m.take("02-c", sysctl).unwrap_err().to_string(),
            "plugin \"02-c\" asked to adjust linux.sysctl, which crius does not apply"
        );
        let own = api::CreateContainerResponse {
            update: vec![api::ContainerUpdate {
                container_id: "c1".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        assert!(matches!(
            m.take("03-d", own),
            Err(Conflict::SelfUpdate { .. })
        ));
    }
}
