//! Programs and layouts the host refuses before any thread walks them:
//! plans that do not fit the layout, more ranks than the device tables
//! hold, and a program edited after lowering.

use super::*;

#[test]
fn plans_that_do_not_fit_the_layout_are_typed_errors() {
    let plan = plan_of(&all_reduce(300), 2);
    let fits = layout_for(&plan, 2, false);
    assert!(DeviceProgram::lower(&plan, fits, Protocol::Simple).is_ok());
    let cases = [
        Layout {
            world_size: 4,
            ..fits
        },
        Layout {
            max_channels: 1,
            ..fits
        },
        Layout { slots: 1, ..fits },
        Layout {
            slot_bytes: 16,
            ..fits
        },
        Layout {
            slot_bytes: fits.slot_bytes + 8,
            ..fits
        },
        Layout { slots: 0, ..fits },
    ];
    for layout in cases {
        assert!(
            DeviceProgram::lower(&plan, layout, Protocol::Simple).is_err(),
            "{layout:?}"
        );
    }
}

#[test]
fn more_ranks_than_the_device_tables_hold_is_a_typed_error() {
    let case = Case {
        world_size: 65,
        ..all_reduce(65)
    };
    let plan = plan_of(&case, 1);
    assert!(matches!(
        DeviceProgram::lower(&plan, layout_for(&plan, 2, true), Protocol::Simple),
        Err(ProgramError::TooLarge(_))
    ));
}

#[test]
fn an_edited_program_is_refused_before_any_thread_walks_it() {
    let plan = plan_of(&all_reduce(64), 1);
    let layout = layout_for(&plan, 2, true);
    let good = DeviceProgram::lower(&plan, layout, Protocol::Simple).unwrap();
    let mut past = good.clone();
    past.ranks[1].pieces[0].offset = 1 << 40;
    let mut peer = good.clone();
    peer.ranks[0].ends[0].peer = 7;
    let mut other_layout = good.clone();
    other_layout.layout.slots = 3;
    // A staged receive turned into one that reads the peer's memory, with
    // no region to read; a staged send turned into one the receiver would
    // read in place while its receiving end still reads the slot.
    let mut unplaced = good.clone();
    let at = staged_end(&unplaced.ranks[0], false);
    unplaced.ranks[0].ends[at].transfer = Transfer::InSender;
    let mut one_sided = good.clone();
    let at = staged_end(&one_sided.ranks[1], true);
    one_sided.ranks[1].ends[at].transfer = Transfer::InSender;
    let Some(fabric) = fabric(layout, Duration::from_secs(20)) else {
        return;
    };
    for bad in [&past, &peer, &other_layout, &unplaced, &one_sided] {
        assert!(bad.validate().is_err() || bad.layout != layout);
        let inputs = vec![vec![1.0f32; 64]; 3];
        let mut outputs = vec![vec![0.0f32; 64]; 3];
        let started = std::time::Instant::now();
        let results = fabric.call(&[&good, bad, &good], f32_buffers(&mut outputs, &inputs));
        assert!(started.elapsed() < Duration::from_secs(10));
        assert!(results.iter().all(Result::is_err), "{results:?}");
        assert!(outputs.iter().flatten().all(|&x| x == 0.0), "nothing ran");
    }
    // Buffers that do not fit the program are refused as well.
    let Some(fabric) = fabric_for(layout) else {
        return;
    };
    let inputs = [vec![1.0f32; 64], vec![1.0f32; 63], vec![1.0f32; 64]];
    let mut outputs = vec![vec![0.0f32; 64]; 3];
    let results = fabric.call(&[&good; 3], f32_buffers(&mut outputs, &inputs));
    assert!(
        matches!(
            &results[1],
            Err(CommError::BufferSize {
                what: "input",
                got: 63,
                needed: 64
            })
        ),
        "{results:?}"
    );
    assert!(results.iter().all(Result::is_err), "{results:?}");
    assert!(outputs.iter().flatten().all(|&x| x == 0.0));
}

/// The first staged receiving (or sending) end of a rank.
fn staged_end(p: &RankProgram, sending: bool) -> usize {
    p.ops
        .iter()
        .flat_map(|o| {
            let s = if sending { o.send } else { o.recv };
            s.first as usize..(s.first + s.count) as usize
        })
        .find(|&i| p.ends[i].transfer == Transfer::Slot)
        .expect("a staged message")
}

fn fabric_for(layout: Layout) -> Option<HostFabric> {
    fabric(layout, Duration::from_secs(20))
}
