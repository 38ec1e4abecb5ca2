//! The job secret: a token every process of one job shares (from
//! `FERROCOLL_JOB_SECRET`), with which the store and the transports'
//! connections prove that a peer belongs to the job.
//!
//! Proofs are HMAC-SHA-256 over a challenge (a fresh random nonce and the
//! context of the connection), so the secret itself never crosses the
//! network: a sniffer learns proofs for nonces that are never asked again.
//! SHA-256 is implemented here (FIPS 180-4, checked against its published
//! test vectors) so the crate needs no cryptography dependency.

use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes of a proof (an HMAC-SHA-256 tag).
pub const PROOF_BYTES: usize = 32;

/// Bytes of a challenge nonce.
pub const NONCE_BYTES: usize = 16;

/// A job's shared secret. Its `Debug` never prints it, and comparisons
/// take the same time wherever the inputs differ.
#[derive(Clone)]
pub struct JobSecret {
    secret: String,
}

impl JobSecret {
    /// The environment variable that carries the secret.
    pub const ENV: &'static str = "FERROCOLL_JOB_SECRET";

    /// A secret from its text; `None` if it is empty (an empty secret would
    /// authenticate nothing).
    pub fn new(secret: String) -> Option<JobSecret> {
        (!secret.is_empty()).then_some(JobSecret { secret })
    }

    /// The secret in `FERROCOLL_JOB_SECRET`; `None` when it is unset, empty
    /// or not Unicode (the job then runs unauthenticated).
    pub fn from_env() -> Option<JobSecret> {
        std::env::var(Self::ENV).ok().and_then(JobSecret::new)
    }

    /// A fresh random secret: 32 bytes from the system's random source, as
    /// 64 hex digits (what a launcher puts in `FERROCOLL_JOB_SECRET`).
    pub fn generate() -> JobSecret {
        let bytes = random_bytes::<32>();
        let secret = bytes.iter().map(|b| format!("{b:02x}")).collect();
        JobSecret { secret }
    }

    /// The secret's text, to hand to a child process's environment.
    /// Never log it.
    pub fn expose(&self) -> &str {
        &self.secret
    }

    /// Proof of knowing the secret, bound to `context` (a nonce and what the
    /// connection is for): HMAC-SHA-256 keyed with the secret.
    pub fn prove(&self, context: &[u8]) -> [u8; PROOF_BYTES] {
        hmac_sha256(self.secret.as_bytes(), context)
    }

    /// Whether `proof` is this secret's proof for `context`, compared in
    /// constant time.
    pub fn verify(&self, context: &[u8], proof: &[u8]) -> bool {
        constant_time_eq(&self.prove(context), proof)
    }
}

impl PartialEq for JobSecret {
    fn eq(&self, other: &JobSecret) -> bool {
        // Compare digests, so the time depends on neither secret's length
        // nor where the two first differ.
        constant_time_eq(
            &sha256(self.secret.as_bytes()),
            &sha256(other.secret.as_bytes()),
        )
    }
}

impl Eq for JobSecret {}

impl std::fmt::Debug for JobSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("JobSecret(<hidden>)")
    }
}

/// Whether `a` and `b` are equal, in time that depends only on their lengths.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    // Keep the optimiser from turning the fold into an early exit.
    std::hint::black_box(diff) == 0
}

/// `N` unpredictable bytes: from `/dev/urandom` where there is one, else
/// from std's randomly keyed SipHash (seeded by the system's random source
/// once per process) over a counter and the time.
pub fn random_bytes<const N: usize>() -> [u8; N] {
    let mut out = [0u8; N];
    if read_urandom(&mut out) {
        return out;
    }
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    for chunk in out.chunks_mut(8) {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        h.write_u128(nanos);
        h.write_u32(std::process::id());
        let word = h.finish().to_le_bytes();
        chunk.copy_from_slice(&word[..chunk.len()]);
    }
    out
}

fn read_urandom(out: &mut [u8]) -> bool {
    use std::io::Read;
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(out))
        .is_ok()
}

/// HMAC-SHA-256 (RFC 2104) of `message` under `key`.
pub(crate) fn hmac_sha256(key: &[u8], message: &[u8]) -> [u8; 32] {
    let mut block = [0u8; 64];
    if key.len() > 64 {
        block[..32].copy_from_slice(&sha256(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let mut inner = Sha256::new();
    inner.update(&block.map(|b| b ^ 0x36));
    inner.update(message);
    let mut outer = Sha256::new();
    outer.update(&block.map(|b| b ^ 0x5c));
    outer.update(&inner.finish());
    outer.finish()
}

/// SHA-256 (FIPS 180-4) of `data`.
pub(crate) fn sha256(data: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(data);
    h.finish()
}

const K: [u32; 64] = [
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
];

const H0: [u32; 8] = [
    0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19,
];

/// A running SHA-256.
struct Sha256 {
    state: [u32; 8],
    block: [u8; 64],
    filled: usize,
    total: u64,
}

impl Sha256 {
    fn new() -> Self {
        Sha256 {
            state: H0,
            block: [0; 64],
            filled: 0,
            total: 0,
        }
    }

    fn update(&mut self, mut data: &[u8]) {
        self.total = self.total.wrapping_add(data.len() as u64);
        while !data.is_empty() {
            let take = (64 - self.filled).min(data.len());
            self.block[self.filled..self.filled + take].copy_from_slice(&data[..take]);
            self.filled += take;
            data = &data[take..];
            if self.filled == 64 {
                compress(&mut self.state, &self.block);
                self.filled = 0;
            }
        }
    }

    fn finish(mut self) -> [u8; 32] {
        let bits = self.total.wrapping_mul(8);
        self.update_padding(&[0x80]);
        while self.filled != 56 {
            self.update_padding(&[0]);
        }
        self.update_padding(&bits.to_be_bytes());
        let mut out = [0u8; 32];
        for (o, s) in out.chunks_exact_mut(4).zip(self.state) {
            o.copy_from_slice(&s.to_be_bytes());
        }
        out
    }

    /// `update` without counting the bytes in the message length.
    fn update_padding(&mut self, data: &[u8]) {
        let total = self.total;
        self.update(data);
        self.total = total;
    }
}

fn compress(state: &mut [u32; 8], block: &[u8; 64]) {
    let mut w = [0u32; 64];
    for (i, word) in block.chunks_exact(4).enumerate() {
        w[i] = u32::from_be_bytes([word[0], word[1], word[2], word[3]]);
    }
    for i in 16..64 {
        let s0 = w[i - 15].rotate_right(7) ^ w[i - 15].rotate_right(18) ^ (w[i - 15] >> 3);
        let s1 = w[i - 2].rotate_right(17) ^ w[i - 2].rotate_right(19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16]
            .wrapping_add(s0)
            .wrapping_add(w[i - 7])
            .wrapping_add(s1);
    }
    let [mut a, mut b, mut c, mut d, mut e, mut f, mut g, mut h] = *state;
    for i in 0..64 {
        let s1 = e.rotate_right(6) ^ e.rotate_right(11) ^ e.rotate_right(25);
        let ch = (e & f) ^ (!e & g);
        let t1 = h
            .wrapping_add(s1)
            .wrapping_add(ch)
            .wrapping_add(K[i])
            .wrapping_add(w[i]);
        let s0 = a.rotate_right(2) ^ a.rotate_right(13) ^ a.rotate_right(22);
        let maj = (a & b) ^ (a & c) ^ (b & c);
        let t2 = s0.wrapping_add(maj);
        h = g;
        g = f;
        f = e;
        e = d.wrapping_add(t1);
        d = c;
        c = b;
        b = a;
        a = t1.wrapping_add(t2);
    }
    for (s, v) in state.iter_mut().zip([a, b, c, d, e, f, g, h]) {
        *s = s.wrapping_add(v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn sha256_matches_the_fips_vectors() {
        assert_eq!(
            hex(&sha256(b"")),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(
            hex(&sha256(b"abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(
            hex(&sha256(
                b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"
            )),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"
        );
        assert_eq!(
            hex(&sha256(&vec![b'a'; 1_000_000])),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"
        );
    }

    #[test]
    fn hmac_matches_rfc_4231() {
        // Test case 1.
        assert_eq!(
            hex(&hmac_sha256(&[0x0b; 20], b"Hi There")),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"
        );
        // Test case 2.
        assert_eq!(
            hex(&hmac_sha256(b"Jefe", b"what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        // Test case 6: a key longer than a block.
        assert_eq!(
            hex(&hmac_sha256(
                &[0xaa; 131],
                b"Test Using Larger Than Block-Size Key - Hash Key First"
            )),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
        );
    }

    #[test]
    fn secrets_never_print_and_compare_by_value() {
        let s = JobSecret::new("hunter2".into()).unwrap();
        assert_eq!(format!("{s:?}"), "JobSecret(<hidden>)");
        assert!(!format!("{s:?}").contains("hunter2"));
        assert_eq!(s, JobSecret::new("hunter2".into()).unwrap());
        assert_ne!(s, JobSecret::new("hunter3".into()).unwrap());
        assert!(JobSecret::new(String::new()).is_none());
        let proof = s.prove(b"nonce");
        assert!(s.verify(b"nonce", &proof));
        assert!(!s.verify(b"other nonce", &proof));
        assert!(!s.verify(b"nonce", &proof[..31]));
    }

    #[test]
    fn generated_secrets_are_64_hex_digits_and_differ() {
        let (a, b) = (JobSecret::generate(), JobSecret::generate());
        assert_eq!(a.expose().len(), 64);
        assert!(a.expose().bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
        assert_ne!(random_bytes::<16>(), random_bytes::<16>());
    }
}
