//! One launch of the interpreter as the device sees it: a rank's records
//! packed into one block of device memory, the kernel's by-value
//! parameters (`FcCall` in `cuda/interpret.cu`), and the failure board's
//! words. Everything here is plain data over device addresses, so how a
//! launch is put together is tested without a GPU.

use std::time::Duration;

use ferrocoll_core::Rank;
use ferrocoll_core::comm::CommError;

use super::{DeviceProgram, MAX_RANKS, RankProgram};

/// Byte offsets of a rank's tables inside its packed block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Packed {
    /// `channels`.
    pub channels: u64,
    /// `ops`.
    pub ops: u64,
    /// `pieces`.
    pub pieces: u64,
    /// `ends`.
    pub ends: u64,
    /// `afters`.
    pub afters: u64,
    /// `sent`.
    pub sent: u64,
    /// `received`.
    pub received: u64,
}

/// The bytes of a slice of records.
fn bytes_of<T: Copy>(records: &[T]) -> &[u8] {
    // SAFETY: the records are `#[repr(C)]` plain data whose padding the
    // device never reads; any byte view of initialised memory of their
    // size is valid to read as `u8`.
    unsafe { std::slice::from_raw_parts(records.as_ptr().cast(), std::mem::size_of_val(records)) }
}

/// A rank's tables in one block (each table 16-byte aligned), uploaded
/// with one copy, and where each table starts in it.
pub fn pack(p: &RankProgram) -> (Vec<u8>, Packed) {
    let mut blob = Vec::new();
    let mut put = |bytes: &[u8]| {
        blob.resize(blob.len().next_multiple_of(16), 0);
        let at = blob.len() as u64;
        blob.extend_from_slice(bytes);
        at
    };
    let packed = Packed {
        channels: put(bytes_of(&p.channels)),
        ops: put(bytes_of(&p.ops)),
        pieces: put(bytes_of(&p.pieces)),
        ends: put(bytes_of(&p.ends)),
        afters: put(bytes_of(&p.afters)),
        sent: put(bytes_of(&p.sent)),
        received: put(bytes_of(&p.received)),
    };
    // Never empty: a block of device memory has at least one byte.
    blob.resize(blob.len().max(16), 0);
    (blob, packed)
}

/// `FcTables`: device addresses of a rank's tables.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Tables {
    /// `FcSpan *channels`.
    pub channels: u64,
    /// `FcOp *ops`.
    pub ops: u64,
    /// `FcPiece *pieces`.
    pub pieces: u64,
    /// `FcEnd *ends`.
    pub ends: u64,
    /// `FcAfter *afters`.
    pub afters: u64,
    /// `FcCount *sent`.
    pub sent: u64,
    /// `FcCount *received`.
    pub received: u64,
    /// Records in `sent`.
    pub sent_count: u32,
    /// Records in `received`.
    pub received_count: u32,
}

/// `FcCall`: one launch's parameters, passed by value.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Params {
    /// This rank's tables.
    pub tables: Tables,
    /// Every rank's window, as this rank's device addresses it.
    pub window: [u64; MAX_RANKS as usize],
    /// Input, output, scratch.
    pub buffer: [u64; 3],
    /// This rank's private state.
    pub state: u64,
    /// The group's failure board (one `u64` per rank).
    pub board: u64,
    /// Offset of the `posted` words in a window.
    pub posted_at: u64,
    /// Offset of the `consumed` words.
    pub consumed_at: u64,
    /// Offset of the `hello` words.
    pub hello_at: u64,
    /// Offset of the LL inbox.
    pub ll_at: u64,
    /// Bytes per slot.
    pub slot_bytes: u64,
    /// Bytes per LL slot.
    pub ll_slot_bytes: u64,
    /// The longest one wait may last, in nanoseconds.
    pub timeout_ns: u64,
    /// The low half of the program's agreement.
    pub hash: u32,
    /// This rank.
    pub rank: u32,
    /// Ranks.
    pub world: u32,
    /// Slots per link.
    pub slots: u32,
    /// Channels the window was set up for.
    pub max_channels: u32,
    /// [`Protocol`](super::Protocol) of the program's messages.
    pub protocol: u32,
}

/// Where a rank's launch finds its memory: device addresses.
#[derive(Debug, Clone, Copy)]
pub struct Addresses<'a> {
    /// The packed tables' block.
    pub tables: u64,
    /// Every rank's window (indexed by rank).
    pub windows: &'a [u64],
    /// Input (the output's address in place), output, scratch.
    pub buffers: [u64; 3],
    /// The rank's state.
    pub state: u64,
    /// The failure board.
    pub board: u64,
}

impl Params {
    /// The launch of `rank`'s part of `program`.
    pub fn new(
        program: &DeviceProgram,
        rank: Rank,
        packed: &Packed,
        at: &Addresses<'_>,
        timeout: Duration,
    ) -> Params {
        let l = &program.layout;
        let me = &program.ranks[rank as usize];
        let w = l.window();
        let mut window = [0; MAX_RANKS as usize];
        window[..at.windows.len()].copy_from_slice(at.windows);
        Params {
            tables: Tables {
                channels: at.tables + packed.channels,
                ops: at.tables + packed.ops,
                pieces: at.tables + packed.pieces,
                ends: at.tables + packed.ends,
                afters: at.tables + packed.afters,
                sent: at.tables + packed.sent,
                received: at.tables + packed.received,
                sent_count: me.sent.len() as u32,
                received_count: me.received.len() as u32,
            },
            window,
            buffer: at.buffers,
            state: at.state,
            board: at.board,
            posted_at: w.posted,
            consumed_at: w.consumed,
            hello_at: w.hello,
            ll_at: w.ll,
            slot_bytes: l.slot_bytes,
            ll_slot_bytes: l.ll_slot_bytes,
            timeout_ns: u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX),
            hash: program.agreement() as u32,
            rank,
            world: l.world_size,
            slots: l.slots,
            max_channels: l.max_channels,
            protocol: program.protocol as u32,
        }
    }
}

/// Why a rank's word on the failure board is set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The rank's hello disagreed with `peer`'s: another call or plan.
    Mismatch {
        /// The peer.
        peer: Rank,
    },
    /// A wait on `peer` (this rank itself: a wait between its channels)
    /// outlasted the timeout.
    Timeout {
        /// The peer.
        peer: Rank,
    },
    /// `peer` failed first.
    PeerFailed {
        /// The peer.
        peer: Rank,
    },
    /// The host aborted the rank (an error found on the host, or `abort`).
    Aborted,
}

/// The board word the host writes to stop a rank's blocks (no call
/// number: the host's count names the call).
pub const ABORTED: u64 = 4;

impl Failure {
    /// The board word's meaning and the device's number of the call that
    /// failed, counted from 1 modulo 2³² (meaningless for [`Failure::Aborted`],
    /// which the host writes); `None` while the rank is well. The kernel
    /// writes the reason in bits 0..8, the rank it concerns in bits 8..32
    /// and the call in bits 32..
    pub fn decode(word: u64) -> Option<(Failure, u32)> {
        let peer = (word as u32) >> 8;
        let failure = match word & 0xff {
            0 => return None,
            1 => Failure::Mismatch { peer },
            2 => Failure::Timeout { peer },
            3 => Failure::PeerFailed { peer },
            _ => Failure::Aborted,
        };
        Some((failure, (word >> 32) as u32))
    }

    /// As the communicator reports it, from `rank`'s side of call `call`.
    pub fn error(self, rank: Rank, call: u64, timeout: Duration) -> CommError {
        match self {
            Failure::Mismatch { peer } => CommError::Mismatch {
                call,
                rank,
                other: peer,
                expected: format!("rank {peer}'s call (another collective, shape or plan)"),
                got: "this rank's".into(),
            },
            Failure::Timeout { peer } => CommError::Timeout {
                rank,
                timeout,
                what: if peer == rank {
                    "another channel of this rank".into()
                } else {
                    format!("rank {peer} on the device")
                },
            },
            Failure::PeerFailed { peer } => CommError::PeerFailed {
                rank: peer,
                reason: "failed on the device".into(),
            },
            Failure::Aborted => CommError::PeerFailed {
                rank,
                reason: "aborted".into(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    /// `FcCall` and `FcTables` under the CUDA ABI: pointers 8 bytes,
    /// naturally aligned — what `#[repr(C)]` gives these fields.
    #[test]
    fn params_match_the_kernels_struct() {
        assert_eq!(size_of::<Tables>(), 64);
        assert_eq!(offset_of!(Params, window), 64);
        assert_eq!(offset_of!(Params, buffer), 64 + 512);
        assert_eq!(offset_of!(Params, state), 600);
        assert_eq!(offset_of!(Params, board), 608);
        assert_eq!(offset_of!(Params, posted_at), 616);
        assert_eq!(offset_of!(Params, ll_at), 640);
        assert_eq!(offset_of!(Params, slot_bytes), 648);
        assert_eq!(offset_of!(Params, timeout_ns), 664);
        assert_eq!(offset_of!(Params, hash), 672);
        assert_eq!(offset_of!(Params, max_channels), 688);
        assert_eq!(offset_of!(Params, protocol), 692);
        assert_eq!(size_of::<Params>(), 696);
        let src: String = crate::kernels::INTERPRETER
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        for decl in [
            "const FcSpan *channels; const FcOp *ops; const FcPiece *pieces; const FcEnd *ends; \
             const FcAfter *afters; const FcCount *sent; const FcCount *received; u32 sent_count, received_count; };",
            "FcTables t;",
            "unsigned char *window[FC_MAX_RANKS];",
            "unsigned char *buffer[3];",
            "u64 *state;",
            "u64 *board;",
            "u64 posted_at, consumed_at, hello_at, ll_at;",
            "u64 slot_bytes, ll_slot_bytes;",
            "u64 timeout_ns;",
            "u32 hash;",
            "u32 rank, world, slots, max_channels;",
            "u32 protocol;",
        ] {
            assert!(src.contains(decl), "{decl}");
        }
        // The fields in this order.
        let order = [
            "FcTables t;",
            "*window[",
            "*buffer[3]",
            "*state;",
            "*board;",
            "posted_at",
            "slot_bytes,",
            "timeout_ns;",
            "u32 hash;",
            "u32 rank,",
            "u32 protocol;",
        ];
        let at: Vec<usize> = order.iter().map(|d| src.find(d).unwrap_or(0)).collect();
        assert!(at.windows(2).all(|w| w[0] < w[1]), "{order:?} at {at:?}");
        assert!(src.contains(&format!("#define FC_ABORTED {ABORTED}")));
        assert!(src.contains(&format!(
            "#define FC_LL {}",
            super::super::Protocol::Ll as u32
        )));
    }

    /// Read `count` records of `T` back from byte `at` of a packed blob.
    fn unpack<T: Copy>(blob: &[u8], at: u64, count: usize) -> Vec<T> {
        let at = at as usize;
        assert_eq!(at % 16, 0, "tables start 16-byte aligned");
        assert!(at + count * size_of::<T>() <= blob.len());
        (0..count)
            // SAFETY: in bounds (asserted); records are plain data, read
            // unaligned from the byte buffer.
            .map(|i| unsafe { blob.as_ptr().add(at).cast::<T>().add(i).read_unaligned() })
            .collect()
    }

    #[test]
    fn a_packed_rank_reads_back_as_its_records_and_params_point_into_the_block() {
        use ferrocoll_core::algorithms::{Algorithm, AlgorithmParams, generate};
        use ferrocoll_core::plan::{CallShape, Chunking, Compiler};
        use ferrocoll_core::verify::{VerifyOptions, verify};
        use ferrocoll_core::{Collective, DataType, ReduceOp};
        let params = AlgorithmParams {
            channels: 2,
            ..AlgorithmParams::default()
        };
        let s = generate(Algorithm::Ring, Collective::AllReduce, 4, &params).unwrap();
        let compiler = Compiler::new(std::sync::Arc::new(
            verify(s, &VerifyOptions::default()).unwrap(),
        ));
        let shape = CallShape {
            collective: Collective::AllReduce,
            count: 1001,
            dtype: DataType::F32,
            op: ReduceOp::Avg,
            in_place: false,
        };
        let plan = compiler
            .compile(&shape, Chunking::MaxBytes(256), 2)
            .unwrap();
        let layout = super::super::Layout {
            world_size: 4,
            max_channels: 3,
            slots: 2,
            slot_bytes: 256,
            ll_slot_bytes: 512,
        };
        let program = DeviceProgram::lower(&plan, layout, super::super::Protocol::Ll).unwrap();
        for (rank, p) in program.ranks.iter().enumerate() {
            let (blob, at) = pack(p);
            assert_eq!(
                unpack::<super::super::Span>(&blob, at.channels, p.channels.len()),
                p.channels
            );
            assert_eq!(
                unpack::<super::super::Op>(&blob, at.ops, p.ops.len()),
                p.ops
            );
            assert_eq!(
                unpack::<super::super::Piece>(&blob, at.pieces, p.pieces.len()),
                p.pieces
            );
            assert_eq!(
                unpack::<super::super::End>(&blob, at.ends, p.ends.len()),
                p.ends
            );
            assert_eq!(
                unpack::<super::super::After>(&blob, at.afters, p.afters.len()),
                p.afters
            );
            assert_eq!(
                unpack::<super::super::Count>(&blob, at.sent, p.sent.len()),
                p.sent
            );
            assert_eq!(
                unpack::<super::super::Count>(&blob, at.received, p.received.len()),
                p.received
            );
            let windows = [0x1000_0000, 0x2000_0000, 0x3000_0000, 0x4000_0000];
            let x = Params::new(
                &program,
                rank as Rank,
                &at,
                &Addresses {
                    tables: 0x9000_0000,
                    windows: &windows,
                    buffers: [1, 2, 3],
                    state: 0x5000_0000,
                    board: 0x6000_0000,
                },
                Duration::from_millis(1500),
            );
            assert_eq!(x.tables.ops, 0x9000_0000 + at.ops);
            assert_eq!(x.tables.sent_count as usize, p.sent.len());
            assert_eq!(&x.window[..4], &windows);
            assert!(x.window[4..].iter().all(|&w| w == 0));
            assert_eq!(
                (x.rank, x.world, x.slots, x.max_channels),
                (rank as u32, 4, 2, 3)
            );
            assert_eq!(x.timeout_ns, 1_500_000_000);
            assert_eq!(x.hash, program.agreement() as u32);
            let w = layout.window();
            assert_eq!(
                (x.posted_at, x.consumed_at, x.hello_at, x.ll_at),
                (w.posted, w.consumed, w.hello, w.ll)
            );
            assert_eq!((x.ll_slot_bytes, x.protocol), (512, 1));
        }
    }

    #[test]
    fn board_words_decode_as_the_kernel_writes_them() {
        assert_eq!(Failure::decode(0), None);
        assert_eq!(
            Failure::decode(1 | (5 << 8) | (9 << 32)),
            Some((Failure::Mismatch { peer: 5 }, 9))
        );
        assert_eq!(
            Failure::decode(2 | (63 << 8) | (0xffff_ffff << 32)),
            Some((Failure::Timeout { peer: 63 }, u32::MAX))
        );
        assert_eq!(
            Failure::decode(3),
            Some((Failure::PeerFailed { peer: 0 }, 0))
        );
        assert_eq!(Failure::decode(ABORTED), Some((Failure::Aborted, 0)));
        let src = crate::kernels::INTERPRETER;
        for d in [
            "#define FC_MISMATCH 1",
            "#define FC_TIMEOUT 2",
            "#define FC_PEER_FAILED 3",
            "#define FC_ABORTED 4",
            "(u64)reason | ((u64)about << 8) | (call << 32)",
        ] {
            assert!(src.contains(d), "{d}");
        }
        let e = Failure::Timeout { peer: 3 }.error(1, 7, Duration::from_secs(2));
        assert!(e.to_string().contains("rank 3"), "{e}");
    }
}
