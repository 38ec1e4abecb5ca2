//! Write a schedule of your own, prove it, see what the verifier says when
//! it is wrong, and save it as JSON for `ferrocoll verify --algo FILE.json`.
//!
//! The schedule: a *bidirectional* ring all-reduce on n ranks. Half of the
//! data goes clockwise and half counter-clockwise, so every link carries
//! traffic in both directions — the same idea as NCCL running two channels
//! on one ring. We build it from the built-in ring by giving each channel
//! its own order, then by hand for two ranks to show the step fields.
//!
//! Run: `cargo run --example 03_write_your_own_schedule`

use ferrocoll::schedule::render_grid;
use ferrocoll::{
    Algorithm, AlgorithmParams, Buffer, Collective, ScheduleBuilder, Step, VerifyOptions, generate,
    verify,
};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // 1. From a built-in: two channels, the second ring reversed.
    let n = 4;
    let clockwise: Vec<u32> = (0..n).collect();
    let counter: Vec<u32> = (0..n).rev().collect();
    let params = AlgorithmParams {
        channels: 2,
        ring_orders: vec![clockwise, counter],
        ..AlgorithmParams::default()
    };
    let bidirectional = generate(Algorithm::Ring, Collective::AllReduce, n, &params)?;
    let verified = verify(bidirectional, &VerifyOptions::default())?;
    println!("{}", render_grid(verified.schedule()));

    // 2. By hand: two ranks, each owning one of two chunks.
    //    rank 0 sends chunk 1 to rank 1, rank 1 sends chunk 0 to rank 0;
    //    each reduces the chunk it owns and sends the result back.
    let mut b = ScheduleBuilder::new("hand-made pairwise", Collective::AllReduce, 2, 2, 1);
    for (me, peer) in [(0, 1), (1, 0)] {
        b.push(me, 0, Step::new(1).read(Buffer::Input, peer).send(peer));
        b.push(
            me,
            0,
            Step::new(1)
                .recv(peer)
                .read(Buffer::Input, me)
                .write(Buffer::Output, me)
                .send(peer),
        );
        b.push(me, 0, Step::new(1).recv(peer).write(Buffer::Output, peer));
    }
    let mine = b.build();
    let verified = verify(mine.clone(), &VerifyOptions::default())?;
    println!("{}", render_grid(verified.schedule()));

    // 3. Break it: rank 1 forgets to add its own input. The verifier names
    //    every consequence, with rank, step and chunk.
    let mut broken = mine.clone();
    broken.ranks[1].channels[0][1].read = None;
    match verify(broken, &VerifyOptions::default()) {
        Ok(_) => unreachable!("a schedule that drops a contribution cannot verify"),
        Err(e) => {
            println!("{e}");
            for v in &e.violations {
                println!("  {v}");
            }
        }
    }

    // 4. Save it for the command line: `ferrocoll verify --algo pairwise.json`.
    let path = std::env::temp_dir().join("pairwise.json");
    std::fs::write(&path, mine.to_json())?;
    println!("\nwrote {}", path.display());
    Ok(())
}
