//! Races between channels of one rank: two steps that touch overlapping
//! data, at least one writing, with no ordering between them through
//! program order, `after` references or delivered messages.

use std::collections::HashSet;

use super::symbolic::Access;
use super::violation::{Mode, Violation, ViolationKind as K, Violations};
use crate::flow::HappensBefore;
use crate::schedule::{Schedule, StepAt};

pub(crate) fn check(
    schedule: &Schedule,
    mode: Mode,
    accesses: &[Access],
    deliveries: &[(StepAt, StepAt)],
) -> Violations {
    let mut out = Violations::default();
    let mut order: Option<HappensBefore> = None;
    let mut by_rank: Vec<Vec<&Access>> = vec![Vec::new(); schedule.world_size as usize];
    for a in accesses {
        by_rank[a.at.rank as usize].push(a);
    }
    let mut reported: HashSet<(StepAt, StepAt)> = HashSet::new();
    for list in &mut by_rank {
        list.sort_by_key(|a| (a.region, a.start));
        for (i, a) in list.iter().enumerate() {
            for b in &list[i + 1..] {
                if b.region != a.region || b.start >= a.end {
                    break;
                }
                if a.at.channel == b.at.channel {
                    continue;
                }
                if a.region == 2 {
                    if reported.insert((a.at, b.at)) {
                        out.push(Violation::at(
                            mode,
                            a.at,
                            K::ScratchSharedAcrossChannels {
                                other_channel: b.at.channel,
                            },
                        ));
                    }
                    continue;
                }
                if !(a.write || b.write) {
                    continue;
                }
                let order = order.get_or_insert_with(|| HappensBefore::new(schedule, deliveries));
                if order.reaches(a.at, b.at) || order.reaches(b.at, a.at) {
                    continue;
                }
                if reported.insert((a.at, b.at)) {
                    out.push(
                        Violation::at(
                            mode,
                            a.at,
                            K::Race {
                                other: b.at,
                                buffer: a.buffer,
                            },
                        )
                        .with_chunk(a.start.max(b.start)),
                    );
                }
            }
        }
    }
    out
}
