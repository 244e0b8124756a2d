//! The backoff of a background writer's failed reconciles, per object: 1 s, doubling up
//! to 5 min, reset by a reconcile that succeeds.

use std::{collections::HashMap, hash::Hash, sync::Mutex, time::Duration};

const FIRST_RETRY: Duration = Duration::from_secs(1);
const LAST_RETRY: Duration = Duration::from_secs(300);

/// Past this many objects with failed attempts, those gone are forgotten.
const KEPT: usize = 1024;

/// The failed attempts of each object `K` names.
#[derive(Debug)]
pub struct Retries<K>(Mutex<HashMap<K, u32>>);

impl<K: Clone + Eq + Hash> Retries<K> {
    /// The delay before the next attempt at `key`, after one more failure. Now and then,
    /// the objects that `exists` says are gone are forgotten, so the map stays small.
    pub fn next(&self, key: &K, exists: impl Fn(&K) -> bool) -> Duration {
        let mut attempts = self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if attempts.len() > KEPT {
            attempts.retain(|key, _| exists(key));
        }
        let attempt = attempts.entry(key.clone()).or_default();
        *attempt = attempt.saturating_add(1);
        (FIRST_RETRY * 2u32.saturating_pow(*attempt - 1)).min(LAST_RETRY)
    }

    /// Done with `key`: nothing to retry.
    pub fn forget(&self, key: &K) {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .remove(key);
    }
}

impl<K> Default for Retries<K> {
    fn default() -> Self {
        Self(Mutex::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_delay_doubles_up_to_five_minutes_and_a_success_resets_it() {
        let retries = Retries::default();
        let delays: Vec<u64> = (0..11).map(|_| retries.next(&"a", |_| true).as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300]);
        assert_eq!(retries.next(&"b", |_| true), FIRST_RETRY, "each object apart");
        retries.forget(&"a");
        assert_eq!(retries.next(&"a", |_| true), FIRST_RETRY);
    }

    #[test]
    fn objects_gone_are_forgotten_once_many_are_kept() {
        let retries = Retries::default();
        for key in 0..=KEPT {
            retries.next(&key, |_| true);
        }
        retries.next(&0, |key| *key == 0);
        assert_eq!(retries.0.lock().unwrap().len(), 1);
        assert_eq!(
            retries.next(&0, |_| true),
            Duration::from_secs(4),
            "the one left keeps its count"
        );
    }
}
