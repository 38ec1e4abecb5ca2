//! The device interpreter's own source — `cuda/reduce.cu` and
//! `cuda/interpret.cu`, with `cuda/host.h` standing in for CUDA — built as
//! host C++ and run on CPU threads, one per thread block: the kernel's
//! instruction loop, counters, LL lines, greetings, timeouts and board,
//! as written, in every `cargo test`. [`super::emulate`] mirrors the same
//! protocol in Rust; running the source itself beside it means the two
//! cannot drift apart unnoticed, and a bug in the kernel's own arithmetic
//! shows here rather than first on a GPU.
//!
//! It needs a C++ compiler (`CXX`, else `c++`). Without one the tests
//! that use it say so and pass, unless `FERROCOLL_REQUIRE_HOST_KERNEL=1`
//! (CI sets it), where that is a failure.

use std::ffi::{CString, c_void};
use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use ferrocoll_core::Rank;
use ferrocoll_core::comm::CommError;
use ferrocoll_core::types::Reduce;

use super::emulate::{Buffers, on_rank_threads};
use super::params::{Addresses, Failure, Params, pack};
use super::{DeviceProgram, Layout};
use crate::kernels;

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
        Err(why) if std::env::var_os("FERROCOLL_REQUIRE_HOST_KERNEL").is_some() => {
            panic!("FERROCOLL_REQUIRE_HOST_KERNEL is set, but: {why}")
        }
        Err(why) => {
            println!("SKIPPED (the kernel's source on the host): {why}");
            None
        }
    }
}

fn build() -> Result<HostKernel, String> {
    let dir = std::env::temp_dir().join(format!("ferrocoll-host-kernel-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let built = compile_and_load(&dir);
    // Loaded (or not), the files are done with: the mapping outlives them.
    let _ = std::fs::remove_dir_all(&dir);
    built
}

fn compile_and_load(dir: &Path) -> Result<HostKernel, String> {
    let source = dir.join("interpret.cpp");
    let library = dir.join("libinterpret.so");
    let text = format!(
        "{}\n{}\n{}",
        include_str!("../../../../cuda/host.h"),
        kernels::SOURCE,
        kernels::INTERPRETER
    );
    std::fs::write(&source, text).map_err(|e| format!("{}: {e}", source.display()))?;
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let out = Command::new(&cxx)
        .args(["-std=c++17", "-O1", "-shared", "-fPIC", "-w", "-o"])
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

    /// Run `name` as block `block` of `grid` on this thread.
    ///
    /// # Safety
    /// Every address in `params` is live host memory of the shape the
    /// program describes until every block of the call has returned.
    unsafe fn interpret(&self, name: &str, block: u32, grid: u32, params: Params) {
        // SAFETY: the symbols are `extern "C"` functions of these
        // signatures (`fc_host_block` in cuda/host.h; the interpreter takes
        // `FcCall` by value, which `Params` mirrors, tested).
        unsafe {
            let set: extern "C" fn(u32, u32) = std::mem::transmute(self.symbol("fc_host_block"));
            let run: extern "C" fn(Params) = std::mem::transmute(self.symbol(name));
            set(block, grid);
            run(params);
        }
    }

    /// avg's division of `n` elements at `data` by `divisor`, on this
    /// thread (a grid of one block of one thread covers them all).
    ///
    /// # Safety
    /// `data` addresses `n` elements of the kernel's type.
    unsafe fn divide(&self, name: &str, data: u64, n: u64, divisor: u64) {
        // SAFETY: `ferrocoll_div_*` take (T *data, u64 n, u64 divisor).
        unsafe {
            let set: extern "C" fn(u32, u32) = std::mem::transmute(self.symbol("fc_host_block"));
            let div: extern "C" fn(u64, u64, u64) = std::mem::transmute(self.symbol(name));
            set(0, 1);
            div(data, n, divisor);
        }
    }
}

/// Zeroed host memory, 16-byte aligned, at a fixed address.
struct Block(Box<[u128]>);

impl Block {
    fn new(bytes: u64) -> Block {
        Block(vec![0u128; bytes.div_ceil(16).max(1) as usize].into_boxed_slice())
    }

    fn addr(&self) -> u64 {
        self.0.as_ptr() as u64
    }
}

/// Every rank's window and state, and the board, outlasting calls as the
/// device's do.
pub struct HostFabric {
    kernel: &'static HostKernel,
    layout: Layout,
    windows: Vec<Block>,
    states: Vec<Block>,
    board: Block,
    timeout: Duration,
}

impl HostFabric {
    /// Memory for `layout`'s ranks, zeroed.
    pub fn new(kernel: &'static HostKernel, layout: Layout, timeout: Duration) -> HostFabric {
        let n = layout.world_size as usize;
        HostFabric {
            kernel,
            layout,
            windows: (0..n).map(|_| Block::new(layout.window().bytes)).collect(),
            states: (0..n)
                .map(|_| Block::new(8 * layout.state().words as u64))
                .collect(),
            board: Block::new(8 * n as u64),
            timeout,
        }
    }

    /// Rank `r`'s board word.
    pub fn word(&self, r: usize) -> u64 {
        let words = self.board.addr() as *const u64;
        // SAFETY: in the board (one word per rank); blocks have returned.
        unsafe { words.add(r).read_volatile() }
    }

    /// One call: every rank's part at once (see [`HostFabric::rank_call`]).
    pub fn call<T: Reduce>(
        &self,
        programs: &[&DeviceProgram],
        buffers: Vec<Buffers<'_, T>>,
    ) -> Vec<Result<(), CommError>> {
        let n = self.layout.world_size as usize;
        assert_eq!((programs.len(), buffers.len()), (n, n));
        on_rank_threads(buffers, |r, b| self.rank_call(r as Rank, programs[r], b))
            .into_iter()
            .map(|x| x.expect("a rank's thread"))
            .collect()
    }

    /// One rank's launch: its blocks as threads, one per channel of its
    /// program, then avg's division; its failure if its board word is set.
    pub fn rank_call<T: Reduce>(
        &self,
        rank: Rank,
        program: &DeviceProgram,
        b: Buffers<'_, T>,
    ) -> Result<(), CommError> {
        let r = rank as usize;
        assert_eq!(program.layout, self.layout, "rank {r}");
        program.validate().expect("a valid program");
        assert_eq!(T::DATA_TYPE, program.dtype);
        let (blob, packed) = pack(&program.ranks[r]);
        let tables = Block::new(blob.len() as u64);
        // SAFETY: the block holds at least `blob.len()` bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(blob.as_ptr(), tables.addr() as *mut u8, blob.len())
        };
        let scratch = Block::new(program.scratch_bytes);
        let output = b.output.as_mut_ptr() as u64;
        let input = if b.input.is_empty() {
            output
        } else {
            b.input.as_ptr() as u64
        };
        let windows: Vec<u64> = self.windows.iter().map(Block::addr).collect();
        let at = Addresses {
            tables: tables.addr(),
            windows: &windows,
            buffers: [input, output, scratch.addr()],
            state: self.states[r].addr(),
            board: self.board.addr(),
        };
        let params = Params::new(program, rank, &packed, &at, self.timeout);
        let grid = program.ranks[r].channels.len() as u32;
        let name = kernels::interpreter_kernel(program.dtype, program.op);
        std::thread::scope(|scope| {
            for block in 0..grid {
                let name = &name;
                // SAFETY: windows, state, board, tables, scratch and the
                // caller's buffers outlive the scope.
                scope.spawn(move || unsafe { self.kernel.interpret(name, block, grid, params) });
            }
        });
        self.outcome(program, r, &params)
    }

    fn outcome(&self, program: &DeviceProgram, r: usize, params: &Params) -> Result<(), CommError> {
        if let Some((failure, call)) = Failure::decode(self.word(r)) {
            // The device counts calls from 1; errors number them from 0.
            let call = u64::from(call).saturating_sub(1);
            return Err(failure.error(r as Rank, call, self.timeout));
        }
        let me = &program.ranks[r];
        if let Some(d) = &me.divide {
            let size = program.dtype.size_bytes() as u64;
            let base = params.buffer[d.buffer as usize];
            let name = kernels::divide_kernel(program.dtype);
            for p in &me.pieces[d.pieces.first as usize..][..d.pieces.count as usize] {
                let world = u64::from(self.layout.world_size);
                // SAFETY: the piece lies in the rank's output (the plan
                // was checked against it); the call's blocks have ended.
                unsafe {
                    self.kernel
                        .divide(&name, base + p.offset, p.bytes / size, world)
                };
            }
        }
        Ok(())
    }
}
