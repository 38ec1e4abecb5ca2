//! Schedule files: load, and verify whatever loads; neither may panic.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data)
        && let Ok(s) = ferrocoll_core::Schedule::from_json(text)
    {
        let _ = ferrocoll_core::verify(s, &ferrocoll_core::VerifyOptions::default());
    }
});
