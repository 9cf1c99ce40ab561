//! Shards: the I-th of N disjoint parts of a suite's planned rollouts, so one suite runs on
//! many machines (Slurm job arrays, Kubernetes Indexed Jobs) and `farm merge` puts the parts
//! back together.
//!
//! The split is by task (every sample of a task in one shard, so pass@k stays computable per
//! shard), deterministic (the same tasks, rollouts and N give the same parts everywhere) and
//! balanced by planned rollouts: tasks, largest first (ties by id), each go to the shard with
//! the fewest rollouts so far (ties by index).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::{Deserialize, Serialize};

/// Shard `index` of `count` (0-based, as Kubernetes' `JOB_COMPLETION_INDEX`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Shard {
    pub index: u32,
    pub count: u32,
}

impl fmt::Display for Shard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

/// Why a shard could not be told.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShardError {
    #[error("--shard {0:?} is not I/N (0 <= I < N, e.g. 0/4), or auto")]
    Spec(String),
    #[error("--shard auto: this process runs under neither a Slurm job array (SLURM_ARRAY_TASK_ID) nor a Kubernetes Indexed Job (JOB_COMPLETION_INDEX)")]
    NoEngine,
    #[error("--shard auto: {var} = {value:?} is not a number")]
    Env { var: &'static str, value: String },
    #[error("--shard auto needs the number of shards: --shards N, or FARM_SHARDS (a Kubernetes Job's completions)")]
    NoCount,
    #[error("--shard auto: index {index} is not below the {count} shards")]
    Range { index: u32, count: u32 },
}

impl Shard {
    /// `I/N`.
    pub fn parse(spec: &str) -> Result<Shard, ShardError> {
        let bad = || ShardError::Spec(spec.to_string());
        let (i, n) = spec.split_once('/').ok_or_else(bad)?;
        let (index, count): (u32, u32) = (
            i.trim().parse().map_err(|_| bad())?,
            n.trim().parse().map_err(|_| bad())?,
        );
        if count == 0 || index >= count {
            return Err(bad());
        }
        Ok(Shard { index, count })
    }

    /// The shard of the engine this process runs under.
    /// - A Slurm job array: with N given (`shards`, else `FARM_SHARDS`), shard
    ///   `SLURM_ARRAY_TASK_ID` of N, so a 0..N-1 array's index resubmitted alone keeps its
    ///   number; without, `SLURM_ARRAY_TASK_ID` less `SLURM_ARRAY_TASK_MIN`, of
    ///   `SLURM_ARRAY_TASK_COUNT` (or `MAX - MIN + 1`).
    /// - A Kubernetes Indexed Job: `JOB_COMPLETION_INDEX` of N (`shards`, else `FARM_SHARDS`).
    pub fn from_env(env: &dyn Fn(&str) -> Option<String>, shards: Option<u32>) -> Result<Shard, ShardError> {
        let number = |var: &'static str| -> Result<Option<u32>, ShardError> {
            match env(var) {
                None => Ok(None),
                Some(value) => value
                    .trim()
                    .parse()
                    .map(Some)
                    .map_err(|_| ShardError::Env { var, value }),
            }
        };
        let explicit = match shards {
            Some(n) => Some(n),
            None => number("FARM_SHARDS")?,
        };
        let (index, count) = if let Some(id) = number("SLURM_ARRAY_TASK_ID")? {
            match explicit {
                // An array numbered 0..N-1: one index resubmitted alone (`--array=2`) keeps
                // its number.
                Some(n) => (id, n),
                None => {
                    let min = number("SLURM_ARRAY_TASK_MIN")?.unwrap_or(0);
                    let count = match (number("SLURM_ARRAY_TASK_COUNT")?, number("SLURM_ARRAY_TASK_MAX")?) {
                        (Some(c), _) => c,
                        (None, Some(max)) => max.saturating_sub(min) + 1,
                        (None, None) => return Err(ShardError::NoCount),
                    };
                    (id.saturating_sub(min), count)
                }
            }
        } else if let Some(index) = number("JOB_COMPLETION_INDEX")? {
            (index, explicit.ok_or(ShardError::NoCount)?)
        } else {
            return Err(ShardError::NoEngine);
        };
        if index >= count {
            return Err(ShardError::Range { index, count });
        }
        Ok(Shard { index, count })
    }

    /// The tasks of this shard, from each task's planned rollouts.
    pub fn tasks(&self, rollouts: &BTreeMap<String, usize>) -> BTreeSet<String> {
        let mut order: Vec<(&String, usize)> = rollouts.iter().map(|(t, n)| (t, *n)).collect();
        order.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(b.0)));
        let mut load = vec![0usize; self.count as usize];
        let mut mine = BTreeSet::new();
        for (task, n) in order {
            let target = (0..load.len())
                .min_by_key(|&i| (load[i], i))
                .expect("at least one shard");
            load[target] += n;
            if target == self.index as usize {
                mine.insert(task.clone());
            }
        }
        mine
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_and_the_environment() {
        assert_eq!(Shard::parse("2/4").unwrap(), Shard { index: 2, count: 4 });
        for bad in ["4/4", "1", "a/2", "0/0", "-1/3"] {
            assert!(Shard::parse(bad).is_err(), "{bad}");
        }
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| pairs.iter().find(|(key, _)| *key == k).map(|(_, v)| v.to_string())
        };
        assert_eq!(
            Shard::from_env(
                &env(&[
                    ("SLURM_ARRAY_TASK_ID", "3"),
                    ("SLURM_ARRAY_TASK_MIN", "1"),
                    ("SLURM_ARRAY_TASK_MAX", "3")
                ]),
                None
            )
            .unwrap(),
            Shard { index: 2, count: 3 }
        );
        assert_eq!(
            Shard::from_env(
                &env(&[("SLURM_ARRAY_TASK_ID", "0"), ("SLURM_ARRAY_TASK_COUNT", "2")]),
                None
            )
            .unwrap(),
            Shard { index: 0, count: 2 }
        );
        assert_eq!(
            Shard::from_env(&env(&[("JOB_COMPLETION_INDEX", "1")]), Some(4)).unwrap(),
            Shard { index: 1, count: 4 }
        );
        assert_eq!(
            Shard::from_env(&env(&[("JOB_COMPLETION_INDEX", "1"), ("FARM_SHARDS", "2")]), None).unwrap(),
            Shard { index: 1, count: 2 }
        );
        assert_eq!(
            Shard::from_env(&env(&[("JOB_COMPLETION_INDEX", "1")]), None),
            Err(ShardError::NoCount)
        );
        assert_eq!(Shard::from_env(&env(&[]), None), Err(ShardError::NoEngine));
        assert_eq!(
            Shard::from_env(&env(&[("JOB_COMPLETION_INDEX", "5")]), Some(4)),
            Err(ShardError::Range { index: 5, count: 4 })
        );
        assert!(matches!(
            Shard::from_env(&env(&[("SLURM_ARRAY_TASK_ID", "x")]), None),
            Err(ShardError::Env { .. })
        ));
        // N given: the array index is the shard, even when resubmitted alone.
        assert_eq!(
            Shard::from_env(
                &env(&[
                    ("SLURM_ARRAY_TASK_ID", "2"),
                    ("SLURM_ARRAY_TASK_MIN", "2"),
                    ("SLURM_ARRAY_TASK_COUNT", "1")
                ]),
                Some(3)
            )
            .unwrap(),
            Shard { index: 2, count: 3 }
        );
        assert_eq!(
            Shard::from_env(&env(&[("SLURM_ARRAY_TASK_ID", "2"), ("FARM_SHARDS", "3")]), None).unwrap(),
            Shard { index: 2, count: 3 }
        );
    }

    #[test]
    fn shards_are_disjoint_complete_deterministic_and_balanced_by_rollouts() {
        let rollouts: BTreeMap<String, usize> = (0..50)
            .map(|i| (format!("t{i:02}"), if i % 7 == 0 { 16 } else { 1 + i % 3 }))
            .collect();
        let total: usize = rollouts.values().sum();
        let n = 4;
        let parts: Vec<BTreeSet<String>> = (0..n).map(|index| Shard { index, count: n }.tasks(&rollouts)).collect();
        let mut all = BTreeSet::new();
        for part in &parts {
            for t in part {
                assert!(all.insert(t.clone()), "{t} in two shards");
            }
        }
        assert_eq!(all.len(), rollouts.len());
        assert_eq!(
            parts,
            (0..n)
                .map(|index| Shard { index, count: n }.tasks(&rollouts))
                .collect::<Vec<_>>()
        );
        let loads: Vec<usize> = parts.iter().map(|p| p.iter().map(|t| rollouts[t]).sum()).collect();
        let (max, min) = (*loads.iter().max().unwrap(), *loads.iter().min().unwrap());
        assert!(max - min <= 16 && loads.iter().sum::<usize>() == total, "{loads:?}");
        // More shards than tasks: some shards get none.
        let few: BTreeMap<String, usize> = [("a".to_string(), 1)].into();
        assert!(Shard { index: 1, count: 2 }.tasks(&few).is_empty());
    }
}
