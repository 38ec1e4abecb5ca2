//! The job secret: bytes every process of one job shares (from
//! `FERROCOLL_JOB_SECRET`), with which the store and the transports'
//! connections prove to each other that both belong to the job.
//!
//! Proofs are HMAC-SHA-256 over a challenge (both sides' fresh random
//! nonces, the connection's context and which side proves), so the secret
//! itself never crosses the network: a sniffer learns proofs for nonces
//! that are never asked again, and a client's proof cannot be replayed as
//! a server's. The cryptography is RustCrypto's (`hmac`, `sha2`, and
//! `subtle` for comparisons in constant time); the randomness is the
//! operating system's (`getrandom`).

use std::ffi::{OsStr, OsString};

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// Bytes of a proof (an HMAC-SHA-256 tag).
pub const PROOF_BYTES: usize = 32;

/// Bytes of a challenge nonce.
pub const NONCE_BYTES: usize = 16;

/// A job's shared secret: any non-empty bytes (an environment variable
/// need not be Unicode). Its `Debug` never prints it, and comparisons take
/// the same time wherever the inputs differ.
#[derive(Clone)]
pub struct JobSecret {
    secret: OsString,
}

impl JobSecret {
    /// The environment variable that carries the secret.
    pub const ENV: &'static str = "FERROCOLL_JOB_SECRET";

    /// A secret from its bytes (as the environment holds them); `None` if
    /// it is empty (an empty secret would authenticate nothing).
    pub fn new(secret: impl Into<OsString>) -> Option<JobSecret> {
        let secret = secret.into();
        (!secret.is_empty()).then_some(JobSecret { secret })
    }

    /// Fewer bytes than this in a hand-set secret draw a warning.
    pub const SHORT_BYTES: usize = 24;

    /// The secret in `FERROCOLL_JOB_SECRET`, whatever its bytes; `None`
    /// when it is unset or empty (the job then runs unauthenticated). A
    /// short one is warned about, once per process.
    pub fn from_env() -> Option<JobSecret> {
        let secret = std::env::var_os(Self::ENV).and_then(JobSecret::new)?;
        if secret.is_short() {
            static WARNED: std::sync::Once = std::sync::Once::new();
            WARNED.call_once(|| {
                tracing::warn!(
                    bytes = secret.bytes().len(),
                    "FERROCOLL_JOB_SECRET is short: a process squatting on the \
                     store's or a rank's port collects one proof over a nonce \
                     it chose and can guess a short secret from it offline; \
                     use a random one of {} bytes or more (launch makes 64 hex digits)",
                    Self::SHORT_BYTES
                );
            });
        }
        Some(secret)
    }

    /// Whether the secret is short enough to guess offline from one proof
    /// (launchers' generated secrets never are).
    pub fn is_short(&self) -> bool {
        self.bytes().len() < Self::SHORT_BYTES
    }

    /// A fresh random secret: 32 bytes from the system's random source, as
    /// 64 hex digits (what a launcher puts in `FERROCOLL_JOB_SECRET`).
    pub fn generate() -> JobSecret {
        JobSecret {
            secret: random_hex::<32>().into(),
        }
    }

    /// The secret as the environment holds it, to hand to a child
    /// process. Never log it.
    pub fn expose(&self) -> &OsStr {
        &self.secret
    }

    fn bytes(&self) -> &[u8] {
        self.secret.as_encoded_bytes()
    }

    /// Proof of knowing the secret, bound to `context` (the nonces, what
    /// the connection is for and who proves): HMAC-SHA-256 keyed with the
    /// secret.
    pub fn prove(&self, context: &[u8]) -> [u8; PROOF_BYTES] {
        // HMAC takes a key of any length: this cannot fail.
        let mut mac = match Hmac::<Sha256>::new_from_slice(self.bytes()) {
            Ok(mac) => mac,
            Err(_) => unreachable!("HMAC accepts keys of every length"),
        };
        mac.update(context);
        mac.finalize().into_bytes().into()
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
            &Sha256::digest(self.bytes()),
            &Sha256::digest(other.bytes()),
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
    a.len() == b.len() && bool::from(a.ct_eq(b))
}

/// `N` unpredictable bytes as `2N` lowercase hex digits: what job ids,
/// secrets and the names other users must not guess are made of.
pub fn random_hex<const N: usize>() -> String {
    hex(&random_bytes::<N>())
}

/// Bytes as lowercase hex digits.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `N` unpredictable bytes from the operating system's random source.
/// Where it cannot answer (no `getrandom` and no `/dev/urandom`: no
/// supported system), std's randomly keyed SipHash over a counter and the
/// time stands in rather than failing a job.
pub fn random_bytes<const N: usize>() -> [u8; N] {
    let mut out = [0u8; N];
    if getrandom::fill(&mut out).is_ok() {
        return out;
    }
    fallback(&mut out);
    out
}

fn fallback(out: &mut [u8]) {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proofs_are_rfc_4231_hmac_sha256_keyed_by_the_secret() {
        // RFC 4231 test case 2 (key "Jefe"): the crate computes the
        // standard HMAC, whatever library provides it.
        let s = JobSecret::new("Jefe").unwrap();
        assert_eq!(
            hex(&s.prove(b"what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn secrets_never_print_and_compare_by_value() {
        let s = JobSecret::new("hunter2").unwrap();
        assert_eq!(format!("{s:?}"), "JobSecret(<hidden>)");
        assert!(!format!("{s:?}").contains("hunter2"));
        assert_eq!(s, JobSecret::new("hunter2").unwrap());
        assert_ne!(s, JobSecret::new("hunter3").unwrap());
        assert!(JobSecret::new(String::new()).is_none());
        let proof = s.prove(b"nonce");
        assert!(s.verify(b"nonce", &proof));
        assert!(!s.verify(b"other nonce", &proof));
        assert!(!s.verify(b"nonce", &proof[..31]));
    }

    #[cfg(unix)]
    #[test]
    fn a_secret_that_is_not_unicode_is_a_secret_not_none() {
        // Before: `std::env::var` refused such a value and the job ran
        // unauthenticated without a word.
        use std::os::unix::ffi::OsStringExt;
        let a = JobSecret::new(OsString::from_vec(b"\xff\xfejob".to_vec())).unwrap();
        let b = JobSecret::new(OsString::from_vec(b"\xff\xfdjob".to_vec())).unwrap();
        assert_ne!(a, b);
        assert_ne!(a.prove(b"n"), b.prove(b"n"));
        assert_eq!(a.expose().as_encoded_bytes(), b"\xff\xfejob");
    }

    #[test]
    fn generated_secrets_are_64_hex_digits_and_differ() {
        let (a, b) = (JobSecret::generate(), JobSecret::generate());
        let text = a.expose().to_str().unwrap();
        assert_eq!(text.len(), 64);
        assert!(text.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
        assert_ne!(random_bytes::<16>(), random_bytes::<16>());
    }

    #[test]
    fn hand_set_passwords_are_short_and_generated_secrets_are_not() {
        assert!(JobSecret::new("hunter2").unwrap().is_short());
        assert!(
            JobSecret::new("x".repeat(JobSecret::SHORT_BYTES - 1))
                .unwrap()
                .is_short()
        );
        assert!(
            !JobSecret::new("x".repeat(JobSecret::SHORT_BYTES))
                .unwrap()
                .is_short()
        );
        assert!(!JobSecret::generate().is_short());
    }
}
