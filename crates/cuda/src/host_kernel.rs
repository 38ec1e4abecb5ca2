//! The device interpreter's own source — the generated records header,
//! `cuda/elements.cuh` and `cuda/interpret.cu`, with `cuda/host.h`
//! standing in for CUDA — built as host C++ and run on CPU threads, one
//! per thread block, the block's threads as fibers of it (`cuda/host.h`):
//! the kernel's instruction loop, transfers, counters, LL lines,
//! greetings, barriers, drains, avg's division, timeouts, the alarm and
//! the board, as written, in every `cargo test`. It is the one CPU rig of
//! the device protocol: a bug in the kernel's own arithmetic shows here
//! rather than first on a GPU.
//!
//! It needs a C++ compiler (`CXX`, else `c++`). Without one the tests
//! that use it say so and pass, unless `FERROCOLL_REQUIRE_HOST_KERNEL=1`
//! (CI sets it), where that is a failure.
//!
//! `FERROCOLL_HOST_KERNEL_TSAN=1` builds it with ThreadSanitizer (run the
//! test binary with the sanitizer's runtime preloaded:
//! `scripts/host-kernel-tsan.sh`), one thread per block (the sanitizer
//! does not follow fibers): every byte the blocks of different ranks and
//! channels share must then be ordered by the kernel's own acquire and
//! release, under the C++ memory model rather than x86's.
//!
//! A block's threads take turns where a GPU thread would wait (barriers,
//! spins), so they stride over messages and share `__shared__` memory as
//! on the device, but never run at once: what needs that — the system
//! fence publishing other threads' stores, a weaker memory model than
//! x86's, shared memory that starts uninitialised, 512 threads rather than
//! a few — shows only on the device (`cuda_conformance`).

use std::ffi::{CString, c_void};
use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ferrocoll_core::Rank;
use ferrocoll_core::comm::CommError;
use ferrocoll_core::kernels::Reduce;

use crate::kernels;
use crate::program::abi::ABORTED;
use crate::program::params::{Addresses, Failure, pack};
use crate::program::{DeviceProgram, Layout, Params, Scope};

/// The source built for the host, loaded.
pub struct HostKernel {
    handle: *mut c_void,
}

// SAFETY: the handle is only used to look up symbols (`dlsym` is
// thread-safe) and is never closed.
unsafe impl Send for HostKernel {}
// SAFETY: as above.
unsafe impl Sync for HostKernel {}

/// The kernel built once per test process, or why not. `None` when there
/// is no compiler and none is required.
pub fn kernel() -> Option<&'static HostKernel> {
    static KERNEL: OnceLock<Result<HostKernel, String>> = OnceLock::new();
    match KERNEL.get_or_init(build) {
        Ok(k) => Some(k),
        Err(why) if required() => {
            panic!("FERROCOLL_REQUIRE_HOST_KERNEL is set, but: {why}")
        }
        Err(why) => {
            eprintln!("SKIPPED (the kernel's source on the host): {why}");
            None
        }
    }
}

/// `FERROCOLL_REQUIRE_HOST_KERNEL` set to anything but `0` or nothing.
fn required() -> bool {
    flag("FERROCOLL_REQUIRE_HOST_KERNEL")
}

/// Whether the build is for ThreadSanitizer.
pub fn tsan() -> bool {
    flag("FERROCOLL_HOST_KERNEL_TSAN")
}

fn flag(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| !v.is_empty() && v != "0")
}

fn build() -> Result<HostKernel, String> {
    // A fresh directory of this process's own (`create_dir` refuses one
    // that exists), so nothing else's library is loaded from it.
    let nonce = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let dir = std::env::temp_dir().join(format!(
        "ferrocoll-host-kernel-{}-{nonce:x}",
        std::process::id()
    ));
    let mut create = std::fs::DirBuilder::new();
    std::os::unix::fs::DirBuilderExt::mode(&mut create, 0o700);
    create
        .create(&dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    let built = compile_and_load(&dir);
    // Loaded (or not), the files are done with: the mapping outlives them.
    // Under the sanitizer the library stays, so its reports name lines.
    if !tsan() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    built
}

fn compile_and_load(dir: &Path) -> Result<HostKernel, String> {
    let source = dir.join("interpret.cpp");
    let library = dir.join("libinterpret.so");
    let text = format!(
        "{}\n{}\n{}",
        include_str!("../../../cuda/host.h"),
        kernels::source(),
        include_str!("../../../cuda/host_launch.h"),
    );
    std::fs::write(&source, text).map_err(|e| format!("{}: {e}", source.display()))?;
    // `CXX` may carry a launcher (`ccache g++`).
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let mut words = cxx.split_whitespace();
    let program = words.next().ok_or("CXX is empty")?;
    // The kernels read messages through `uint4` and 64-bit words as their
    // element type, as CUDA code does: no strict-aliasing assumptions.
    let sanitize: &[&str] = if tsan() {
        &["-fsanitize=thread", "-g", "-DFC_TSAN"]
    } else {
        &[]
    };
    let out = Command::new(program)
        .args(words)
        .args(sanitize)
        .args([
            "-std=c++17",
            "-O1",
            "-fno-strict-aliasing",
            "-shared",
            "-fPIC",
            "-w",
            "-o",
        ])
        .arg(&library)
        .arg(&source)
        .output()
        .map_err(|e| format!("no C++ compiler `{cxx}`: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "`{cxx}` could not build the kernel's source for the host:\n{}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let path = CString::new(library.to_string_lossy().as_bytes()).map_err(|e| e.to_string())?;
    // SAFETY: a library just built from our own source, whose static
    // initialisers only set thread-locals.
    let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if handle.is_null() {
        return Err(format!("dlopen {}", library.display()));
    }
    Ok(HostKernel { handle })
}

impl HostKernel {
    fn symbol(&self, name: &str) -> *mut c_void {
        let c = CString::new(name).expect("kernel names have no NUL");
        // SAFETY: a live handle and a NUL-terminated name.
        let f = unsafe { libc::dlsym(self.handle, c.as_ptr()) };
        assert!(!f.is_null(), "the host build has no `{name}`");
        f
    }

    /// The function `name` as the `extern "C"` fn pointer type `F`.
    ///
    /// # Safety
    /// `F` is the function's signature in cuda/host.h, host_launch.h or
    /// the kernels' sources.
    unsafe fn function<F: Copy>(&self, name: &str) -> F {
        assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<*mut c_void>());
        let f = self.symbol(name);
        // SAFETY: a function pointer of the caller's signature, the size
        // of a data pointer (asserted).
        unsafe { std::mem::transmute_copy(&f) }
    }

    /// Run `name` as block `block` of `grid`, `threads` threads a block
    /// (fibers of this thread), on this thread.
    ///
    /// # Safety
    /// Every address in `params` is live host memory of the shape the
    /// program describes until every block of the call has returned.
    unsafe fn interpret(&self, name: &str, block: u32, grid: u32, threads: u32, params: &Params) {
        type Launch = extern "C" fn(*mut c_void, *const Params, u32, u32, u32);
        // SAFETY: `fc_host_launch` (cuda/host_launch.h) takes the kernel,
        // a pointer to its `FcCall` (which `Params` mirrors, tested) and
        // three counts; it copies the parameters before running.
        let launch: Launch = unsafe { self.function("fc_host_launch") };
        launch(self.symbol(name), params, block, grid, threads);
    }

    /// The shim's float → half, half → float and float → bfloat16, as
    /// functions (for the test that holds them against the CPU's).
    pub fn conversions(&self) -> (ToNarrow, FromHalf, ToNarrow) {
        // SAFETY: `extern "C"` functions of these signatures in cuda/host.h.
        unsafe {
            (
                self.function("fc_host_to_half"),
                self.function("fc_host_from_half"),
                self.function("fc_host_to_bf16"),
            )
        }
    }
}

/// A float to half or bfloat16 bits.
pub type ToNarrow = extern "C" fn(f32) -> u16;
/// Half bits to a float.
pub type FromHalf = extern "C" fn(u16) -> f32;

/// Memory other threads write into, ordered by the counters: a raw
/// allocation, zeroed and 16-byte aligned (as device allocations are, for
/// the kernel's vector accesses), so that no reference to the whole of it
/// ever exists while threads write their parts.
pub struct Arena {
    ptr: *mut u128,
    words: usize,
}

// SAFETY: every access to an arena's bytes by the kernel's threads is
// ordered by the protocol's counters, which is what these tests (and the
// ThreadSanitizer build of them) check; the host touches an arena only
// while no block runs.
unsafe impl Sync for Arena {}

// SAFETY: the arena owns its allocation; sending it moves that ownership.
unsafe impl Send for Arena {}

impl Arena {
    /// `bytes` zeroed bytes (at least 16).
    pub fn new(bytes: u64) -> Self {
        let words = bytes.div_ceil(16).max(1) as usize;
        let ptr = Box::into_raw(vec![0u128; words].into_boxed_slice()).cast::<u128>();
        Arena { ptr, words }
    }

    /// The first byte.
    pub fn ptr(&self) -> *mut u8 {
        self.ptr.cast()
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: `ptr` and `words` came from `Box::into_raw` of a boxed
        // slice of that length, freed once, here.
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.ptr, self.words)) });
    }
}

/// The address the kernel is given for an arena.
fn addr(a: &Arena) -> u64 {
    a.ptr() as u64
}

/// One rank's buffers for a call, in the element type of the call.
pub struct Buffers<'a, T> {
    /// The input (empty in place).
    pub input: &'a [T],
    /// The output (in place: the one buffer).
    pub output: &'a mut [T],
}

/// Why `buffers` cannot hold `program`'s call: another element type, or
/// a length other than the program's (an in-place call has no input).
fn buffer_problem<T: Reduce>(
    program: &DeviceProgram,
    buffers: &Buffers<'_, T>,
) -> Option<CommError> {
    if T::DATA_TYPE != program.dtype {
        return Some(CommError::DtypeMismatch {
            input: T::DATA_TYPE,
            output: program.dtype,
        });
    }
    let size = std::mem::size_of::<T>() as u64;
    [
        ("input", buffers.input.len(), program.input_bytes),
        ("output", buffers.output.len(), program.output_bytes),
    ]
    .into_iter()
    .find(|&(_, got, needed)| got as u64 * size != needed)
    .map(|(what, got, needed)| CommError::BufferSize {
        what,
        got,
        needed: (needed / size) as usize,
    })
}

/// `f` on a thread per rank, each with its buffers.
fn on_rank_threads<'a, T: Send + Sync, R: Send>(
    buffers: Vec<Buffers<'a, T>>,
    f: impl Fn(usize, Buffers<'a, T>) -> R + Sync,
) -> Vec<std::thread::Result<R>> {
    std::thread::scope(|scope| {
        let handles: Vec<_> = buffers
            .into_iter()
            .enumerate()
            .map(|(r, b)| {
                let f = &f;
                scope.spawn(move || f(r, b))
            })
            .collect();
        handles.into_iter().map(|h| h.join()).collect()
    })
}

/// Every rank's window and state, and the board, outlasting calls as the
/// device's do.
pub struct HostFabric {
    kernel: &'static HostKernel,
    threads: u32,
    layout: Layout,
    windows: Vec<Arena>,
    states: Vec<Arena>,
    board: Arena,
    timeout: Duration,
}

impl HostFabric {
    /// Memory for `layout`'s ranks, zeroed; blocks of `threads` threads.
    pub fn new(
        kernel: &'static HostKernel,
        threads: u32,
        layout: Layout,
        timeout: Duration,
    ) -> HostFabric {
        let n = layout.world_size as usize;
        HostFabric {
            kernel,
            threads: if tsan() { 1 } else { threads.max(1) },
            layout,
            windows: (0..n).map(|_| Arena::new(layout.window().bytes)).collect(),
            states: (0..n)
                .map(|_| Arena::new(8 * layout.state().words as u64))
                .collect(),
            board: Arena::new(8 * n as u64),
            timeout,
        }
    }

    /// Every rank's every channel as if `call` calls had run, the last
    /// of some plan (tests of the call number's wrap at 2³²).
    pub fn start_after(&self, call: u64) {
        let (at, hello) = (self.layout.state(), self.layout.window().hello);
        for (state, window) in self.states.iter().zip(&self.windows) {
            let words = state.ptr().cast::<u64>();
            // SAFETY: the window's hello words are 8-byte aligned inside it.
            let hellos = unsafe { window.ptr().add(hello as usize).cast::<u64>() };
            for c in 0..self.layout.max_channels as usize {
                // SAFETY: inside the state (`calls` holds a word per
                // channel) and the window (a hello word per channel); no
                // block runs between calls.
                unsafe {
                    words.add(at.calls + c).write(call);
                    hellos.add(c).write(call << 32);
                }
            }
        }
    }

    /// Rank `r`'s board word.
    fn word(&self, r: usize) -> &AtomicU64 {
        assert!(r < self.layout.world_size as usize);
        let words = self.board.ptr().cast::<AtomicU64>();
        // SAFETY: in the board (one word per rank, asserted), 8-byte
        // aligned, only ever accessed atomically (the kernel's CAS and
        // loads, the host's `abort`).
        unsafe { &*words.add(r) }
    }

    /// One call: every rank's part at once (see [`HostFabric::rank_call`]).
    /// Every rank's refusal is on the board before any block starts, so a
    /// test can tell that nothing of a refused call ran.
    pub fn call<T: Reduce>(
        &self,
        programs: &[&DeviceProgram],
        buffers: Vec<Buffers<'_, T>>,
    ) -> Vec<Result<(), CommError>> {
        let n = self.layout.world_size as usize;
        assert_eq!((programs.len(), buffers.len()), (n, n));
        for (r, b) in buffers.iter().enumerate() {
            if self.refusal(programs[r], b).is_some() {
                self.abort(r);
            }
        }
        on_rank_threads(buffers, |r, b| self.rank_call(r as Rank, programs[r], b))
            .into_iter()
            .map(|x| x.expect("a rank's thread"))
            .collect()
    }

    /// One rank's launch: its blocks as threads, one per channel of its
    /// program (avg's division is the kernel's own); its failure if its
    /// board word is set.
    /// What the host would refuse before a launch (another layout, an
    /// invalid program, buffers that do not fit) fails the rank, as the
    /// communicator does, so its peers stop rather than wait it out.
    pub fn rank_call<T: Reduce>(
        &self,
        rank: Rank,
        program: &DeviceProgram,
        b: Buffers<'_, T>,
    ) -> Result<(), CommError> {
        let r = rank as usize;
        // A rank whose host side panics stops its peers too.
        let _stop = AbortOnPanic(self, r);
        if let Some(e) = self.refusal(program, &b) {
            self.abort(r);
            return Err(e);
        }
        let (blob, packed) = pack(&program.ranks[r]);
        let tables = Arena::new(blob.len() as u64);
        // SAFETY: the arena holds at least `blob.len()` bytes.
        unsafe { std::ptr::copy_nonoverlapping(blob.as_ptr(), tables.ptr(), blob.len()) };
        let scratch = Arena::new(program.scratch_bytes);
        let output = b.output.as_mut_ptr() as u64;
        let input = if b.input.is_empty() {
            output
        } else {
            b.input.as_ptr() as u64
        };
        let windows: Vec<u64> = self.windows.iter().map(addr).collect();
        let at = Addresses {
            tables: addr(&tables),
            windows: &windows,
            buffers: [input, output, addr(&scratch)],
            state: addr(&self.states[r]),
            board: addr(&self.board),
        };
        let params = Params::new(program, rank, &packed, &at, self.timeout, Scope::System);
        let grid = program.ranks[r].channels.len() as u32;
        let name = kernels::interpreter_kernel(program.dtype, program.op);
        std::thread::scope(|scope| {
            let blocks: Vec<_> = (0..grid)
                .map(|block| {
                    let (name, params, threads) = (&name, &params, self.threads);
                    // SAFETY: windows, state, board, tables, scratch and
                    // the caller's buffers outlive the scope.
                    scope.spawn(move || unsafe {
                        self.kernel.interpret(name, block, grid, threads, params)
                    })
                })
                .collect();
            // Joined one by one (the scope's own wait is not a join a
            // thread sanitizer sees).
            for b in blocks {
                b.join().expect("a block's thread");
            }
        });
        self.outcome(r)
    }

    /// Why the host would not launch `program` on `b`.
    fn refusal<T: Reduce>(&self, program: &DeviceProgram, b: &Buffers<'_, T>) -> Option<CommError> {
        if program.layout != self.layout {
            return Some(CommError::Capacity {
                what: "a program lowered for another layout".into(),
            });
        }
        if let Err(e) = program.validate() {
            return Some(CommError::Capacity {
                what: e.to_string(),
            });
        }
        buffer_problem(program, b)
    }

    /// Set rank `r`'s board word, as the host's `abort` does, unless it
    /// holds a reason already.
    fn abort(&self, r: usize) {
        let _ = self
            .word(r)
            .compare_exchange(0, ABORTED, Ordering::AcqRel, Ordering::Acquire);
    }

    fn outcome(&self, r: usize) -> Result<(), CommError> {
        match Failure::decode(self.word(r).load(Ordering::Acquire)) {
            // The device counts calls from 1; errors number them from 0.
            Some((failure, call)) => {
                let call = u64::from(call).saturating_sub(1);
                Err(failure.error(r as Rank, call, self.timeout))
            }
            None => Ok(()),
        }
    }
}

/// Aborts its rank if dropped while the thread panics.
struct AbortOnPanic<'a>(&'a HostFabric, usize);

impl Drop for AbortOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.abort(self.1);
        }
    }
}

#[cfg(test)]
mod tests {
    use ferrocoll_core::half::{bf16, f16};

    /// Half and bfloat16 on the host rig round as the CPU executor does
    /// (the `half` crate): every half, and floats across every exponent
    /// with the mantissas where rounding decides (ties, just either side,
    /// the extremes), infinities and NaNs.
    #[test]
    fn the_shims_conversions_round_as_the_cpu_does() {
        let Some(k) = super::kernel() else { return };
        let (to_half, from_half, to_bf16) = k.conversions();
        for h in 0..=u16::MAX {
            let (ours, cpu) = (from_half(h), f16::from_bits(h).to_f32());
            assert!(
                ours.to_bits() == cpu.to_bits() || (ours.is_nan() && cpu.is_nan()),
                "{h:#x}"
            );
        }
        let mantissas = [
            0, 1, 0xfff, 0x1000, 0x1001, 0x2000, 0x3000, 0x7fff, 0x8000, 0x8001, 0x7f_ffff,
            0x40_0000, 0x7f_e000, 0x7f_f000,
        ];
        for sign in [0u32, 1 << 31] {
            for exp in 0..=255u32 {
                for m in mantissas {
                    let f = f32::from_bits(sign | exp << 23 | m);
                    let (h, b) = (to_half(f), to_bf16(f));
                    if f.is_nan() {
                        assert!(
                            f16::from_bits(h).is_nan() && bf16::from_bits(b).is_nan(),
                            "{f:?}"
                        );
                        continue;
                    }
                    assert_eq!(
                        h,
                        f16::from_f32(f).to_bits(),
                        "half of {f:e} ({:#x})",
                        f.to_bits()
                    );
                    assert_eq!(
                        b,
                        bf16::from_f32(f).to_bits(),
                        "bf16 of {f:e} ({:#x})",
                        f.to_bits()
                    );
                }
            }
        }
    }
}
