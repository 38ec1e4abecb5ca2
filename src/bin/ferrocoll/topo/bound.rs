//! The members' throughput bound in the `topo` and `sim` reports, and the
//! `--gpus` device list both commands take.

use ferrocoll::topo::Topology;
use ferrocoll::topo::bound::{Bound, Fabric, Relays, throughput_bound};
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
        if lo > hi || out.len() + (hi - lo) >= MAX_LISTED {
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
/// over NVLink (0 where there is none), both without relays through
/// devices outside the list — the graph the report simulates.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ceiling {
    pub(crate) every: f64,
    pub(crate) nvlink: f64,
}

impl Ceiling {
    /// ` (0.60 of the bound, 0.66 of NVLink's)` for a bus bandwidth.
    pub(crate) fn fraction(&self, busbw: f64) -> String {
        let nv = if self.nvlink > 0.0 {
            format!(", {:.2} of NVLink's", busbw / self.nvlink)
        } else {
            String::new()
        };
        format!(" ({:.2} of the bound{nv})", busbw / self.every)
    }
}

/// Print the bound of the listed devices (every device without a list) on
/// `full`, with and without relays through the other devices.
pub(crate) fn report(full: &Topology, gpus: Option<&[usize]>) -> Result<Option<Ceiling>, String> {
    let all: Vec<usize> = (0..full.devices().len()).collect();
    let members = full
        .device_ids(gpus.unwrap_or(&all))
        .map_err(|e| e.to_string())?;
    if members.len() < 2 {
        return Ok(None);
    }
    let cost = CostModel::default();
    let bound = |fabric, relays| {
        throughput_bound(full, &members, &cost, fabric, relays).map_err(|e| e.to_string())
    };
    let every = bound(Fabric::Every, Relays::Any)?;
    let nvlink = bound(Fabric::Nvlink, Relays::Any)?;
    println!(
        "# throughput bound of {} ranks (busbw of all-gather, reduce-scatter and all-reduce; minimum cut at the simulator's link rates):",
        members.len()
    );
    println!(
        "#   every link   {:>8.1} GB/s   {}",
        every.busbw,
        cut(full, &every)
    );
    if nvlink.busbw > 0.0 {
        println!(
            "#   NVLink only  {:>8.1} GB/s   {}",
            nvlink.busbw,
            cut(full, &nvlink)
        );
    }
    let alone = bound(Fabric::Every, Relays::MembersOnly)?;
    let alone_nv = bound(Fabric::Nvlink, Relays::MembersOnly)?;
    if members.len() < full.devices().len() {
        println!(
            "#   without relays through the other {} devices: every link {:.1} GB/s, NVLink only {:.1} GB/s",
            full.devices().len() - members.len(),
            alone.busbw,
            alone_nv.busbw
        );
    }
    Ok(Some(Ceiling {
        every: alone.busbw,
        nvlink: alone_nv.busbw,
    }))
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
        "(cut: into {inside}, which needs the blocks of {} members outside)",
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
        for bad in ["", "a", "3-1", "1,1", "0-1,1", "0-99999"] {
            assert!(parse_gpus(bad).is_err(), "{bad}");
        }
    }
}
