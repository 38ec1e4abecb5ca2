//! `nvidia-smi topo -m` text.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = ferrocoll_topo::sources::smi::parse_smi(&String::from_utf8_lossy(data));
});
