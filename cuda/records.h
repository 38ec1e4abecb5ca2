// Generated from crates/cuda/src/program/abi.rs (`abi::header`): do not edit.
// The device program's records and launch parameters as the Rust side
// writes them. Every field's size and every struct's size is asserted;
// the Rust side has no padding (its fields add up to its size), so these
// pin every offset too: a kernel that would read the records
// differently does not compile.

#ifndef FERROCOLL_RECORDS_H
#define FERROCOLL_RECORDS_H

typedef unsigned int u32;
typedef unsigned long long u64;

#define FC_MAX_RANKS 64
#define FC_THREADS 512
#define FC_MIN_BLOCKS 1
#define FC_UNROLL 4
#define FC_RECORDS_SHARED_MAX 16384
#define FC_BUFFER_WORDS_BYTES 32
#define FC_DONE 4294967295u
#define FC_NONE 3
#define FC_SLOT 0
#define FC_IN_SENDER 1
#define FC_IN_RECEIVER 2
#define FC_SIMPLE 0
#define FC_LL 1
#define FC_SCOPE_GPU 0
#define FC_SCOPE_SYS 1
#define FC_MISMATCH 1
#define FC_TIMEOUT 2
#define FC_PEER_FAILED 3
#define FC_ABORTED 4

struct FcSpan {
    u32 first;
    u32 count;
};
static_assert(sizeof(FcSpan) == 8, "FcSpan: size");
static_assert(sizeof(((FcSpan *)0)->first) == 4, "FcSpan.first (first) at 0");
static_assert(sizeof(((FcSpan *)0)->count) == 4, "FcSpan.count (count) at 4");

struct FcRegion {
    u32 buffer;
    FcSpan pieces;
};
static_assert(sizeof(FcRegion) == 12, "FcRegion: size");
static_assert(sizeof(((FcRegion *)0)->buffer) == 4, "FcRegion.buffer (buffer) at 0");
static_assert(sizeof(((FcRegion *)0)->pieces) == 8, "FcRegion.pieces (pieces) at 4");

struct FcPiece {
    u64 offset;
    u64 bytes;
};
static_assert(sizeof(FcPiece) == 16, "FcPiece: size");
static_assert(sizeof(((FcPiece *)0)->offset) == 8, "FcPiece.offset (offset) at 0");
static_assert(sizeof(((FcPiece *)0)->bytes) == 8, "FcPiece.bytes (bytes) at 8");

struct FcEnd {
    u32 peer;
    u32 transfer;
    u64 index;
    FcRegion remote;
    u32 reserved;
};
static_assert(sizeof(FcEnd) == 32, "FcEnd: size");
static_assert(sizeof(((FcEnd *)0)->peer) == 4, "FcEnd.peer (peer) at 0");
static_assert(sizeof(((FcEnd *)0)->transfer) == 4, "FcEnd.transfer (transfer) at 4");
static_assert(sizeof(((FcEnd *)0)->index) == 8, "FcEnd.index (index) at 8");
static_assert(sizeof(((FcEnd *)0)->remote) == 12, "FcEnd.remote (remote) at 16");
static_assert(sizeof(((FcEnd *)0)->reserved) == 4, "FcEnd.reserved (reserved) at 28");

struct FcAfter {
    u32 channel;
    u32 index;
};
static_assert(sizeof(FcAfter) == 8, "FcAfter: size");
static_assert(sizeof(((FcAfter *)0)->channel) == 4, "FcAfter.channel (channel) at 0");
static_assert(sizeof(((FcAfter *)0)->index) == 4, "FcAfter.index (index) at 4");

struct FcOp {
    u64 bytes;
    FcSpan recv;
    FcRegion read;
    FcRegion write;
    FcSpan send;
    FcSpan after;
};
static_assert(sizeof(FcOp) == 56, "FcOp: size");
static_assert(sizeof(((FcOp *)0)->bytes) == 8, "FcOp.bytes (bytes) at 0");
static_assert(sizeof(((FcOp *)0)->recv) == 8, "FcOp.recv (recv) at 8");
static_assert(sizeof(((FcOp *)0)->read) == 12, "FcOp.read (read) at 16");
static_assert(sizeof(((FcOp *)0)->write) == 12, "FcOp.write (write) at 28");
static_assert(sizeof(((FcOp *)0)->send) == 8, "FcOp.send (send) at 40");
static_assert(sizeof(((FcOp *)0)->after) == 8, "FcOp.after (after) at 48");

struct FcCount {
    u32 word;
    u32 drain;
    u64 count;
};
static_assert(sizeof(FcCount) == 16, "FcCount: size");
static_assert(sizeof(((FcCount *)0)->word) == 4, "FcCount.word (word) at 0");
static_assert(sizeof(((FcCount *)0)->drain) == 4, "FcCount.drain (drain) at 4");
static_assert(sizeof(((FcCount *)0)->count) == 8, "FcCount.count (count) at 8");

struct FcChannel {
    FcSpan ops;
    FcSpan ends;
    FcSpan pieces;
    FcSpan afters;
};
static_assert(sizeof(FcChannel) == 32, "FcChannel: size");
static_assert(sizeof(((FcChannel *)0)->ops) == 8, "FcChannel.ops (ops) at 0");
static_assert(sizeof(((FcChannel *)0)->ends) == 8, "FcChannel.ends (ends) at 8");
static_assert(sizeof(((FcChannel *)0)->pieces) == 8, "FcChannel.pieces (pieces) at 16");
static_assert(sizeof(((FcChannel *)0)->afters) == 8, "FcChannel.afters (afters) at 24");

struct FcTables {
    const FcChannel *channels;
    const FcOp *ops;
    const FcPiece *pieces;
    const FcEnd *ends;
    const FcAfter *afters;
    const FcCount *sent;
    const FcCount *received;
    u32 sent_count;
    u32 received_count;
};
static_assert(sizeof(FcTables) == 64, "FcTables: size");
static_assert(sizeof(((FcTables *)0)->channels) == 8, "FcTables.channels (channels) at 0");
static_assert(sizeof(((FcTables *)0)->ops) == 8, "FcTables.ops (ops) at 8");
static_assert(sizeof(((FcTables *)0)->pieces) == 8, "FcTables.pieces (pieces) at 16");
static_assert(sizeof(((FcTables *)0)->ends) == 8, "FcTables.ends (ends) at 24");
static_assert(sizeof(((FcTables *)0)->afters) == 8, "FcTables.afters (afters) at 32");
static_assert(sizeof(((FcTables *)0)->sent) == 8, "FcTables.sent (sent) at 40");
static_assert(sizeof(((FcTables *)0)->received) == 8, "FcTables.received (received) at 48");
static_assert(sizeof(((FcTables *)0)->sent_count) == 4, "FcTables.sent_count (sent_count) at 56");
static_assert(sizeof(((FcTables *)0)->received_count) == 4, "FcTables.received_count (received_count) at 60");

struct FcCall {
    FcTables t;
    unsigned char *window[FC_MAX_RANKS];
    unsigned char *buffer[3];
    u64 *state;
    u64 *board;
    u64 posted_at;
    u64 consumed_at;
    u64 hello_at;
    u64 ll_at;
    u64 buffers_at;
    u64 alarm_at;
    u64 slot_bytes;
    u64 ll_slot_bytes;
    u64 timeout_ns;
    FcRegion divide;
    u32 records_shared;
    u32 hash;
    u32 rank;
    u32 world;
    u32 slots;
    u32 max_channels;
    u32 protocol;
    u32 scope;
    u32 reserved;
};
static_assert(sizeof(FcCall) == 736, "FcCall: size");
static_assert(sizeof(((FcCall *)0)->t) == 64, "FcCall.t (tables) at 0");
static_assert(sizeof(((FcCall *)0)->window) == 512, "FcCall.window (window) at 64");
static_assert(sizeof(((FcCall *)0)->buffer) == 24, "FcCall.buffer (buffer) at 576");
static_assert(sizeof(((FcCall *)0)->state) == 8, "FcCall.state (state) at 600");
static_assert(sizeof(((FcCall *)0)->board) == 8, "FcCall.board (board) at 608");
static_assert(sizeof(((FcCall *)0)->posted_at) == 8, "FcCall.posted_at (posted_at) at 616");
static_assert(sizeof(((FcCall *)0)->consumed_at) == 8, "FcCall.consumed_at (consumed_at) at 624");
static_assert(sizeof(((FcCall *)0)->hello_at) == 8, "FcCall.hello_at (hello_at) at 632");
static_assert(sizeof(((FcCall *)0)->ll_at) == 8, "FcCall.ll_at (ll_at) at 640");
static_assert(sizeof(((FcCall *)0)->buffers_at) == 8, "FcCall.buffers_at (buffers_at) at 648");
static_assert(sizeof(((FcCall *)0)->alarm_at) == 8, "FcCall.alarm_at (alarm_at) at 656");
static_assert(sizeof(((FcCall *)0)->slot_bytes) == 8, "FcCall.slot_bytes (slot_bytes) at 664");
static_assert(sizeof(((FcCall *)0)->ll_slot_bytes) == 8, "FcCall.ll_slot_bytes (ll_slot_bytes) at 672");
static_assert(sizeof(((FcCall *)0)->timeout_ns) == 8, "FcCall.timeout_ns (timeout_ns) at 680");
static_assert(sizeof(((FcCall *)0)->divide) == 12, "FcCall.divide (divide) at 688");
static_assert(sizeof(((FcCall *)0)->records_shared) == 4, "FcCall.records_shared (records_shared) at 700");
static_assert(sizeof(((FcCall *)0)->hash) == 4, "FcCall.hash (hash) at 704");
static_assert(sizeof(((FcCall *)0)->rank) == 4, "FcCall.rank (rank) at 708");
static_assert(sizeof(((FcCall *)0)->world) == 4, "FcCall.world (world) at 712");
static_assert(sizeof(((FcCall *)0)->slots) == 4, "FcCall.slots (slots) at 716");
static_assert(sizeof(((FcCall *)0)->max_channels) == 4, "FcCall.max_channels (max_channels) at 720");
static_assert(sizeof(((FcCall *)0)->protocol) == 4, "FcCall.protocol (protocol) at 724");
static_assert(sizeof(((FcCall *)0)->scope) == 4, "FcCall.scope (scope) at 728");
static_assert(sizeof(((FcCall *)0)->reserved) == 4, "FcCall.reserved (reserved) at 732");

#endif
