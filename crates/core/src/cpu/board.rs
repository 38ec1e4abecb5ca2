//! The announcement board: how ranks of a CPU group agree on a call
//! without a lock, and where one-shot calls publish their inputs.
//!
//! Each rank owns one post. To make call `c` it writes the call's
//! signature (and, for a one-shot call, its input) into half `c % 2` of
//! its post, then stores `c + 1` into `seq` (release). A peer that reads
//! `seq > c` (acquire) sees both.
//!
//! Two halves are enough: a rank writes half `c % 2` again only in call
//! `c + 2`, which it starts after passing the agreement of call `c + 1`,
//! which needs every peer to have announced `c + 1` — and a peer announces
//! `c + 1` only after it has finished call `c`, reads of this rank's
//! half `c % 2` included. So a half is never rewritten while a peer can
//! still read it, and nobody waits for readers to leave.

use std::cell::UnsafeCell;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::types::Rank;

/// One rank's post, on cache lines of its own (peers poll `seq`).
#[repr(align(128))]
struct Post {
    /// One more than the number of the latest call this rank announced.
    seq: AtomicU64,
    /// The signature of the calls announced in each half.
    signature: [AtomicU64; 2],
    /// Where one-shot calls publish their input, allocated on first use.
    staging: OnceLock<Staging>,
}

/// Two halves of one rank's staging memory, in `u64`s so every element
/// type is aligned.
struct Staging([UnsafeCell<Box<[u64]>>; 2]);

// SAFETY: half `h` is written only by its owner, before it announces a
// call in that half, and read by peers only after they saw the
// announcement and before they announce their next call; the module docs
// show the two never overlap, and `seq`'s release/acquire orders them.
unsafe impl Sync for Staging {}

/// The posts of every rank of a group.
pub(crate) struct Board {
    posts: Box<[Post]>,
    /// Bytes each half of a staging holds.
    staging_bytes: usize,
}

impl Board {
    /// A board for `n` ranks whose one-shot inputs hold up to `staging_bytes`.
    pub fn new(n: u32, staging_bytes: usize) -> Self {
        Board {
            posts: (0..n)
                .map(|_| Post {
                    seq: AtomicU64::new(0),
                    signature: [AtomicU64::new(0), AtomicU64::new(0)],
                    staging: OnceLock::new(),
                })
                .collect(),
            staging_bytes,
        }
    }

    /// `rank` announces call `call` with `signature`, first copying
    /// `input` (one-shot calls) into its staging.
    ///
    /// # Safety
    /// Only `rank`'s own thread announces for `rank`, with consecutive
    /// call numbers, each after every rank has announced the previous
    /// call; `input` is valid for reads of its length, which is at most
    /// the board's staging bytes.
    pub unsafe fn announce(
        &self,
        rank: Rank,
        call: u64,
        signature: u64,
        input: Option<(*const u8, usize)>,
    ) {
        let post = &self.posts[rank as usize];
        let half = (call % 2) as usize;
        if let Some((from, bytes)) = input {
            assert!(bytes <= self.staging_bytes, "one-shot input over budget");
            let staging = post.staging.get_or_init(|| self.new_staging());
            // SAFETY: this half is ours to write (the module docs); the
            // caller vouches for `from`, and the half holds `bytes`.
            unsafe {
                let to = (*staging.0[half].get()).as_mut_ptr().cast::<u8>();
                std::ptr::copy_nonoverlapping(from, to, bytes);
            }
        }
        post.signature[half].store(signature, Ordering::Relaxed);
        post.seq.store(call + 1, Ordering::Release);
    }

    fn new_staging(&self) -> Staging {
        let words = self.staging_bytes.div_ceil(8);
        let half = || UnsafeCell::new(vec![0u64; words].into_boxed_slice());
        Staging([half(), half()])
    }

    /// The signature `peer` announced call `call` with, once it has.
    pub fn announced(&self, peer: Rank, call: u64) -> Option<u64> {
        let post = &self.posts[peer as usize];
        (post.seq.load(Ordering::Acquire) > call)
            .then(|| post.signature[(call % 2) as usize].load(Ordering::Relaxed))
    }

    /// How many calls `rank` has announced.
    pub fn progress(&self, rank: Rank) -> u64 {
        self.posts[rank as usize].seq.load(Ordering::Acquire)
    }

    /// Where `peer`'s one-shot input of call `call` starts.
    ///
    /// # Safety
    /// [`announced`](Self::announced) returned this call's one-shot
    /// signature for `peer`, and the caller has not yet announced its next
    /// call; the pointer is valid for reads of the input's length until then.
    pub unsafe fn staged(&self, peer: Rank, call: u64) -> *const u8 {
        let staging = self.posts[peer as usize]
            .staging
            .get()
            .expect("a one-shot announcement allocated its staging");
        // SAFETY: reading the pointer only; the owner never reallocates it.
        unsafe { (*staging.0[(call % 2) as usize].get()).as_ptr().cast() }
    }
}
