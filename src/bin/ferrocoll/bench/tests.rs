//! The sweep over a target, without a real backend.

use clap::Parser;
use ferrocoll::cpu::CpuConfig;
use ferrocoll::topo::probe::membw::MemoryBandwidth;

use super::row::{Measure, Row};
use super::target::{Sweep, Target};
use super::{BenchArgs, files, setup, sweep};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    bench: BenchArgs,
}

/// A target whose own rows come back and whose comparison fails, as
/// `--compare nccl` does at K > 1 with an NCCL older than 2.30.
struct FailingComparison;

impl Target for FailingComparison {
    fn describe(&self, _: &BenchArgs, _: &CpuConfig, _: &str) -> Vec<String> {
        Vec::new()
    }

    fn memory_bandwidth(&self) -> Result<MemoryBandwidth, String> {
        Err("none here".into())
    }

    fn run_section(&self, sweep: &Sweep) -> Result<Vec<Row>, String> {
        let m = Measure {
            time_us: 1.0,
            time_us_min: 1.0,
            time_us_median: 1.0,
            time_us_max: 1.0,
            algbw: 1.0,
            busbw: 1.0,
            wrong: 0,
            paired: None,
        };
        Ok(sweep
            .sizes
            .iter()
            .map(|&size| Row {
                collective: sweep.section.kind.name().to_owned(),
                algorithm: "ring".into(),
                ranks: 2,
                size,
                count: size / 4,
                dtype: "float".into(),
                redop: "sum".into(),
                root: -1,
                out_of_place: Some(m),
                in_place: Some(m),
                predicted_us: None,
                outside: None,
            })
            .collect())
    }

    fn compare(&self, _: &Sweep) -> Result<Option<Vec<Row>>, String> {
        Err("NCCL 2.28.9 cannot put 2 ranks on one GPU (2.30 can)".into())
    }
}

/// A comparison that fails is a note, not the end of the run: every row
/// of our own stays, and the JSON's facts carry the note.
#[test]
fn a_failing_comparison_is_a_note_and_the_rows_stay() {
    let args = Cli::parse_from(["bench", "-b", "1K", "-e", "4K", "--op", "all"]).bench;
    let setup = setup::Setup::new(&args, None).unwrap();
    let mut facts = files::RunFacts::start(&args);
    let rows = sweep(
        &FailingComparison,
        &args,
        &setup,
        None,
        None,
        None,
        &mut facts,
    )
    .unwrap();
    assert_eq!(rows.len(), setup.sections.len() * setup.sizes.len());
    assert_eq!(facts.notes().len(), setup.sections.len());
    assert!(facts.notes()[0].contains("2.30 can"), "{:?}", facts.notes());
}
