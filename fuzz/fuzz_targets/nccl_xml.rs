//! NCCL topology XML.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = ferrocoll_topo::sources::nccl_xml::parse_nccl_xml(&String::from_utf8_lossy(data));
});
