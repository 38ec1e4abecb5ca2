//! What a bug report needs to know about this machine's CUDA: the driver's
//! version and devices, NVRTC's version. Each part is asked only after
//! [`crate::probe`] has seen its library, and each failure is kept as text
//! beside what did answer, so `ferrocoll info` prints everything it can.

use cudarc::driver::{result, sys};

use crate::probe;

/// One visible GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceFacts {
    /// Its ordinal under `CUDA_VISIBLE_DEVICES`.
    pub ordinal: i32,
    /// Its name (`NVIDIA H200`).
    pub name: String,
    /// Its memory, bytes.
    pub memory_bytes: usize,
    /// Compute capability (major, minor).
    pub compute: (i32, i32),
    /// Streaming multiprocessors.
    pub multiprocessors: i32,
    /// PCI domain, bus and device, as `nvidia-smi` prints them.
    pub pci: String,
}

/// The driver: its CUDA version and devices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverFacts {
    /// The CUDA version the driver supports (major, minor).
    pub version: (i32, i32),
    /// The visible devices.
    pub devices: Vec<DeviceFacts>,
    /// `p2p[a][b]`: device `a` can access device `b`'s memory directly
    /// (`cuDeviceCanAccessPeer`; the diagonal is true).
    pub p2p: Vec<Vec<bool>>,
}

/// The driver's facts, or why there are none.
pub fn driver() -> Result<DriverFacts, String> {
    let count = probe::devices().map_err(|e| e.to_string())?;
    let mut code = 0;
    // SAFETY: `probe::devices` loaded and initialised the driver; the call
    // only writes the out-pointer.
    let r = unsafe { sys::cuDriverGetVersion(&mut code) };
    r.result().map_err(|e| format!("cuDriverGetVersion: {e}"))?;
    let devices = (0..count as i32)
        .map(device)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    let p2p = (0..count as i32)
        .map(|a| {
            (0..count as i32)
                .map(|b| a == b || can_access(a, b))
                .collect()
        })
        .collect();
    Ok(DriverFacts {
        version: (code / 1000, (code % 1000) / 10),
        devices,
        p2p,
    })
}

/// Whether device `a` can map device `b`'s memory (false where asking fails).
fn can_access(a: i32, b: i32) -> bool {
    let (Ok(da), Ok(db)) = (result::device::get(a), result::device::get(b)) else {
        return false;
    };
    let mut can = 0;
    // SAFETY: both are device handles of the initialised driver; the call
    // only writes the out-pointer.
    let r = unsafe { sys::cuDeviceCanAccessPeer(&mut can, da, db) };
    r.result().is_ok() && can != 0
}

fn device(ordinal: i32) -> Result<DeviceFacts, cudarc::driver::DriverError> {
    use sys::CUdevice_attribute as A;
    let dev = result::device::get(ordinal)?;
    // SAFETY: `dev` is a device handle the initialised driver returned;
    // attribute queries only read.
    let attr = |a| unsafe { result::device::get_attribute(dev, a) };
    Ok(DeviceFacts {
        ordinal,
        name: result::device::get_name(dev)?,
        // SAFETY: as above.
        memory_bytes: unsafe { result::device::total_mem(dev) }?,
        compute: (
            attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        ),
        multiprocessors: attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
        pci: format!(
            "{:08x}:{:02x}:{:02x}.0",
            attr(A::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID)?,
            attr(A::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID)?,
            attr(A::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID)?
        ),
    })
}

/// NVRTC's version (major, minor), or why there is none.
pub fn nvrtc_version() -> Result<(i32, i32), String> {
    if !probe::nvrtc_present() {
        return Err(
            "libnvrtc is not installed or not on LD_LIBRARY_PATH (the CUDA toolkit, or the \
             NVRTC Python wheel's nvidia/cu13/lib)"
                .into(),
        );
    }
    let (mut major, mut minor) = (0, 0);
    // SAFETY: the library is present (probed above); the call only writes
    // the two out-pointers.
    let r = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    r.result().map_err(|e| format!("nvrtcVersion: {e}"))?;
    Ok((major, minor))
}
