//! `ferrocoll topo`: show a machine's link graph the way `nvidia-smi topo
//! -m` and `p2pBandwidthLatencyTest` do, plus the rings the search finds
//! and the bottleneck of each algorithm; or draw it.

pub(crate) mod bound;
pub(crate) mod source;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use ferrocoll::topo::probe::{LinkProbe, ProbeOptions, host::HostProbe};
use ferrocoll::topo::select::{SelectOptions, TopologySelector};
use ferrocoll::topo::sim::CostModel;
use ferrocoll::topo::{Topology, presets, render};
use ferrocoll::{Algorithm, Collective};

#[derive(Args, Debug)]
pub(crate) struct TopoArgs {
    /// A preset (see `--list`).
    #[arg(long, group = "source")]
    preset: Option<String>,
    /// A file of `nvidia-smi topo -m` output.
    #[arg(long, group = "source")]
    smi: Option<PathBuf>,
    /// An NCCL topology dump (NCCL_TOPO_DUMP_FILE).
    #[arg(long = "nccl-xml", group = "source")]
    nccl_xml: Option<PathBuf>,
    /// A ferrocoll topology file (JSON).
    #[arg(long, group = "source")]
    file: Option<PathBuf>,
    /// Discover this machine's GPUs through NVML.
    #[arg(long, group = "source")]
    discover: bool,
    /// List the presets and exit.
    #[arg(long)]
    list: bool,
    /// Threads of the `host` preset.
    #[arg(long, default_value_t = source::DEFAULT_HOST_RANKS)]
    ranks: u32,
    /// Print Graphviz DOT instead of the report.
    #[arg(long)]
    dot: bool,
    /// Write an SVG drawing to this file.
    #[arg(long)]
    svg: Option<PathBuf>,
    /// Print the topology as a ferrocoll JSON file instead of the report.
    #[arg(long)]
    json: bool,
    /// Also measure the links (GPUs through CUDA, or the CPU host):
    /// p2pBandwidthLatencyTest-style matrices.
    #[arg(long)]
    probe: bool,
    /// Only these devices (positions among the topology's, e.g. `0-5` or
    /// `0,1,4`): the machine a scheduler hands a job.
    #[arg(long, value_parser = bound::parse_gpus)]
    gpus: Option<bound::Gpus>,
}

pub(crate) fn run(args: &TopoArgs) -> Result<ExitCode, String> {
    if args.list {
        for name in presets::NAMES {
            println!("{name}");
        }
        return Ok(ExitCode::SUCCESS);
    }
    let path = |p: &PathBuf| p.display().to_string();
    let spec = if let Some(p) = &args.preset {
        p.clone()
    } else if let Some(p) = &args.smi {
        return show(args, load_as(p, Kind::Smi)?);
    } else if let Some(p) = &args.nccl_xml {
        return show(args, load_as(p, Kind::Xml)?);
    } else if let Some(p) = &args.file {
        path(p)
    } else if args.discover {
        "discover".to_owned()
    } else {
        "host".to_owned()
    };
    show(args, source::load(&spec, args.ranks)?)
}

enum Kind {
    Smi,
    Xml,
}

fn load_as(p: &std::path::Path, kind: Kind) -> Result<Topology, String> {
    let text = ferrocoll::input::read_text(p).map_err(|e| format!("{}: {e}", p.display()))?;
    let parsed = match kind {
        Kind::Smi => ferrocoll::topo::sources::smi::parse_smi(&text),
        Kind::Xml => ferrocoll::topo::sources::nccl_xml::parse_nccl_xml(&text),
    };
    parsed.map_err(|e| format!("{}: {e}", p.display()))
}

fn show(args: &TopoArgs, full: Topology) -> Result<ExitCode, String> {
    let t = bound::members_of(&full, bound::Gpus::of(&args.gpus))?;
    if let Some(p) = &args.svg {
        std::fs::write(p, render::svg(&t)).map_err(|e| format!("{}: {e}", p.display()))?;
        eprintln!("wrote {}", p.display());
    }
    if args.dot {
        print!("{}", render::dot(&t));
        return Ok(ExitCode::SUCCESS);
    }
    if args.json {
        print!("{}", t.to_json());
        return Ok(ExitCode::SUCCESS);
    }
    let e = |e: ferrocoll::topo::TopologyError| e.to_string();
    println!("# {}: {}", t.name, t.description);
    println!(
        "# {} nodes, {} links, {} devices\n",
        t.nodes.len(),
        t.links.len(),
        t.devices().len()
    );
    print!("{}", render::smi_matrix(&t).map_err(e)?);
    let cost = CostModel::default();
    println!(
        "\n{}",
        render::bandwidth_matrix(&t, &cost).map_err(e)?.render(
            "Predicted unidirectional bandwidth matrix (GB/s of payload; diagonal: device memory)",
            1
        )
    );
    println!(
        "{}",
        render::latency_matrix(&t)
            .map_err(e)?
            .render("Predicted latency matrix (us, links only)", 2)
    );
    let n = t.devices().len() as u32;
    let ceiling = bound::report(&full, bound::Gpus::of(&args.gpus))?;
    if n >= 2 {
        let busy = crate::busy::Busy::spinner("searching rings and trees");
        let selector = TopologySelector::new(t.clone(), n, SelectOptions::default()).map_err(e)?;
        drop(busy);
        let rings = selector.rings();
        println!(
            "# ring search: {} ring(s), {:.1} GB/s together",
            rings.orders.len(),
            rings.bandwidth
        );
        for (i, o) in rings.orders.iter().enumerate() {
            let names: Vec<&str> = o
                .iter()
                .map(|&r| t.nodes[t.devices()[r as usize]].name.as_str())
                .collect();
            println!("#   ring {i}: {}", names.join(" -> "));
        }
        if n > REPORT_MAX_SIMULATED {
            println!(
                "#\n# all-reduce of 1 GiB: not simulated above {REPORT_MAX_SIMULATED} ranks (minutes of simulation at this size); `ferrocoll sim --ranks {n}` runs it"
            );
            probe(args, &t, n)?;
            return Ok(ExitCode::SUCCESS);
        }
        println!(
            "#\n# all-reduce of 1 GiB on {n} ranks, best variant of each algorithm and of what was synthesized:"
        );
        let busy = crate::busy::Busy::spinner("simulating each candidate at 1 GiB");
        let reduced = report_selector(&t, n).transpose().map_err(e)?;
        let all = reduced
            .as_ref()
            .unwrap_or(&selector)
            .evaluate(Collective::AllReduce, 1 << 30)
            .map_err(e)?;
        drop(busy);
        for f in &crate::sim_cmd::families(&Algorithm::ALL, true, &all) {
            let best = all
                .iter()
                .filter(|(c, _)| c.family() == f)
                .min_by(|x, y| x.1.time_us.total_cmp(&y.1.time_us));
            if let Some((c, p)) = best {
                let b = p.bottleneck().map_or("none".to_owned(), |l| {
                    format!("{} ({:.0}% busy)", l.resource, l.utilisation * 100.0)
                });
                let of = ceiling.as_ref().map_or(String::new(), |c| {
                    c.fraction(ferrocoll::CollectiveKind::AllReduce, p.busbw)
                });
                // The steady-state estimate's rows are marked as `sim` marks them.
                let steady = if p.model == ferrocoll::topo::sim::Fidelity::Steady {
                    " ~"
                } else {
                    ""
                };
                println!(
                    "#   {:<22} busbw {:>8.1} GB/s{of}   bottleneck {b}",
                    format!("{c}{steady}"),
                    p.busbw
                );
            }
        }
    }
    probe(args, &t, n)?;
    Ok(ExitCode::SUCCESS)
}

/// Above this many ranks the report skips its 1 GiB simulation: it grows
/// with the square of the ranks (direct) times the candidates.
const REPORT_MAX_SIMULATED: u32 = 32;

/// The report's selector above 8 ranks: one channel layout and one chunk
/// size per algorithm instead of the full sweep, so the report stays
/// within seconds (`None`: the full sweep of the default options).
fn report_selector(
    t: &ferrocoll::topo::Topology,
    n: u32,
) -> Option<Result<TopologySelector, ferrocoll::topo::TopologyError>> {
    (n > 8).then(|| {
        let options = SelectOptions {
            channel_multipliers: vec![1],
            chunk_sizes: vec![2 << 20],
            ..SelectOptions::default()
        };
        TopologySelector::new(t.clone(), n, options)
    })
}

/// `--probe`: measure the links of this machine.
fn probe(args: &TopoArgs, t: &ferrocoll::topo::Topology, n: u32) -> Result<(), String> {
    if args.probe {
        let gpus = t
            .devices()
            .iter()
            .any(|&d| t.nodes[d].kind == ferrocoll::topo::NodeKind::Gpu);
        let report = if gpus {
            let probe = ferrocoll::cuda::GpuProbe::all().map_err(|e| e.to_string())?;
            probe.measure(&ProbeOptions::default())
        } else {
            HostProbe {
                threads: n as usize,
            }
            .measure(&ProbeOptions::default())
        }
        .map_err(|e| e.to_string())?;
        println!("\n{}", report.render());
    }
    Ok(())
}
