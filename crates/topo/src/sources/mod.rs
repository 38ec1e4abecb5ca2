//! Where topologies come from besides presets and our own file: text
//! printed by `nvidia-smi topo -m`, NCCL's topology XML dump, and NVML at
//! run time.

pub mod nccl_xml;
pub mod nvml;
pub mod smi;
