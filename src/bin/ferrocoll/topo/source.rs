//! Where a command's topology comes from: `--topo SPEC` or the `topo`
//! command's own flags.

use std::path::Path;

use ferrocoll::topo::{Topology, presets, sources};

/// Default thread count of the `host` preset when no rank count is given.
pub(crate) const DEFAULT_HOST_RANKS: u32 = 4;

/// The most ranks a preset is built for: what the commands then route,
/// simulate and print grows with n² and more (a million ran unbounded).
pub(crate) const MAX_RANKS: u32 = 1024;

/// `SPEC` is a preset name, `discover` (NVML), or a file: `.json` is our
/// own format, `.xml` an NCCL topology dump, anything else `nvidia-smi
/// topo -m` text.
pub(crate) fn load(spec: &str, host_ranks: u32) -> Result<Topology, String> {
    if spec == "discover" {
        return sources::nvml::discover().map_err(|e| e.to_string());
    }
    if let Some(cluster) = presets::cpu_cluster::parse(spec) {
        let cluster = cluster.map_err(|e| e.to_string())?;
        if u64::from(cluster.hosts) * u64::from(cluster.ranks) > u64::from(MAX_RANKS) {
            return Err(format!(
                "`{spec}`: hosts × ranks must be at most {MAX_RANKS}"
            ));
        }
        return presets::by_name(spec, host_ranks).map_err(|e| e.to_string());
    }
    if presets::NAMES.contains(&spec) || presets::cluster::parse(spec).is_some() {
        if !(1..=MAX_RANKS).contains(&host_ranks) {
            return Err(format!("--ranks must be between 1 and {MAX_RANKS}"));
        }
        return presets::by_name(spec, host_ranks).map_err(|e| e.to_string());
    }
    let path = Path::new(spec);
    if !path.exists() {
        return Err(format!(
            "`{spec}` is neither a preset ({}), `discover`, nor a file",
            presets::NAMES.join(", ")
        ));
    }
    let text = ferrocoll::input::read_text(path).map_err(|e| format!("{spec}: {e}"))?;
    let parsed = match path.extension().and_then(|e| e.to_str()) {
        Some("json") => Topology::from_json(&text),
        Some("xml") => sources::nccl_xml::parse_nccl_xml(&text),
        _ => sources::smi::parse_smi(&text),
    };
    parsed.map_err(|e| format!("{spec}: {e}"))
}
