//! The lock key (contract §2): the seed's two-int4 session advisory lock, and the stable
//! mapping from a lock name to an id.

/// Default lock class: `1886156915` = `0x706C7873`, ASCII `plxs` (the seed's leader lock).
pub const DEFAULT_LOCK_CLASS: i32 = 1_886_156_915;
/// Default lock id within the class: `1` (the seed's leader lock).
pub const DEFAULT_LOCK_ID: i32 = 1;

/// A session advisory lock key in PostgreSQL's two-int4 form, `pg_try_advisory_lock(class, id)`.
///
/// `pg_locks` shows it with `classid = class`, `objid = id` (both as `oid`, so a negative int4
/// appears as its unsigned 32-bit value) and `objsubid = 2`. Displays as `class:id`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LockKey {
    /// First int4 of the key (`classid` in `pg_locks`).
    pub class: i32,
    /// Second int4 of the key (`objid` in `pg_locks`).
    pub id: i32,
}

impl Default for LockKey {
    /// The seed's leader lock, `(1886156915, 1)`.
    fn default() -> Self {
        LockKey {
            class: DEFAULT_LOCK_CLASS,
            id: DEFAULT_LOCK_ID,
        }
    }
}

impl std::fmt::Display for LockKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.class, self.id)
    }
}

/// The lock id `--lock-name NAME` stands for: the first 4 bytes of SHA-256 of the UTF-8 NAME,
/// big-endian, as a signed int4. Fixed forever (FIELD-NOTES PostgreSQL 10): never a hasher
/// whose output may change between builds, never the server's `hashtext()`.
pub fn lock_id_for_name(name: &str) -> i32 {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(name.as_bytes());
    i32::from_be_bytes([digest[0], digest[1], digest[2], digest[3]])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_key_is_the_seeds() {
        let key = LockKey::default();
        assert_eq!(key.class, 0x706C_7873);
        assert_eq!(&key.class.to_be_bytes(), b"plxs");
        assert_eq!(key.to_string(), "1886156915:1");
    }

    #[test]
    fn lock_name_golden_values() {
        // Pinned: computed independently (Python hashlib) and never to change.
        assert_eq!(lock_id_for_name("plexsphere"), -1_450_088_986);
        assert_eq!(lock_id_for_name("nightly-report"), 1_732_491_792);
        assert_eq!(lock_id_for_name(""), -474_954_686);
        assert_eq!(lock_id_for_name("ü"), 1_618_244_810);
        assert_eq!(lock_id_for_name("leaderrun"), -690_802_688);
    }
}
