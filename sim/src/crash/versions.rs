//! The crash world's codec versions across lives (S-J14): in a share of
//! seeds, drawn on a stream of their own, a deploy between two lives
//! changes the codec's version (`Versioned::new(ItemCodec, n)`) and what
//! a recovery does with items of another version
//! (`JournalConfig::other_version`).
//!
//! The journal's codec reads one version, its own: an upgrade refuses
//! every pending item of an older version, and a rollback to an older
//! codec refuses the items a newer one staged. Refused items are never
//! decoded (S-J14): `Refuse` counts them lost under `other_version`;
//! `Hand` counts them so and hands their bytes over, which the world
//! decodes and checks against what it staged; `Fail` fails the build
//! while any is pending, with nothing on disk changed, and the world then
//! rolls the deploy back: the life builds again with the version the life
//! before ran, handing over what that one does not read.

use rand::Rng;

use crate::draw::{chance, rng};

/// The stream of the version schedule (xored into the seed).
pub const VERSION_STREAM: u64 = 0xC0DE_C000_0000_0005;

/// What a life's recovery does with items of another codec version.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnOther {
    /// `OtherVersion::Refuse`: counted lost under `other_version`.
    Refuse,
    /// `OtherVersion::Hand`: counted so, and their bytes handed over.
    Hand,
    /// `OtherVersion::Fail`: the build fails while any is pending; the
    /// world rolls the deploy back.
    Fail,
}

/// A deploy: from life `from` on, the codec's version and policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deploy {
    /// The first life it runs in.
    pub from: u32,
    /// The codec version.
    pub version: u32,
    /// What recovery does with items of another version.
    pub on_other: OnOther,
}

/// The seed's deploys, in life order; the first runs from life 1.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Versions {
    /// The deploys (at least one: life 1's).
    pub deploys: Vec<Deploy>,
}

impl Versions {
    /// The schedule of `seed`: in a third of the seeds one to three
    /// deploys between lives 2 and 8, each an upgrade (a version above
    /// every one so far) or a rollback (the version before the last
    /// change), under a policy drawn for it (`Refuse` 1/2, `Hand` 1/3,
    /// `Fail` 1/6); else one version (0, the default) for every life.
    pub fn draw(seed: u64) -> Versions {
        let mut r = rng(seed ^ VERSION_STREAM);
        if !chance(&mut r, 1, 3) {
            return Versions::fixed(0);
        }
        let first = r.random_range(0..=2u32);
        let mut deploys = vec![Deploy {
            from: 1,
            version: first,
            on_other: OnOther::Refuse,
        }];
        let mut lives: Vec<u32> = (0..r.random_range(1..=3))
            .map(|_| r.random_range(2..=8))
            .collect();
        lives.sort_unstable();
        lives.dedup();
        let (mut top, mut before) = (first, first);
        for from in lives {
            let now = deploys.last().expect("life 1's").version;
            let version = if now != before && chance(&mut r, 1, 3) {
                before
            } else if now > 0 && chance(&mut r, 1, 4) {
                now - 1
            } else {
                top + 1
            };
            top = top.max(version);
            before = now;
            let on_other = match r.random_range(0..6) {
                0..=2 => OnOther::Refuse,
                3 | 4 => OnOther::Hand,
                _ => OnOther::Fail,
            };
            deploys.push(Deploy {
                from,
                version,
                on_other,
            });
        }
        Versions { deploys }
    }

    /// One version for every life, under `Refuse`.
    pub fn fixed(version: u32) -> Versions {
        Versions {
            deploys: vec![Deploy {
                from: 1,
                version,
                on_other: OnOther::Refuse,
            }],
        }
    }

    /// The deploy life `life` runs.
    pub fn of(&self, life: u32) -> Deploy {
        self.deploys
            .iter()
            .rev()
            .find(|d| d.from <= life)
            .copied()
            .unwrap_or(self.deploys[0])
    }

    /// More than one version in the schedule.
    pub fn changes(&self) -> bool {
        self.deploys.len() > 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedules_are_deterministic_and_change_in_a_share_of_seeds() {
        let mut changing = 0;
        for seed in 0..600 {
            let v = Versions::draw(seed);
            assert_eq!(v, Versions::draw(seed));
            assert_eq!(v.of(1).from, 1);
            // Each deploy starts later than the one before.
            assert!(v.deploys.windows(2).all(|w| w[0].from < w[1].from));
            changing += u32::from(v.changes());
        }
        assert!((150..250).contains(&changing), "{changing}");
    }

    #[test]
    fn a_life_runs_the_last_deploy_before_it() {
        let v = Versions {
            deploys: vec![
                Deploy {
                    from: 1,
                    version: 1,
                    on_other: OnOther::Refuse,
                },
                Deploy {
                    from: 3,
                    version: 2,
                    on_other: OnOther::Hand,
                },
            ],
        };
        assert_eq!(v.of(2).version, 1);
        assert_eq!(v.of(3).version, 2);
        assert_eq!(v.of(40).on_other, OnOther::Hand);
    }
}
