//! The half of discovery that talks to NVML (and sysfs): the facts of
//! every GPU and pair, as a plain [`NvmlSnapshot`].

use super::*;

/// Ask NVML for the facts [`build_topology`] needs.
///
/// # Errors
/// [`TopologyError::Nvml`]: the library or driver is missing (the message
/// says "NVML not found"), NVML sees no GPU, or it failed to give a GPU's
/// PCI address.
pub fn snapshot() -> Result<NvmlSnapshot, TopologyError> {
    let nvml = Nvml::init().map_err(|e| TopologyError::Nvml(init_failure(&e)))?;
    read_snapshot(&nvml)
}

/// The message for a failed `nvmlInit`, sorted by what the user can do
/// about it.
fn init_failure(e: &NvmlError) -> String {
    match e {
        NvmlError::LibloadingError(_)
        | NvmlError::FailedToLoadSymbol(_)
        | NvmlError::LibraryNotFound => {
            format!(
                "NVML not found: no NVIDIA driver on this machine (loading libnvidia-ml.so.1: {e})"
            )
        }
        NvmlError::DriverNotLoaded => "NVML not found: no NVIDIA driver on this machine \
             (libnvidia-ml.so.1 is installed but the kernel driver is not loaded)"
            .to_string(),
        NvmlError::NoPermission => {
            "NVML is installed but may not talk to the driver (no permission)".to_string()
        }
        other => format!("NVML failed to initialise: {other}"),
    }
}

/// A query failure that discovery cannot work around.
fn query_failure(what: &str) -> impl Fn(NvmlError) -> TopologyError + '_ {
    move |e| TopologyError::Nvml(format!("{what}: {e}"))
}

fn read_snapshot(nvml: &Nvml) -> Result<NvmlSnapshot, TopologyError> {
    let count = nvml
        .device_count()
        .map_err(query_failure("counting GPUs"))?;
    if count == 0 {
        return Err(TopologyError::Nvml(
            "NVML is loaded but reports no GPU".into(),
        ));
    }
    let devices = (0..count)
        .map(|i| {
            nvml.device_by_index(i)
                .map_err(|e| TopologyError::Nvml(format!("opening GPU {i}: {e}")))
        })
        .collect::<Result<Vec<_>, _>>()?;

    let mut gpus = Vec::with_capacity(devices.len());
    for (i, device) in devices.iter().enumerate() {
        let pci = device
            .pci_info()
            .map_err(|e| TopologyError::Nvml(format!("PCI address of GPU {i}: {e}")))?;
        let pci_bus_id = normalize_bus_id(&pci.bus_id);
        let name = device.name().unwrap_or_else(|e| {
            warn!("NVML: name of GPU {i}: {e}");
            "NVIDIA GPU".into()
        });
        // NVML's own NUMA query (nvmlDeviceGetNumaNodeId) answers with the
        // node *of the GPU's memory* on coherent Grace systems and fails
        // elsewhere; the node of the PCIe root, which is what staging
        // through host memory cares about, is the kernel's.
        let numa = sysfs_numa_node(&pci_bus_id);
        // The "max" queries give what GPU and slot can both do; the
        // "current" ones drop to gen 1 while the GPU idles, so they are
        // only a fallback.
        let pcie_generation = device
            .max_pcie_link_gen()
            .or_else(|_| device.current_pcie_link_gen())
            .ok()
            .and_then(|g| u8::try_from(g).ok())
            .filter(|g| (1..=6).contains(g));
        let pcie_width = device
            .max_pcie_link_width()
            .or_else(|_| device.current_pcie_link_width())
            .ok()
            .and_then(|w| u8::try_from(w).ok())
            .filter(|w| (1..=16).contains(w));
        if pcie_generation.is_none() || pcie_width.is_none() {
            warn!(
                "NVML: PCIe link of GPU {i} unknown; assuming PCIe {}.0 x{}",
                FALLBACK_PCIE.0, FALLBACK_PCIE.1
            );
        }
        gpus.push(GpuFacts {
            name,
            pci_bus_id,
            numa,
            pcie_generation,
            pcie_width,
            memory_bus_width_bits: device.memory_bus_width().ok(),
            max_memory_clock_mhz: device.max_clock_info(Clock::Memory).ok(),
            nvlinks: read_nvlinks(i, device),
        });
    }

    let n = devices.len();
    let mut ancestors = vec![vec![CommonAncestor::Internal; n]; n];
    let mut p2p_read_ok = vec![vec![true; n]; n];
    for i in 0..n {
        for j in 0..n {
            if i == j {
                continue;
            }
            // The wrapper takes the second device by value, so open it anew.
            let other = nvml
                .device_by_index(j as u32)
                .map_err(|e| TopologyError::Nvml(format!("opening GPU {j}: {e}")))?;
            ancestors[i][j] = match devices[i].topology_common_ancestor(other) {
                Ok(level) => level.into(),
                Err(e) => {
                    let guess = guess_ancestor(&gpus[i], &gpus[j]);
                    warn!(
                        "NVML: common PCIe ancestor of GPUs {i} and {j}: {e}; assuming {guess:?}"
                    );
                    guess
                }
            };
            // An unanswered query counts as "no": a staged copy is always
            // possible, a peer access that is not is a crash.
            p2p_read_ok[i][j] = match devices[i].p2p_status(&devices[j], P2pCapabilitiesIndex::Read)
            {
                Ok(status) => status == P2pStatus::Ok,
                Err(e) => {
                    warn!("NVML: peer-to-peer status of GPUs {i} and {j}: {e}; assuming off");
                    false
                }
            };
        }
    }

    Ok(NvmlSnapshot {
        driver_version: nvml.sys_driver_version().ok(),
        gpus,
        ancestors,
        p2p_read_ok,
    })
}

/// The active NVLinks of GPU `i`. Slots that do not exist or are down make
/// the state query fail or answer "inactive", and are skipped.
fn read_nvlinks(i: usize, device: &nvml_wrapper::Device<'_>) -> Vec<NvlinkFacts> {
    let mut links = Vec::new();
    for slot in 0..NVLINK_MAX_LINKS {
        let link = device.link_wrapper_for(slot);
        if !matches!(link.is_active(), Ok(true)) {
            continue;
        }
        let from_version = link.version().ok().and_then(nvlink_generation);
        let Some(generation) = from_version.or_else(|| {
            device
                .architecture()
                .ok()
                .and_then(generation_of_architecture)
        }) else {
            warn!(
                "NVML: NVLink {slot} of GPU {i} is active but its generation is unknown; left out"
            );
            continue;
        };
        let remote_pci_bus_id = match link.remote_pci_info() {
            Ok(pci) => Some(normalize_bus_id(&pci.bus_id)),
            Err(e) => {
                warn!("NVML: far end of NVLink {slot} of GPU {i}: {e}");
                None
            }
        };
        let remote_pci_class = remote_pci_bus_id.as_deref().and_then(sysfs_pci_class);
        links.push(NvlinkFacts {
            link: slot,
            generation,
            remote_pci_bus_id,
            remote_pci_class,
        });
    }
    links
}

/// The NVLink generation each architecture shipped with, for drivers that
/// will not say per link.
fn generation_of_architecture(arch: DeviceArchitecture) -> Option<u8> {
    match arch {
        DeviceArchitecture::Pascal => Some(1),
        DeviceArchitecture::Volta | DeviceArchitecture::Turing => Some(2),
        DeviceArchitecture::Ampere => Some(3),
        DeviceArchitecture::Hopper => Some(4),
        DeviceArchitecture::Blackwell => Some(5),
        _ => None,
    }
}

/// A stand-in when NVML cannot place two GPUs: NUMA nodes that differ mean
/// different sockets; otherwise assume different host bridges of one
/// socket, the farthest PCIe relation short of crossing sockets.
fn guess_ancestor(a: &GpuFacts, b: &GpuFacts) -> CommonAncestor {
    match (a.numa, b.numa) {
        (Some(x), Some(y)) if x != y => CommonAncestor::System,
        _ => CommonAncestor::Node,
    }
}

/// The NUMA node the kernel assigns the PCI device; `None` where sysfs
/// is absent or says -1 (firmware gave no affinity).
fn sysfs_numa_node(bus_id: &str) -> Option<u32> {
    let text = std::fs::read_to_string(format!("/sys/bus/pci/devices/{bus_id}/numa_node")).ok()?;
    u32::try_from(text.trim().parse::<i64>().ok()?).ok()
}

/// The PCI class code of a device from sysfs (`0x030200`).
fn sysfs_pci_class(bus_id: &str) -> Option<u32> {
    let text = std::fs::read_to_string(format!("/sys/bus/pci/devices/{bus_id}/class")).ok()?;
    let text = text.trim();
    u32::from_str_radix(text.strip_prefix("0x").unwrap_or(text), 16).ok()
}
