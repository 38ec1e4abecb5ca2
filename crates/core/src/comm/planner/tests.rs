//! The planner: its cache, the settings it honours, the slots it gives
//! links, and the choices a selector hands it (synthesized schedules, and
//! those the executor cannot hold).

use std::sync::Arc;

use super::*;
use crate::algorithms::{Algorithm, AlgorithmParams, generate};
use crate::plan::tests::{shape, verified};
use crate::select::host_rule;
use crate::types::CollectiveKind;
use crate::verify::{VerifyOptions, verify};

/// The settings these tests start from: the host rule, 1 channel, 1 MiB
/// chunks, 2 slots, no bounds.
fn base() -> PlannerSettings {
    PlannerSettings {
        algorithms: None,
        protocols: None,
        algorithm: None,
        selector: None,
        channels: 1,
        max_chunk_bytes: 1 << 20,
        max_message_bytes: None,
        max_ll_message_bytes: None,
        slots_per_link: 2,
        schedule: None,
        rule: host_rule,
        one_shot_bytes: 0,
        max_channels: None,
    }
}

#[test]
fn the_planner_caches_per_call_and_honours_the_settings() {
    let settings = base();
    let mut p = Planner::new(4, settings.clone());
    let s = shape(Collective::AllReduce, 100, false);
    let a = p.plan(&s).unwrap();
    let b = p.plan(&s).unwrap();
    assert!(Arc::ptr_eq(&a.plan, &b.plan));
    assert_eq!(a.plan.schedule, "direct");
    let ring = p.plan_with(&s, Algorithm::Ring).unwrap();
    assert_eq!(ring.plan.schedule, "ring");
    p.set_algorithm(Some(Algorithm::Tree));
    assert_eq!(p.plan(&s).unwrap().plan.schedule, "tree");
    // A transport's message bound cuts chunks so the widest step fits.
    let mut bounded = Planner::new(
        4,
        PlannerSettings {
            max_message_bytes: Some(64),
            max_ll_message_bytes: None,
            ..settings.clone()
        },
    );
    let plan = bounded
        .plan(&shape(Collective::AllReduce, 10_000, false))
        .unwrap()
        .plan;
    assert!(
        plan.links.iter().all(|l| l.largest <= 64),
        "{:?}",
        plan.links
    );
    // The configured schedule wins where it applies, but not over an
    // executor's own choice.
    let custom = Arc::new(verified(
        Algorithm::Ring,
        Collective::Broadcast { root: 2 },
        4,
    ));
    let mut with = Planner::new(
        4,
        PlannerSettings {
            schedule: Some(custom),
            ..settings
        },
    );
    let bc = shape(Collective::Broadcast { root: 2 }, 10, false);
    assert_eq!(&*with.plan(&bc).unwrap().why, "the configured schedule");
    assert_eq!(
        with.plan_with(&bc, Algorithm::Direct)
            .unwrap()
            .plan
            .schedule,
        "direct"
    );
    assert!(matches!(
        with.plan(&shape(Collective::AllToAll, 4, true)),
        Err(crate::comm::CommError::InPlaceUnsupported { .. })
    ));
    let _ = CollectiveKind::ALL;
}

#[test]
fn every_executor_gets_at_least_the_slots_any_of_its_schedules_needs() {
    assert_eq!(link_slots(1, None), 2, "built-ins are proven with 2");
    assert_eq!(link_slots(4, None), 4);
    let star = crate::Schedule::from_json(include_str!(
        "../../../../../examples/schedules/star_all_reduce_3.json"
    ))
    .unwrap();
    let opts = VerifyOptions {
        slots_per_link: 1,
        ..VerifyOptions::default()
    };
    let one = verify(star.clone(), &opts).unwrap();
    assert_eq!(
        link_slots(1, Some(&one)),
        2,
        "a schedule proven with 1 still runs beside built-ins"
    );
    let five = verify(
        star,
        &VerifyOptions {
            slots_per_link: 5,
            ..VerifyOptions::default()
        },
    )
    .unwrap();
    assert_eq!(link_slots(2, Some(&five)), 5);
}

/// A selector that always answers the same.
#[derive(Debug)]
struct Fixed(crate::select::Choice, crate::select::Protocol);

impl crate::select::Selector for Fixed {
    fn select(&self, _: Collective, _: u32, _: usize) -> Option<crate::select::Selection> {
        Some(crate::select::Selection {
            choice: self.0.clone(),
            max_chunk_bytes: None,
            protocol: Some(self.1),
            why: "fixed".into(),
        })
    }
}

fn planner_with(choice: crate::select::Choice, max_channels: Option<u32>) -> Planner {
    let ll = crate::select::Protocol::LowLatency;
    Planner::new(
        4,
        PlannerSettings {
            selector: Some(crate::select::SharedSelector(Arc::new(Fixed(choice, ll)))),
            max_channels,
            ..base()
        },
    )
}

#[test]
fn synthesized_choices_run_and_what_the_executor_cannot_hold_falls_back() {
    use crate::select::Choice;
    let mut mine = generate(
        Algorithm::Ring,
        Collective::AllReduce,
        4,
        &AlgorithmParams {
            channels: 3,
            ..AlgorithmParams::default()
        },
    )
    .unwrap();
    mine.name = "mine".into();
    let mine = Arc::new(verify(mine, &VerifyOptions::default()).unwrap());
    let ar = shape(Collective::AllReduce, 100, false);
    let mut p = planner_with(Choice::Synthesized(mine.clone()), None);
    let planned = p.plan(&ar).unwrap();
    assert_eq!(planned.plan.schedule, "mine");
    // The selector's protocol travels with the plan.
    assert_eq!(planned.protocol, Some(crate::select::Protocol::LowLatency));
    // A schedule for another collective is refused, not run.
    let ag = shape(Collective::AllGather, 100, false);
    assert!(matches!(
        p.plan(&ag),
        Err(crate::comm::CommError::Plan(PlanError::Invalid(why))) if why.contains("mine")
    ));
    // Past the executor's channels, the rule runs and the log line says why.
    let mut narrow = planner_with(Choice::Synthesized(mine), Some(2));
    let planned = narrow.plan(&ar).unwrap();
    assert_eq!(planned.plan.schedule, "direct");
    assert_eq!(
        planned.protocol, None,
        "the rule has no view of the protocol"
    );
    assert!(
        planned.why.contains("3 channels, past the 2"),
        "{}",
        planned.why
    );
    let wide_ring = Choice::Builtin {
        algorithm: Algorithm::Ring,
        params: AlgorithmParams {
            channels: 8,
            ..AlgorithmParams::default()
        },
    };
    let planned = planner_with(wide_ring, Some(4)).plan(&ar).unwrap();
    assert!(planned.plan.channels <= 4, "{}", planned.why);
}

/// Where the selector picks LL, the executor's LL slot bounds the widest
/// message (the bulk slot still bounds the rest): the call runs the
/// protocol it was simulated with instead of falling back to bulk.
#[test]
fn an_ll_selection_is_cut_to_the_ll_slot_and_a_bulk_one_is_not() {
    use crate::select::{Choice, Protocol, SharedSelector};
    let halving = Choice::Builtin {
        algorithm: Algorithm::HalvingDoubling,
        params: AlgorithmParams::default(),
    };
    let ar = shape(Collective::AllReduce, 100_000, false);
    let largest = |protocol: Protocol| {
        let mut p = Planner::new(
            4,
            PlannerSettings {
                selector: Some(SharedSelector(Arc::new(Fixed(halving.clone(), protocol)))),
                max_message_bytes: Some(64 << 10),
                max_ll_message_bytes: Some(4 << 10),
                ..planner_with(halving.clone(), None).settings
            },
        );
        let planned = p.plan(&ar).unwrap();
        assert_eq!(planned.protocol, Some(protocol));
        let plan = planned.plan;
        assert!(plan.links.iter().all(|l| l.largest <= 64 << 10));
        plan.links.iter().map(|l| l.largest).max().unwrap()
    };
    let ll = largest(Protocol::LowLatency);
    assert!(ll <= 4 << 10, "an LL message of {ll} bytes");
    let bulk = largest(Protocol::Simple);
    assert!(bulk > 4 << 10, "bulk messages cut to {bulk} bytes");
}

/// `FERROCOLL_PROTO` on an executor with LL: a forced protocol replaces
/// the selector's (and is cut to its slot), a free collective keeps the
/// selector's, and without a selector a forced LL still reaches the plan.
/// An executor without LL ignores it.
#[test]
fn ferrocoll_proto_forces_a_protocol_per_collective_where_the_executor_has_ll() {
    use crate::select::{Choice, ProtoFilter, Protocol, SharedSelector};
    let ring = Choice::Builtin {
        algorithm: Algorithm::Ring,
        params: AlgorithmParams::default(),
    };
    let planned = |selected: Option<Protocol>, proto: &str, ll: bool, collective| {
        let settings = PlannerSettings {
            selector: selected.map(|p| SharedSelector(Arc::new(Fixed(ring.clone(), p)))),
            max_message_bytes: Some(64 << 10),
            max_ll_message_bytes: ll.then_some(4 << 10),
            protocols: ProtoFilter::parse(proto).unwrap(),
            ..base()
        };
        Planner::new(4, settings)
            .plan(&shape(collective, 100_000, false))
            .unwrap()
    };
    let (ll, simple) = (Protocol::LowLatency, Protocol::Simple);
    let p = planned(Some(simple), "allreduce:LL", true, Collective::AllReduce);
    assert_eq!(p.protocol, Some(ll));
    assert!(
        p.why.contains("FERROCOLL_PROTO `allreduce:LL` runs LL"),
        "{}",
        p.why
    );
    assert!(p.plan.links.iter().all(|l| l.largest <= 4 << 10));
    let p = planned(Some(simple), "allreduce:LL", true, Collective::AllGather);
    assert_eq!(
        p.protocol,
        Some(simple),
        "a collective no rule names is free"
    );
    assert_eq!(
        planned(Some(ll), "^ll", true, Collective::AllReduce).protocol,
        Some(simple)
    );
    assert_eq!(
        planned(None, "LL", true, Collective::AllReduce).protocol,
        Some(ll)
    );
    assert_eq!(
        planned(None, "LL", false, Collective::AllReduce).protocol,
        None
    );
}
