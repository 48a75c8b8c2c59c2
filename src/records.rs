//! records: the in-memory index a service keeps of its records (pod sandboxes, containers). Each
//! record sits behind its own async lock, is found by its full ID or a unique prefix of it (as
//! crictl users type them), and holds a name that no other live record may hold. IDs are 64
//! random hex digits; times are nanoseconds since the epoch, as CRI counts them. Uses nothing
//! else of crius.

use std::collections::HashMap;
use std::io;
use std::sync::{Arc, Mutex, RwLock};

/// A record as its service shares it.
pub type Entry<R> = Arc<tokio::sync::Mutex<R>>;

/// Why an ID found no record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// The ID was empty.
    Empty,
    NotFound,
    /// The prefix matches this many records.
    Ambiguous(usize),
}

/// Records by ID, and the names they hold.
pub struct Registry<R> {
    map: RwLock<HashMap<String, Entry<R>>>,
    names: Mutex<HashMap<String, String>>,
}

impl<R> Default for Registry<R> {
    fn default() -> Self {
        Registry {
            map: RwLock::new(HashMap::new()),
            names: Mutex::new(HashMap::new()),
        }
    }
}

impl<R> Registry<R> {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<String, Entry<R>>> {
        self.map.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<String, Entry<R>>> {
        self.map.write().unwrap_or_else(|p| p.into_inner())
    }

    fn names(&self) -> std::sync::MutexGuard<'_, HashMap<String, String>> {
        self.names.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The full ID of `id`, which may be a unique prefix.
    pub fn resolve(&self, id: &str) -> Result<String, Lookup> {
        if id.is_empty() {
            return Err(Lookup::Empty);
        }
        let map = self.read();
        if map.contains_key(id) {
            return Ok(id.to_string());
        }
        let mut matches = map.keys().filter(|k| k.starts_with(id));
        match (matches.next(), matches.count()) {
            (None, _) => Err(Lookup::NotFound),
            (Some(m), 0) => Ok(m.clone()),
            (Some(_), more) => Err(Lookup::Ambiguous(more + 1)),
        }
    }

    /// The record of `id` (or a unique prefix of it).
    pub fn get(&self, id: &str) -> Result<Entry<R>, Lookup> {
        let id = self.resolve(id)?;
        self.read().get(&id).cloned().ok_or(Lookup::NotFound)
    }

    pub fn insert(&self, id: String, record: R) {
        self.write()
            .insert(id, Arc::new(tokio::sync::Mutex::new(record)));
    }

    pub fn remove(&self, id: &str) {
        self.write().remove(id);
    }

    /// Every record, in no particular order.
    pub fn all(&self) -> Vec<Entry<R>> {
        self.read().values().cloned().collect()
    }

    /// Reserves `name` for `id`; the record already holding it is the error.
    pub fn reserve(&self, name: &str, id: &str) -> Result<(), NameTaken> {
        let mut names = self.names();
        if let Some(holder) = names.get(name) {
            return Err(NameTaken {
                holder: holder.clone(),
            });
        }
        names.insert(name.to_string(), id.to_string());
        Ok(())
    }

    pub fn release(&self, name: &str) {
        self.names().remove(name);
    }
}

/// A name another record holds.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the name is held by {holder}")]
pub struct NameTaken {
    /// The ID of the record holding it.
    pub holder: String,
}

/// A new record ID: 32 random bytes in hex.
pub fn random_id() -> io::Result<String> {
    let mut b = [0u8; 32];
    getrandom::fill(&mut b).map_err(io::Error::other)?;
    Ok(hex::encode(b))
}

/// Now, in nanoseconds since the epoch.
pub fn now_nanos() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_by_prefix_and_names() {
        let r: Registry<u32> = Registry::default();
        assert_eq!(r.resolve(""), Err(Lookup::Empty));
        r.insert("abc1".into(), 1);
        r.insert("abc2".into(), 2);
        r.insert("def".into(), 3);
        assert_eq!(r.resolve("abc1").unwrap(), "abc1");
        assert_eq!(r.resolve("d").unwrap(), "def");
        assert_eq!(r.resolve("abc"), Err(Lookup::Ambiguous(2)));
        assert_eq!(r.resolve("x"), Err(Lookup::NotFound));
        assert_eq!(*r.get("de").unwrap().try_lock().unwrap(), 3);
        r.remove("def");
        assert_eq!(r.resolve("d"), Err(Lookup::NotFound));
        assert_eq!(r.all().len(), 2);
        r.reserve("pod/a", "abc1").unwrap();
        assert_eq!(
            r.reserve("pod/a", "abc2"),
            Err(NameTaken {
                holder: "abc1".to_string()
            })
        );
        r.release("pod/a");
        r.reserve("pod/a", "abc2").unwrap();
        let id = random_id().unwrap();
        assert_eq!(id.len(), 64);
        assert!(id.bytes().all(|b| b.is_ascii_hexdigit()));
        assert!(now_nanos() > 1_600_000_000_000_000_000);
    }
}
