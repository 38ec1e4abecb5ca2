//! The TCP transport's wire: bytes as they would arrive from a peer go
//! through the frame reader (lengths, channels, culprit ranks, data headers
//! checked) until it errs, and through the connection handshake's hello
//! check; nothing may panic, and no hello may pass without the secret.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    ferrocoll_process::fuzzing::fuzz_hello(data);
    ferrocoll_process::fuzzing::fuzz_frames(data);
});
