//! MSCCL algorithm XML: import, and verify whatever imports; neither may panic.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Ok(s) = ferrocoll_core::Schedule::from_msccl_xml(&String::from_utf8_lossy(data)) {
        let _ = ferrocoll_core::verify(s, &ferrocoll_core::VerifyOptions::default());
    }
});
