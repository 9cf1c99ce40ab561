//! Fair admission: one queue per tenant, served by weight. The next item comes from the
//! tenant that has had the least service for its weight (start-time fair queueing), so a
//! tenant that floods the queue delays its own work, not another's: a tenant with weight w
//! among active weights W gets w/W of the starts while it has work queued.

use std::collections::{BTreeMap, VecDeque};

use crate::TenantId;

struct Lane<T> {
    items: VecDeque<T>,
    weight: u32,
    /// Service received, in units of 1/weight (virtual time).
    finish: f64,
}

/// A queue of items, each a tenant's.
pub struct FairQueue<T> {
    lanes: BTreeMap<TenantId, Lane<T>>,
    len: usize,
    /// The virtual time of the last start: a tenant that comes back after an idle spell
    /// starts here, with no credit saved up while it was away.
    now: f64,
}

impl<T> Default for FairQueue<T> {
    fn default() -> FairQueue<T> {
        FairQueue {
            lanes: BTreeMap::new(),
            len: 0,
            now: 0.0,
        }
    }
}

impl<T> FairQueue<T> {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The weights of the tenants with work queued, and `tenant`'s (`weight`) if it has none.
    pub fn active_weight(&self, tenant: TenantId, weight: u32) -> u64 {
        let mut total: u64 = self
            .lanes
            .iter()
            .filter(|(t, l)| !l.items.is_empty() && **t != tenant)
            .map(|(_, l)| u64::from(l.weight))
            .sum();
        total += u64::from(weight.max(1));
        total
    }

    /// Queued items of one tenant.
    pub fn len_of(&self, tenant: TenantId) -> usize {
        self.lanes.get(&tenant).map_or(0, |l| l.items.len())
    }

    pub fn push(&mut self, tenant: TenantId, weight: u32, item: T) {
        let now = self.now;
        let lane = self.lanes.entry(tenant).or_insert_with(|| Lane {
            items: VecDeque::new(),
            weight,
            finish: now,
        });
        lane.weight = weight.max(1);
        if lane.items.is_empty() && lane.finish < now {
            lane.finish = now;
        }
        lane.items.push_back(item);
        self.len += 1;
    }

    /// The next item to start: the oldest of the tenant furthest behind its share.
    pub fn pop(&mut self) -> Option<(TenantId, T)> {
        let tenant = self
            .lanes
            .iter()
            .filter(|(_, l)| !l.items.is_empty())
            .min_by(|a, b| a.1.finish.total_cmp(&b.1.finish).then(a.0.cmp(b.0)))
            .map(|(t, _)| *t)?;
        let lane = self.lanes.get_mut(&tenant).expect("chosen above");
        let item = lane.items.pop_front().expect("non-empty");
        self.now = lane.finish;
        lane.finish += 1.0 / f64::from(lane.weight);
        self.len -= 1;
        Some((tenant, item))
    }

    /// Keeps only the items `keep` says to (the others are returned, in no set order).
    pub fn extract(&mut self, mut take: impl FnMut(&T) -> bool) -> Vec<T> {
        let mut out = Vec::new();
        for lane in self.lanes.values_mut() {
            let (gone, kept): (Vec<T>, Vec<T>) = lane.items.drain(..).partition(|i| take(i));
            lane.items = kept.into();
            out.extend(gone);
        }
        self.len -= out.len();
        out
    }

    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.lanes.values().flat_map(|l| l.items.iter())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_does_not_starve_another_tenant() {
        let (a, b) = (TenantId(2), TenantId(3));
        let mut q = FairQueue::default();
        for i in 0..1000 {
            q.push(b, 1, i);
        }
        q.push(a, 1, -1);
        q.push(a, 1, -2);
        let first: Vec<TenantId> = (0..4).map(|_| q.pop().unwrap().0).collect();
        assert_eq!(first.iter().filter(|t| **t == a).count(), 2, "{first:?}");
        assert_eq!(q.len(), 1000 - 2);
        // A tenant back from idle gets no saved-up credit: it alternates with the flood.
        for _ in 0..100 {
            q.pop();
        }
        q.push(a, 1, -3);
        q.push(a, 1, -4);
        let next: Vec<TenantId> = (0..4).map(|_| q.pop().unwrap().0).collect();
        assert_eq!(next.iter().filter(|t| **t == a).count(), 2, "{next:?}");
    }

    #[test]
    fn weights_share_starts() {
        let (a, b) = (TenantId(2), TenantId(3));
        let mut q = FairQueue::default();
        for i in 0..300 {
            q.push(a, 3, i);
            q.push(b, 1, i);
        }
        let firsts: Vec<TenantId> = (0..200).map(|_| q.pop().unwrap().0).collect();
        let of_a = firsts.iter().filter(|t| **t == a).count();
        assert_eq!(of_a, 150, "weight 3 against 1: three starts in four");
        let gone = q.extract(|i| *i % 2 == 0);
        assert_eq!(q.len() + gone.len(), 400);
        assert_eq!(q.iter().count(), q.len());
    }
}
