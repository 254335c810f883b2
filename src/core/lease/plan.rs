//! Which member each partition should belong to (S-L18-S-L20): shares
//! counted in partitions, balanced to within one, sticky to the lease
//! table's last owners, ties broken by rendezvous hashing.
//!
//! Every instance computes the plan from the same inputs (the live
//! members and each lease row's last owner, both read in its heartbeat,
//! S-L3), so instances that read the same rows agree on it without talking
//! to each other. Each one acts only on its own share: it takes what the
//! plan gives it and releases what the plan gives away. A plan computed
//! from older rows can only delay a move, never make two owners: the
//! store's acquire is conditional (S-L10).

use std::collections::{BTreeMap, BTreeSet};

use super::id::{InstanceId, Partition};

/// The rendezvous score of `instance` for `partition` (S-L20): FNV-1a
/// (64-bit) of the id's UTF-8 bytes, XORed with the SplitMix64 finaliser
/// of `partition + 0x9E37_79B9_7F4A_7C15`, through the SplitMix64
/// finaliser again. Part of the contract: every crate version in a fleet
/// must compute the same scores, so this function never changes within a
/// major version.
pub fn score(partition: Partition, instance: &InstanceId) -> u64 {
    combine(fnv1a(instance.as_str().as_bytes()), partition)
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn combine(id_hash: u64, partition: Partition) -> u64 {
    mix(id_hash ^ mix(u64::from(partition.0).wrapping_add(0x9e37_79b9_7f4a_7c15)))
}

/// A plan: the member each of P partitions should belong to (S-L18).
///
/// With N live members, each gets `P / N` partitions and `P % N` of them
/// one more; with more members than partitions, P members get one each and
/// the rest stand by. The plan moves as few partitions as it can from the
/// last owners (S-L19):
/// 1. A member keeps the partitions it last owned, up to its share. The
///    `P % N` larger shares go to the members that keep the most (ties: by
///    the SplitMix64 finaliser of the id's FNV-1a hash, higher first, then
///    by id), so a balanced table stays as it is.
/// 2. A member over its share gives up its lowest-scoring partitions
///    ([`score`]; ties: the higher partition number).
/// 3. The partitions no member keeps (never owned, last owned by an
///    instance that is no member, or given up) go to the members below
///    their share, pair by pair in falling [`score`] order (ties: the
///    member that sorts first, then the lower partition).
///
/// So from a balanced table, a member that joins takes exactly its share,
/// each from a member over the new share, and the partitions of a member
/// that leaves are all that move.
///
/// Cost: O(P + F · N · log(F · N)) for F partitions to place.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    members: Vec<InstanceId>,
    /// Per partition, the index of its member in `members`.
    target: Vec<Option<u32>>,
}

impl Plan {
    /// The plan for `partitions` partitions among `members`, given each
    /// lease row's last owner (`owners`; partitions at or above
    /// `partitions` are ignored).
    pub fn new(
        partitions: u32,
        members: impl IntoIterator<Item = InstanceId>,
        owners: impl IntoIterator<Item = (Partition, InstanceId)>,
    ) -> Plan {
        let members: Vec<InstanceId> = members
            .into_iter()
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let p = partitions as usize;
        let mut target = vec![None; p];
        if members.is_empty() {
            return Plan { members, target };
        }
        let index: BTreeMap<&InstanceId, u32> = members.iter().zip(0u32..).collect();
        let hashes: Vec<u64> = members
            .iter()
            .map(|m| fnv1a(m.as_str().as_bytes()))
            .collect();
        let mut kept: Vec<Vec<Partition>> = vec![Vec::new(); members.len()];
        for (part, owner) in owners.into_iter().collect::<BTreeMap<_, _>>() {
            if let (Some(&i), true) = (index.get(&owner), (part.0 as usize) < p) {
                kept[i as usize].push(part);
            }
        }
        let caps = shares(p, &kept, &hashes);
        for (i, parts) in kept.iter_mut().enumerate() {
            if parts.len() > caps[i] {
                parts.sort_by_key(|&q| (std::cmp::Reverse(combine(hashes[i], q)), q));
                parts.truncate(caps[i]);
            }
            for q in parts.iter() {
                target[q.0 as usize] = Some(i as u32);
            }
        }
        place_free(&mut target, &caps, &kept, &hashes);
        Plan { members, target }
    }

    /// The member `partition` belongs to; `None` with no members or a
    /// partition out of range.
    pub fn owner(&self, partition: Partition) -> Option<&InstanceId> {
        let i = (*self.target.get(partition.0 as usize)?)?;
        self.members.get(i as usize)
    }

    /// The partitions `member` gets, in order.
    pub fn share(&self, member: &InstanceId) -> BTreeSet<Partition> {
        let Ok(i) = self.members.binary_search(member) else {
            return BTreeSet::new();
        };
        (0u32..)
            .zip(&self.target)
            .filter(|(_, t)| **t == Some(i as u32))
            .map(|(p, _)| Partition(p))
            .collect()
    }

    /// The members, sorted.
    pub fn members(&self) -> &[InstanceId] {
        &self.members
    }

    /// Each partition's member, by partition.
    pub fn owners(&self) -> impl Iterator<Item = (Partition, Option<&InstanceId>)> + '_ {
        (0u32..).zip(&self.target).map(|(p, t)| {
            let m = t.and_then(|i| self.members.get(i as usize));
            (Partition(p), m)
        })
    }
}

/// Each member's share: `P / N`, and one more for the `P % N` members that
/// keep the most (step 1).
fn shares(p: usize, kept: &[Vec<Partition>], hashes: &[u64]) -> Vec<usize> {
    let n = kept.len();
    let mut rank: Vec<usize> = (0..n).collect();
    rank.sort_by_key(|&i| (std::cmp::Reverse((kept[i].len(), mix(hashes[i]))), i));
    let mut caps = vec![p / n; n];
    for &i in rank.iter().take(p % n) {
        caps[i] += 1;
    }
    caps
}

/// Step 3: the partitions nobody keeps, to the members with room.
fn place_free(target: &mut [Option<u32>], caps: &[usize], kept: &[Vec<Partition>], hashes: &[u64]) {
    let mut room: Vec<usize> = caps.iter().zip(kept).map(|(c, k)| c - k.len()).collect();
    let free: Vec<Partition> = (0u32..)
        .zip(target.iter())
        .filter(|(_, t)| t.is_none())
        .map(|(q, _)| Partition(q))
        .collect();
    let mut pairs: Vec<(u64, usize, Partition)> = Vec::new();
    for (i, _) in room.iter().enumerate().filter(|(_, r)| **r > 0) {
        pairs.extend(free.iter().map(|&q| (combine(hashes[i], q), i, q)));
    }
    pairs.sort_by_key(|&(s, i, q)| (std::cmp::Reverse(s), i, q));
    for (_, i, q) in pairs {
        let slot = &mut target[q.0 as usize];
        if slot.is_none() && room[i] > 0 {
            *slot = Some(i as u32);
            room[i] -= 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> InstanceId {
        InstanceId::new(s).unwrap()
    }

    fn ids(n: usize) -> Vec<InstanceId> {
        (0..n).map(|i| id(&format!("relay-{i}"))).collect()
    }

    fn owners_of(plan: &Plan) -> Vec<(Partition, InstanceId)> {
        plan.owners()
            .filter_map(|(p, m)| m.map(|m| (p, m.clone())))
            .collect()
    }

    fn moved(a: &Plan, b: &Plan) -> usize {
        a.owners()
            .zip(b.owners())
            .filter(|(x, y)| x.1 != y.1)
            .count()
    }

    #[test]
    fn the_score_is_stable() {
        // S-L20: these values are part of the contract (computed apart from
        // this code, from the function its doc describes).
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        let s = score(Partition(0), &id("relay-0"));
        assert_eq!(s, score(Partition(0), &id("relay-0")));
        assert_ne!(s, score(Partition(1), &id("relay-0")));
        assert_eq!(
            [
                score(Partition(0), &id("a")),
                score(Partition(5), &id("relay-1"))
            ],
            [0x2235_10de_0dd4_615f, 0x2cc2_0bd8_b60d_ffd5],
            "changing the score breaks fleets that mix crate versions"
        );
    }

    #[test]
    fn shares_are_balanced_to_within_one() {
        // S-L18.
        for n in 1..=9 {
            let plan = Plan::new(64, ids(n), []);
            let sizes: Vec<usize> = ids(n).iter().map(|m| plan.share(m).len()).collect();
            assert_eq!(sizes.iter().sum::<usize>(), 64);
            let (lo, hi) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
            assert!(hi - lo <= 1, "{n} members: {sizes:?}");
        }
    }

    #[test]
    fn members_beyond_the_partitions_stand_by() {
        let plan = Plan::new(3, ids(5), []);
        let sizes: Vec<usize> = ids(5).iter().map(|m| plan.share(m).len()).collect();
        assert_eq!(sizes.iter().filter(|&&s| s == 1).count(), 3);
        assert_eq!(sizes.iter().filter(|&&s| s == 0).count(), 2);
        // The owners keep their partition when another stand-by joins.
        let more = Plan::new(3, ids(6), owners_of(&plan));
        assert_eq!(moved(&plan, &more), 0);
    }

    #[test]
    fn no_members_no_owners() {
        let plan = Plan::new(4, [], [(Partition(1), id("gone"))]);
        assert!(plan.owners().all(|(_, m)| m.is_none()));
        assert_eq!(plan.owner(Partition(9)), None);
        assert!(plan.share(&id("gone")).is_empty());
    }

    #[test]
    fn a_balanced_table_is_a_fixed_point() {
        let first = Plan::new(64, ids(5), []);
        let again = Plan::new(64, ids(5), owners_of(&first));
        assert_eq!(first, again);
    }

    #[test]
    fn a_join_moves_exactly_the_joiners_share_and_a_leave_only_the_leavers() {
        // S-L19.
        for n in 1..8 {
            let before = Plan::new(64, ids(n), []);
            let before = Plan::new(64, ids(n), owners_of(&before));
            let joined = Plan::new(64, ids(n + 1), owners_of(&before));
            let joiner = &ids(n + 1)[n];
            assert_eq!(moved(&before, &joined), joined.share(joiner).len());
            assert_eq!(joined.share(joiner).len(), 64 / (n + 1));
            let mut rest = ids(n + 1);
            let leaver = rest.remove(n / 2);
            let left = Plan::new(64, rest, owners_of(&joined));
            assert_eq!(moved(&joined, &left), joined.share(&leaver).len());
        }
    }

    #[test]
    fn a_restarting_member_keeps_its_share() {
        // S-L21: the members and last owners do not change while a member
        // restarts within its grace, so neither does the plan.
        let plan = Plan::new(16, ids(3), []);
        let plan = Plan::new(16, ids(3), owners_of(&plan));
        let again = Plan::new(16, ids(3), owners_of(&plan));
        assert_eq!(plan, again);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 256, failure_persistence: None, ..Default::default() })]

        /// S-L18, S-L19 from any table: shares within one (or one each
        /// and stand-bys beyond P); the plan's own result is a fixed
        /// point; from it, a join moves exactly the joiner's share and a
        /// leave exactly the leaver's partitions.
        #[test]
        fn plans_are_balanced_stable_and_move_only_what_they_must(
            n in 1usize..9,
            p in 1u32..80,
            owners in proptest::collection::vec(proptest::option::of(0usize..12), 80),
            leaver in 0usize..9,
        ) {
            let members = ids(n);
            let all = ids(12);
            let owners: Vec<(Partition, InstanceId)> = (0..p)
                .filter_map(|q| owners[q as usize].map(|o| (Partition(q), all[o].clone())))
                .collect();
            let plan = Plan::new(p, members.clone(), owners);
            let sizes: Vec<usize> = members.iter().map(|m| plan.share(m).len()).collect();
            proptest::prop_assert_eq!(sizes.iter().sum::<usize>(), p as usize);
            let (lo, hi) = (*sizes.iter().min().unwrap(), *sizes.iter().max().unwrap());
            proptest::prop_assert!(hi - lo <= 1, "{:?}", sizes);
            proptest::prop_assert_eq!(hi, (p as usize).div_ceil(n).max(1).min(p as usize));
            let stable = Plan::new(p, members.clone(), owners_of(&plan));
            proptest::prop_assert_eq!(&stable, &plan);
            let mut more = members.clone();
            more.push(all[n].clone());
            let joined = Plan::new(p, more.clone(), owners_of(&plan));
            proptest::prop_assert_eq!(moved(&plan, &joined), joined.share(&all[n]).len());
            if n > 1 {
                let gone = members[leaver % n].clone();
                let rest: Vec<InstanceId> = members.iter().filter(|m| **m != gone).cloned().collect();
                let left = Plan::new(p, rest, owners_of(&plan));
                proptest::prop_assert_eq!(moved(&plan, &left), plan.share(&gone).len());
            }
        }
    }
}
