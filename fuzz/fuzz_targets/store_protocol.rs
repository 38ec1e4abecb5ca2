//! The rendezvous store's server side: bytes as they would arrive on a
//! connection (a hello, then requests) go through the handshake check, the
//! request parser and the bounded table; nothing may panic, allocate past
//! the caps, or leave the table over its bounds.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    ferrocoll_rendezvous::fuzz_server(data);
});
