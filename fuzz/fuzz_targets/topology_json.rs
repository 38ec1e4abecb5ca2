//! Topology files: load, then route every device pair.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Ok(t) = ferrocoll_topo::Topology::from_json(&String::from_utf8_lossy(data)) {
        for a in t.devices() {
            for b in t.devices() {
                let _ = t.route(a, b);
            }
        }
    }
});
