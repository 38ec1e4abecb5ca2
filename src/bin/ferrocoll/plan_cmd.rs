//! `ferrocoll plan`: the execution plan of one call — every rank's
//! instructions with their byte regions, messages, slots and waits, the
//! resources and the hash — as text or JSON.

use std::process::ExitCode;
use std::sync::Arc;

use clap::Args;
use ferrocoll::comm::{Planner, Planning};
use ferrocoll::cpu::CpuConfig;
use ferrocoll::types::CallShape;
use ferrocoll::{CollectiveKind, DataType, ReduceOp};

use crate::bench::setup::custom_schedule;
use crate::spec::{self, AlgoSpec, parse_size};

#[derive(Args, Debug)]
pub(crate) struct PlanArgs {
    /// `auto` (what the CPU executor would run: the host's selector, then
    /// its rule), one algorithm, or a schedule file.
    #[arg(long, default_value = "auto", value_parser = spec::parse_algo)]
    algo: AlgoSpec,
    /// The collective.
    #[arg(long, default_value = "all-reduce")]
    op: CollectiveKind,
    /// World size.
    #[arg(long, default_value_t = 4)]
    ranks: u32,
    /// Elements per rank's block (K, M, G suffixes: binary multiples).
    #[arg(long, default_value = "1M", value_parser = parse_size)]
    count: usize,
    /// Element type.
    #[arg(
        short = 'd',
        long = "datatype",
        alias = "dtype",
        default_value = "float"
    )]
    dtype: DataType,
    /// Reduction op.
    #[arg(short = 'o', long, default_value = "sum")]
    redop: ReduceOp,
    /// Root of broadcast and reduce.
    #[arg(short = 'r', long, default_value_t = 0)]
    root: u32,
    /// The in-place call.
    #[arg(long)]
    in_place: bool,
    /// Channels for ring, tree and direct.
    #[arg(long, default_value_t = 1)]
    channels: u32,
    /// Largest chunk, in bytes (default: the CPU executor's).
    #[arg(long, value_parser = parse_size)]
    max_chunk_bytes: Option<usize>,
    /// Slots per link.
    #[arg(long, default_value_t = CpuConfig::builtin().planning.slots_per_link)]
    slots: u32,
    /// Print the JSON form.
    #[arg(long)]
    json: bool,
}

pub(crate) fn run(args: &PlanArgs) -> Result<ExitCode, String> {
    if args.ranks == 0 {
        return Err("--ranks must be at least 1".into());
    }
    if args.root >= args.ranks {
        return Err(format!(
            "--root {} is out of range for {} ranks",
            args.root, args.ranks
        ));
    }
    let base = CpuConfig {
        planning: Planning {
            channels: Some(args.channels),
            slots_per_link: args.slots,
            max_chunk_bytes: Some(
                args.max_chunk_bytes
                    .unwrap_or(ferrocoll::plan::HOST_CHUNK_BYTES),
            ),
            ..CpuConfig::builtin().planning
        },
        ..CpuConfig::builtin()
    };
    let mut config = ferrocoll::auto::cpu_config(base).map_err(|e| e.to_string())?;
    if args.max_chunk_bytes.is_some() {
        config.planning.selector = None;
    }
    let mut collective = args.op.with_root(args.root);
    match &args.algo {
        AlgoSpec::Auto => {}
        AlgoSpec::Builtin(list) if list.len() == 1 => config.planning.algorithm = Some(list[0]),
        AlgoSpec::File(_) => {
            let custom = custom_schedule(&args.algo, args.ranks)?.map(Arc::unwrap_or_clone);
            let custom = custom.expect("a file names a schedule");
            collective = custom.schedule().collective;
            config.planning.schedule = Some(Arc::new(custom));
        }
        other => {
            return Err(format!(
                "--algo {other}: a plan is of one schedule; name one algorithm"
            ));
        }
    }
    let shape = CallShape {
        collective,
        count: args.count,
        dtype: args.dtype,
        op: args.redop,
        in_place: args.in_place,
        purpose: Default::default(),
    };
    let planned = Planner::new(args.ranks, config.planner_settings())
        .plan(&shape)
        .map_err(|e| e.to_string())?;
    if args.json {
        println!("{}", planned.plan.to_json());
    } else {
        println!("# why: {}", planned.why);
        print!("{}", planned.plan);
    }
    Ok(ExitCode::SUCCESS)
}
