//! The device program's binary interface, defined once, here: every record
//! the kernel walks and the launch's parameters as `#[repr(C)]` structs,
//! the constants both sides use, and the C header `cuda/interpret.cu` is
//! compiled against, generated from them ([`header`]). The header carries
//! a `static_assert` of every struct's size and every field's offset, so
//! NVRTC and the host's C++ compiler both refuse a kernel that would read
//! the records differently from how Rust wrote them; `cuda/records.h` is
//! the generated text, committed for readers and checked against
//! [`header`] by a test. (NVRTC has no `offsetof`: the header asserts
//! each field's size and each struct's, and a test asserts the Rust
//! structs have no padding, which together fix every offset.)

use std::fmt::Write;
use std::mem::{offset_of, size_of};

/// Ranks a device program may have: the kernel's per-peer tables, which
/// also bound the messages one instruction receives or sends (one per
/// peer).
pub const MAX_RANKS: u32 = 64;

/// Threads per interpreter block: every thread keeps [`UNROLL`] 16-byte
/// loads in flight, so 512 threads keep an SM's memory pipes full (NCCL's
/// Simple protocol uses as many).
pub const THREADS: u32 = 512;

/// Interpreter blocks the kernel is compiled to fit on one SM at once
/// (`__launch_bounds__`): one, as NCCL's kernels, which leaves a thread
/// 128 registers — what [`UNROLL`] vectors of every source in flight,
/// the wide accumulators of half and bfloat16 and the protocol's state
/// take without spilling (at two blocks an SM, 64 registers, most entry
/// points spilled). A test holds every entry point to it with no spills
/// and no stack.
pub const MIN_BLOCKS_PER_SM: u32 = 1;

/// Independent 16-byte vectors a thread loads from each source before it
/// combines them: what keeps enough bytes in flight per SM to cover the
/// memory latency.
pub const UNROLL: u32 = 4;

/// Dynamic shared memory a block may take for its channel's records: a
/// channel whose records fit is walked from shared memory (no dependent
/// global load per instruction); a larger one is read where it lies.
pub const RECORDS_SHARED_MAX: u32 = 16 << 10;

/// Bytes of the window's per-channel words that publish the owner's
/// buffers (input, output, scratch, and one unused) for the call.
pub const BUFFER_WORDS_BYTES: u64 = 32;

/// A channel's `done` word after its last instruction of a call: past
/// every instruction index.
pub const DONE: u32 = u32::MAX;

/// The constants of the header, by C name.
const DEFINES: &[(&str, u64)] = &[
    ("FC_MAX_RANKS", MAX_RANKS as u64),
    ("FC_THREADS", THREADS as u64),
    ("FC_MIN_BLOCKS", MIN_BLOCKS_PER_SM as u64),
    ("FC_UNROLL", UNROLL as u64),
    ("FC_RECORDS_SHARED_MAX", RECORDS_SHARED_MAX as u64),
    ("FC_BUFFER_WORDS_BYTES", BUFFER_WORDS_BYTES),
    ("FC_DONE", DONE as u64),
    ("FC_NONE", BufferId::None as u64),
    ("FC_SLOT", Transfer::Slot as u64),
    ("FC_IN_SENDER", Transfer::InSender as u64),
    ("FC_IN_RECEIVER", Transfer::InReceiver as u64),
    ("FC_SIMPLE", super::Protocol::Simple as u64),
    ("FC_LL", super::Protocol::LowLatency as u64),
    ("FC_SCOPE_GPU", Scope::Gpu as u64),
    ("FC_SCOPE_SYS", Scope::System as u64),
    ("FC_MISMATCH", MISMATCH),
    ("FC_TIMEOUT", TIMEOUT),
    ("FC_PEER_FAILED", PEER_FAILED),
    ("FC_ABORTED", ABORTED),
];

/// Board reason: the rank's hello disagreed with a peer's.
pub const MISMATCH: u64 = 1;
/// Board reason: a wait outlasted the timeout.
pub const TIMEOUT: u64 = 2;
/// Board reason: another rank failed first.
pub const PEER_FAILED: u64 = 3;
/// Board reason, written by the host to stop a rank's blocks (no call
/// number: the host's count names the call).
pub const ABORTED: u64 = 4;

/// Which buffer a region is in, as the device encodes it.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BufferId {
    /// The caller's input.
    Input = 0,
    /// The caller's output (in place: the one buffer).
    Output = 1,
    /// The communicator's scratch.
    Scratch = 2,
    /// No region: the instruction does not read (or write).
    None = 3,
}

/// How one message's bytes travel (both ends of it carry the same).
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transfer {
    /// Through the link's slot in the receiver's window (staged).
    Slot = 0,
    /// Not at all: the value stays in the sender's buffer, where the
    /// receiver reads it ([`End::remote`] on the receiving end), and the
    /// sender does not end its call before the receiver has.
    InSender = 1,
    /// Stored by the sender straight into the receiver's destination
    /// ([`End::remote`] on the sending end); the receiver finds it there.
    InReceiver = 2,
}

/// What a launch's memory accesses to peers are ordered at: the GPU when
/// every window and peer is on the launch's device, else the system
/// (peers on other GPUs, windows in host memory).
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scope {
    /// `.gpu`: cheaper fences and flag accesses.
    Gpu = 0,
    /// `.sys`.
    System = 1,
}

/// One field of a record: its name, C declaration, offset (named in the
/// header's messages) and size.
struct Field {
    name: &'static str,
    decl: &'static str,
    offset: usize,
    size: usize,
}

/// A struct the header declares.
trait Record {
    const C_NAME: &'static str;
    const SIZE: usize;
    fn fields() -> Vec<Field>;
}

/// `#[repr(C)]` structs, each with its C name and, per field, its C
/// declaration: the header is written from these.
macro_rules! records {
    ($(
        $(#[$meta:meta])*
        pub struct $name:ident as $c:literal {
            $( $(#[$fmeta:meta])* pub $field:ident : $ty:ty => $decl:literal ),* $(,)?
        }
    )*) => {
        $(
            $(#[$meta])*
            #[repr(C)]
            #[derive(Debug, Clone, Copy, PartialEq, Eq)]
            pub struct $name { $( $(#[$fmeta])* pub $field: $ty ),* }

            impl Record for $name {
                const C_NAME: &'static str = $c;
                const SIZE: usize = size_of::<$name>();
                fn fields() -> Vec<Field> {
                    vec![$( Field {
                        name: stringify!($field),
                        decl: $decl,
                        offset: offset_of!($name, $field),
                        size: size_of::<$ty>(),
                    } ),*]
                }
            }
        )*

        /// Every record's declaration and assertions, in dependency order.
        fn declarations(out: &mut String) {
            $( declare::<$name>(out); )*
        }

        /// Records whose fields do not fill them: padding is bytes a
        /// packed table or a parameter block would leave uninitialised.
        #[cfg(test)]
        fn padded() -> Vec<&'static str> {
            let mut out = Vec::new();
            $(
                if $name::fields().iter().map(|f| f.size).sum::<usize>() != $name::SIZE {
                    out.push($name::C_NAME);
                }
            )*
            out
        }
    };
}

records! {
    /// A run of records in one of a rank's tables: `count` from `first`.
    #[derive(Default)]
    pub struct Span as "FcSpan" {
        /// The first record.
        pub first: u32 => "u32 first",
        /// How many.
        pub count: u32 => "u32 count",
    }

    /// A region of a buffer: the buffer and its pieces in the piece table
    /// (`BufferId::None`: no region — the device format has no `Option`).
    pub struct Region as "FcRegion" {
        /// The buffer.
        pub buffer: BufferId => "u32 buffer",
        /// Its pieces, whose concatenation is the value.
        pub pieces: Span => "FcSpan pieces",
    }

    /// `bytes` bytes from byte `offset` of a buffer.
    pub struct Piece as "FcPiece" {
        /// Byte offset.
        pub offset: u64 => "u64 offset",
        /// Bytes.
        pub bytes: u64 => "u64 bytes",
    }

    /// One end of a message.
    pub struct End as "FcEnd" {
        /// The rank at the other end.
        pub peer: u32 => "u32 peer",
        /// How its bytes travel.
        pub transfer: Transfer => "u32 transfer",
        /// Its number on the link in this call, from 0.
        pub index: u64 => "u64 index",
        /// The other rank's region the bytes are read from
        /// ([`Transfer::InSender`], receiving end) or stored into
        /// ([`Transfer::InReceiver`], sending end); its pieces are in this
        /// rank's table, their offsets in the other rank's buffer.
        pub remote: Region => "FcRegion remote",
        /// Always 0: the bytes alignment leaves, named so that a packed
        /// table has no uninitialised padding.
        pub reserved: u32 => "u32 reserved",
    }

    /// Instruction `index` of `channel` (same rank) must have fired.
    pub struct After as "FcAfter" {
        /// The channel.
        pub channel: u32 => "u32 channel",
        /// The instruction's index on it.
        pub index: u32 => "u32 index",
    }

    /// One instruction: receive, combine with a local read, write, send.
    pub struct Op as "FcOp" {
        /// Bytes of the value.
        pub bytes: u64 => "u64 bytes",
        /// Messages to combine, in order (ends in the rank's table).
        pub recv: Span => "FcSpan recv",
        /// The local read combined after them ([`Region::NONE`]: none).
        pub read: Region => "FcRegion read",
        /// Where the value is stored ([`Region::NONE`]: nowhere).
        pub write: Region => "FcRegion write",
        /// Messages carrying the value.
        pub send: Span => "FcSpan send",
        /// Instructions of other channels to wait for.
        pub after: Span => "FcSpan after",
    }

    /// Messages a rank moves on one link in a call.
    pub struct Count as "FcCount" {
        /// The link, by [`Layout::link_word`](super::Layout::link_word).
        pub word: u32 => "u32 word",
        /// 1 when some of them stay in this rank's memory
        /// ([`Transfer::InSender`]): the call ends only once the receiver
        /// has consumed them all.
        pub drain: u32 => "u32 drain",
        /// Its messages in one call.
        pub count: u64 => "u64 count",
    }

    /// The records of one channel, each a contiguous run of its table:
    /// what a block copies into shared memory when it starts.
    #[derive(Default)]
    pub struct Channel as "FcChannel" {
        /// Its instructions.
        pub ops: Span => "FcSpan ops",
        /// The ends of its messages.
        pub ends: Span => "FcSpan ends",
        /// The pieces of its regions (remote ones included).
        pub pieces: Span => "FcSpan pieces",
        /// Its waits.
        pub afters: Span => "FcSpan afters",
    }

    /// Device addresses of a rank's tables.
    #[derive(Default)]
    pub struct Tables as "FcTables" {
        /// By channel.
        pub channels: u64 => "const FcChannel *channels",
        /// Every instruction, channel after channel.
        pub ops: u64 => "const FcOp *ops",
        /// Pieces of every region.
        pub pieces: u64 => "const FcPiece *pieces",
        /// Ends of every message.
        pub ends: u64 => "const FcEnd *ends",
        /// Every wait.
        pub afters: u64 => "const FcAfter *afters",
        /// Messages sent per link in a call.
        pub sent: u64 => "const FcCount *sent",
        /// Messages received per link in a call.
        pub received: u64 => "const FcCount *received",
        /// Records in `sent`.
        pub sent_count: u32 => "u32 sent_count",
        /// Records in `received`.
        pub received_count: u32 => "u32 received_count",
    }

    /// One launch's parameters, passed by value.
    pub struct Params as "FcCall" {
        /// This rank's tables.
        pub tables: Tables => "FcTables t",
        /// Every rank's window, as this rank's device addresses it.
        pub window: [u64; MAX_RANKS as usize] => "unsigned char *window[FC_MAX_RANKS]",
        /// Input (in place: the output), output, scratch.
        pub buffer: [u64; 3] => "unsigned char *buffer[3]",
        /// This rank's private state.
        pub state: u64 => "u64 *state",
        /// The group's failure board (one word per rank, host memory).
        pub board: u64 => "u64 *board",
        /// Offset of the `posted` words in a window.
        pub posted_at: u64 => "u64 posted_at",
        /// Offset of the `consumed` words.
        pub consumed_at: u64 => "u64 consumed_at",
        /// Offset of the `hello` words.
        pub hello_at: u64 => "u64 hello_at",
        /// Offset of the LL inbox.
        pub ll_at: u64 => "u64 ll_at",
        /// Offset of the words publishing the owner's buffers by channel.
        pub buffers_at: u64 => "u64 buffers_at",
        /// Offset of the alarm word (set once any rank failed).
        pub alarm_at: u64 => "u64 alarm_at",
        /// Bytes per slot.
        pub slot_bytes: u64 => "u64 slot_bytes",
        /// Bytes per LL slot.
        pub ll_slot_bytes: u64 => "u64 ll_slot_bytes",
        /// The longest one wait may last, in nanoseconds.
        pub timeout_ns: u64 => "u64 timeout_ns",
        /// With avg: the region every block divides a share of by the
        /// world size once every channel is done (pieces in the global
        /// piece table).
        pub divide: Region => "FcRegion divide",
        /// Dynamic shared memory of the launch: a channel whose records
        /// take no more is walked from shared memory.
        pub records_shared: u32 => "u32 records_shared",
        /// The low half of the program's agreement.
        pub hash: u32 => "u32 hash",
        /// This rank.
        pub rank: u32 => "u32 rank",
        /// Ranks.
        pub world: u32 => "u32 world",
        /// Slots per link.
        pub slots: u32 => "u32 slots",
        /// Channels the window was set up for.
        pub max_channels: u32 => "u32 max_channels",
        /// How messages travel ([`super::Protocol`]).
        pub protocol: u32 => "u32 protocol",
        /// [`Scope`] of flag accesses and fences.
        pub scope: u32 => "u32 scope",
        /// Always 0 (no uninitialised tail padding).
        pub reserved: u32 => "u32 reserved",
    }
}

impl Region {
    /// No region.
    pub const NONE: Region = Region {
        buffer: BufferId::None,
        pieces: Span { first: 0, count: 0 },
    };

    /// The region, if there is one.
    pub fn get(&self) -> Option<&Region> {
        (self.buffer != BufferId::None).then_some(self)
    }
}

/// The field a C declaration declares: `window` of
/// `unsigned char *window[FC_MAX_RANKS]`.
fn c_field(decl: &str) -> &str {
    let head = decl.split('[').next().unwrap_or(decl);
    head.split_whitespace()
        .last()
        .unwrap_or(head)
        .trim_start_matches('*')
}

fn declare<R: Record>(out: &mut String) {
    let name = R::C_NAME;
    let _ = writeln!(out, "struct {name} {{");
    for f in R::fields() {
        let _ = writeln!(out, "    {};", f.decl);
    }
    let _ = writeln!(out, "}};");
    let _ = writeln!(
        out,
        "static_assert(sizeof({name}) == {}, \"{name}: size\");",
        R::SIZE
    );
    for f in R::fields() {
        let _ = writeln!(
            out,
            "static_assert(sizeof((({name} *)0)->{field}) == {}, \"{name}.{field} ({}) at {}\");",
            f.size,
            f.name,
            f.offset,
            field = c_field(f.decl),
        );
    }
    out.push('\n');
}

/// The C header of the records, parameters and constants: the first part
/// of the kernel's source (`cuda/records.h` holds the same text).
pub fn header() -> String {
    let mut out = String::from(
        "// Generated from crates/cuda/src/program/abi.rs (`abi::header`): do not edit.\n\
         // The device program's records and launch parameters as the Rust side\n\
         // writes them. Every field's size and every struct's size is asserted;\n\
         // the Rust side has no padding (its fields add up to its size), so these\n\
         // pin every offset too: a kernel that would read the records\n\
         // differently does not compile.\n\n\
         #ifndef FERROCOLL_RECORDS_H\n#define FERROCOLL_RECORDS_H\n\n\
         typedef unsigned int u32;\ntypedef unsigned long long u64;\n\n",
    );
    for (name, value) in DEFINES {
        let suffix = if *value > i32::MAX as u64 { "u" } else { "" };
        let _ = writeln!(out, "#define {name} {value}{suffix}");
    }
    out.push('\n');
    declarations(&mut out);
    out.push_str("#endif\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `cuda/records.h` is what [`header`] writes: regenerate it with
    /// `FERROCOLL_BLESS=1 cargo test -p ferrocoll-cuda records_h`.
    #[test]
    fn records_h_is_the_generated_header() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../cuda/records.h");
        let want = header();
        if std::env::var("FERROCOLL_BLESS").is_ok_and(|v| v == "1") {
            std::fs::write(path, &want).unwrap();
        }
        let have = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            have == want,
            "cuda/records.h is stale: run FERROCOLL_BLESS=1 cargo test -p ferrocoll-cuda records_h"
        );
    }

    #[test]
    fn records_have_no_padding_the_device_would_read() {
        assert_eq!(padded(), Vec::<&str>::new());
        assert_eq!(size_of::<End>(), 32);
        assert_eq!(size_of::<Op>(), 56);
    }
}
