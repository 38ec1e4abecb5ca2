//! The members' throughput bound in the `topo` and `sim` reports, and the
//! `--gpus` device list both commands take.

use ferrocoll::CollectiveKind;
use ferrocoll::topo::Topology;
use ferrocoll::topo::bound::{Bound, Bounds, Fabric, Relays, throughput_bounds};
use ferrocoll::topo::sim::CostModel;

/// Most devices one `--gpus` list may name.
const MAX_LISTED: usize = 4096;

/// Positions among a topology's devices (one value for clap, which would
/// read a bare `Vec` as many).
#[derive(Debug, Clone)]
pub(crate) struct Gpus(pub(crate) Vec<usize>);

impl Gpus {
    /// The list of an optional argument.
    pub(crate) fn of(g: &Option<Gpus>) -> Option<&[usize]> {
        g.as_ref().map(|g| g.0.as_slice())
    }
}

/// A device list: `0,1,4`, `0-5` or a mix (`0-3,6`), positions among the
/// topology's devices.
pub(crate) fn parse_gpus(s: &str) -> Result<Gpus, String> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim) {
        let number = |t: &str| {
            t.trim()
                .parse::<usize>()
                .map_err(|_| format!("`{t}` in --gpus `{s}` is not a device number"))
        };
        let (lo, hi) = match part.split_once('-') {
            Some((lo, hi)) => (number(lo)?, number(hi)?),
            None => (number(part)?, number(part)?),
        };
        if lo > hi || hi - lo >= MAX_LISTED.saturating_sub(out.len()) {
            return Err(format!("--gpus `{s}`: `{part}` is empty or too long"));
        }
        out.extend(lo..=hi);
    }
    let n = out.len();
    out.sort_unstable();
    out.dedup();
    if out.len() != n {
        return Err(format!("--gpus `{s}` names a device twice"));
    }
    Ok(Gpus(out))
}

/// `full` as the job sees it: only the listed devices (all without a list).
pub(crate) fn members_of(full: &Topology, gpus: Option<&[usize]>) -> Result<Topology, String> {
    match gpus {
        Some(list) => full.with_devices(list).map_err(|e| e.to_string()),
        None => Ok(full.clone()),
    }
}

/// The bounds a report measures algorithms against: over every link and
/// over NVLink (`None` where there is none), both without relays through
/// devices outside the list — the graph the report simulates.
#[derive(Debug, Clone)]
pub(crate) struct Ceiling {
    every: Bounds,
    nvlink: Option<Bounds>,
}

impl Ceiling {
    /// ` (0.60 of the bound, 0.66 of NVLink's)` for a bus bandwidth of
    /// `op`; all-reduce against the bound of a reduce-scatter then an
    /// all-gather (an all-reduce that reduces on the way may pass it).
    pub(crate) fn fraction(&self, op: CollectiveKind, busbw: f64) -> String {
        let of = |b: &Bounds| {
            match op {
                CollectiveKind::AllGather => Some(b.all_gather.busbw),
                CollectiveKind::ReduceScatter => Some(b.reduce_scatter.busbw),
                CollectiveKind::AllReduce => Some(b.all_reduce),
                _ => None,
            }
            .filter(|&x| x > 0.0 && x.is_finite())
        };
        let Some(every) = of(&self.every) else {
            return String::new();
        };
        let nv = self
            .nvlink
            .as_ref()
            .and_then(of)
            .map_or(String::new(), |x| format!(", {:.2} of NVLink's", busbw / x));
        format!(" ({:.2} of the bound{nv})", busbw / every)
    }
}

/// Print the bounds of the listed devices (every device without a list)
/// on `full`, with and without relays through the other devices.
pub(crate) fn report(full: &Topology, gpus: Option<&[usize]>) -> Result<Option<Ceiling>, String> {
    let all: Vec<usize> = (0..full.devices().len()).collect();
    let members = full
        .device_ids(gpus.unwrap_or(&all))
        .map_err(|e| e.to_string())?;
    if members.len() < 2 {
        return Ok(None);
    }
    let cost = CostModel::default();
    let bounds = |fabric, relays| {
        throughput_bounds(full, &members, &cost, fabric, relays).map_err(|e| e.to_string())
    };
    let subset = members.len() < full.devices().len();
    println!(
        "# throughput bounds of {} ranks, busbw in GB/s (minimum cuts at the simulator's link rates):",
        members.len()
    );
    println!(
        "#   {:<44} {:>10} {:>10} {:>11} {:>10}",
        "", "all-gather", "reduce-sc.", "all-reduce", "any a-r"
    );
    let mut ceiling = None;
    let relay_kinds: &[Relays] = if subset {
        &[Relays::Any, Relays::MembersOnly]
    } else {
        &[Relays::Any]
    };
    for &relays in relay_kinds {
        let mut pair = Vec::new();
        for fabric in [Fabric::Every, Fabric::Nvlink] {
            let b = bounds(fabric, relays)?;
            let label = format!(
                "{}{}",
                if fabric == Fabric::Every {
                    "every link"
                } else {
                    "NVLink only"
                },
                match (subset, relays) {
                    (false, _) => "",
                    (true, Relays::Any) => ", other devices relaying",
                    (true, Relays::MembersOnly) => ", members alone",
                }
            );
            let usable = fabric == Fabric::Every || b.all_gather.busbw > 0.0;
            if usable {
                println!(
                    "#   {label:<44} {:>10.1} {:>10.1} {:>11.1} {:>10.1}",
                    b.all_gather.busbw, b.reduce_scatter.busbw, b.all_reduce, b.all_reduce_any
                );
            }
            pair.push(usable.then_some(b));
        }
        let [every, nvlink]: [Option<Bounds>; 2] = pair.try_into().expect("two fabrics");
        if let Some(every) = every {
            println!("#   {}", cut(full, &every.all_gather));
            ceiling = Some(Ceiling { every, nvlink });
        }
    }
    println!(
        "#   (all-reduce: as a reduce-scatter then an all-gather, as rings run it; `any a-r` also bounds trees, which reduce on the way)"
    );
    Ok(ceiling)
}

/// The bottleneck cut, named when it is small.
fn cut(t: &Topology, b: &Bound) -> String {
    if b.cut.is_empty() {
        return String::new();
    }
    let names: Vec<&str> = b.cut.iter().map(|&v| t.nodes[v].name.as_str()).collect();
    let inside = if names.len() <= 4 {
        names.join(" + ")
    } else {
        format!("{} nodes", names.len())
    };
    format!(
        "all-gather's tightest cut: into {inside}, which needs the blocks of {} members outside",
        b.outside
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_lists_take_ranges_and_refuse_repeats() {
        assert_eq!(parse_gpus("0-3,6").unwrap().0, vec![0, 1, 2, 3, 6]);
        assert_eq!(parse_gpus("5, 1").unwrap().0, vec![1, 5]);
        for bad in [
            "",
            "a",
            "3-1",
            "1,1",
            "0-1,1",
            "0-99999",
            "0,0-18446744073709551615",
        ] {
            assert!(parse_gpus(bad).is_err(), "{bad}");
        }
    }
}
