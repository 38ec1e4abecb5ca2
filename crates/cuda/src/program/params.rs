//! One launch of the interpreter as the device sees it: a rank's records
//! packed into one block of device memory, the kernel's by-value
//! parameters ([`Params`], `FcCall`), and the failure board's words.
//! Everything here is plain data over device addresses, so how a launch
//! is put together is tested without a GPU.

use std::time::Duration;

use ferrocoll_core::Rank;
use ferrocoll_core::comm::CommError;

use super::abi::{
    MISMATCH, PEER_FAILED, Params, RECORDS_SHARED_MAX, Region, Scope, TIMEOUT, Tables,
};
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
    // SAFETY: the records are `#[repr(C)]` plain data without padding
    // (`abi` tests it); any byte view of initialised memory of their size
    // is valid to read as `u8`.
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

/// Bytes of shared memory a block needs to hold its channel's records:
/// each table's run 16-byte aligned, as the kernel lays them out.
pub fn channel_record_bytes(p: &RankProgram, channel: usize) -> u64 {
    use std::mem::size_of;
    let c = &p.channels[channel];
    [
        (c.ops.count, size_of::<super::Op>()),
        (c.ends.count, size_of::<super::End>()),
        (c.pieces.count, size_of::<super::Piece>()),
        (c.afters.count, size_of::<super::After>()),
    ]
    .iter()
    .map(|&(n, size)| (u64::from(n) * size as u64).next_multiple_of(16))
    .sum()
}

/// The dynamic shared memory a rank's launch asks for: enough for the
/// largest channel whose records fit [`RECORDS_SHARED_MAX`] (larger
/// channels read theirs from device memory).
pub fn records_shared(p: &RankProgram) -> u32 {
    (0..p.channels.len())
        .map(|c| channel_record_bytes(p, c))
        .filter(|&b| b <= u64::from(RECORDS_SHARED_MAX))
        .max()
        .unwrap_or(0) as u32
}

impl Params {
    /// The launch of `rank`'s part of `program`, its flag accesses and
    /// fences at `scope`.
    pub fn new(
        program: &DeviceProgram,
        rank: Rank,
        packed: &Packed,
        at: &Addresses<'_>,
        timeout: Duration,
        scope: Scope,
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
            buffers_at: w.buffers,
            alarm_at: w.alarm,
            slot_bytes: l.slot_bytes,
            ll_slot_bytes: l.ll_slot_bytes,
            timeout_ns: u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX),
            divide: me.divide.unwrap_or(Region::NONE),
            records_shared: records_shared(me),
            hash: program.agreement() as u32,
            rank,
            world: l.world_size,
            slots: l.slots,
            max_channels: l.max_channels,
            protocol: program.protocol as u32,
            scope: scope as u32,
            reserved: 0,
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
            MISMATCH => Failure::Mismatch { peer },
            TIMEOUT => Failure::Timeout { peer },
            PEER_FAILED => Failure::PeerFailed { peer },
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
    use crate::program::abi::ABORTED;
    use crate::program::{Layout, Protocol};
    use std::mem::size_of;

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
        use ferrocoll_core::plan::{Chunking, Compiler};
        use ferrocoll_core::types::CallShape;
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
            purpose: Default::default(),
        };
        let plan = compiler
            .compile(&shape, Chunking::MaxBytes(256), 2)
            .unwrap();
        let layout = Layout {
            world_size: 4,
            max_channels: 3,
            slots: 2,
            slot_bytes: 256,
            ll_slot_bytes: 512,
            zero_copy: true,
        };
        let program = DeviceProgram::lower(&plan, layout, Protocol::LowLatency).unwrap();
        for (rank, p) in program.ranks.iter().enumerate() {
            let (blob, at) = pack(p);
            assert_eq!(
                unpack::<crate::program::Channel>(&blob, at.channels, p.channels.len()),
                p.channels
            );
            assert_eq!(
                unpack::<crate::program::Op>(&blob, at.ops, p.ops.len()),
                p.ops
            );
            assert_eq!(
                unpack::<crate::program::Piece>(&blob, at.pieces, p.pieces.len()),
                p.pieces
            );
            assert_eq!(
                unpack::<crate::program::End>(&blob, at.ends, p.ends.len()),
                p.ends
            );
            assert_eq!(
                unpack::<crate::program::After>(&blob, at.afters, p.afters.len()),
                p.afters
            );
            assert_eq!(
                unpack::<crate::program::Count>(&blob, at.sent, p.sent.len()),
                p.sent
            );
            assert_eq!(
                unpack::<crate::program::Count>(&blob, at.received, p.received.len()),
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
                Scope::Gpu,
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
            assert_eq!((x.buffers_at, x.alarm_at), (w.buffers, w.alarm));
            assert_eq!((x.ll_slot_bytes, x.protocol, x.scope), (512, 1, 0));
            // Avg: the rank's division travels with the launch.
            assert_eq!(x.divide, p.divide.unwrap());
            assert!(x.records_shared > 0);
            assert!(x.records_shared as u64 <= u64::from(RECORDS_SHARED_MAX));
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
        let e = Failure::Timeout { peer: 3 }.error(1, 7, Duration::from_secs(2));
        assert!(e.to_string().contains("rank 3"), "{e}");
    }
}
