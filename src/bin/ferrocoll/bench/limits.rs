//! What a bench run may ask of this machine, checked before anything is
//! allocated or started: the thread count of in-process ranks, and the
//! memory the largest size needs on every rank held here.
//!
//! Sizes and rank counts come straight from the command line, so every
//! product of them is checked arithmetic; a run that cannot fit is refused
//! with what it needs and what there is, never a panic or an abort.

use ferrocoll::Collective;
use ferrocoll::topo::probe::membw;

use super::device::STAGE_BYTES;
use super::setup::Setup;
use super::{Backend, BenchArgs};

/// Most ranks one process runs as threads (`--backend cpu` without
/// `--transport`, `cuda`, `nccl`). Each rank is an OS thread that polls its
/// peers, and a call's plan grows with the square of the ranks: measured
/// (release, 2 cores), a 4 KiB all-reduce row took 3.5 s and 200 MB at 256
/// ranks but 58 s and 4 GB at 1024 — a run that measures the scheduler and
/// the allocator, not the collective.
pub(crate) const MAX_THREAD_RANKS: u32 = 256;

/// Whether every rank of the run is a thread of this process.
pub(crate) fn ranks_are_threads(args: &BenchArgs) -> bool {
    args.transport.is_none() || args.backend != Backend::Cpu
}

/// Refuse a rank count this process cannot run as threads.
pub(crate) fn check_ranks(args: &BenchArgs) -> Result<(), String> {
    if ranks_are_threads(args) && args.ranks > MAX_THREAD_RANKS {
        return Err(format!(
            "--ranks {} is more than the {MAX_THREAD_RANKS} ranks one process runs as threads; \
             use fewer ranks, or processes (`ferrocoll launch -n N -- ferrocoll bench --transport shm`)",
            args.ranks
        ));
    }
    Ok(())
}

/// Host bytes one rank holds at its peak for a call of `count` elements of
/// `elem` bytes per block, following `run`: on host backends its input, a
/// copy of it in the shared heap (processes) and the placed output (the
/// larger of input and output: an in-place buffer of another length
/// replaces it after it is freed), plus, checking, the
/// untouched pattern of a non-root reduce (the check itself makes inputs a
/// small block at a time); on a GPU (`gpu`) its input and a staging chunk,
/// plus the output read back to be checked. `None` when the arithmetic
/// overflows.
pub(crate) fn bytes_per_rank(
    collective: Collective,
    n: u32,
    count: usize,
    elem: usize,
    check: bool,
    gpu: bool,
) -> Option<u64> {
    let block = u64::try_from(count).ok()?.checked_mul(elem as u64)?;
    let input = u64::from(collective.input_blocks(n)).checked_mul(block)?;
    let output = u64::from(collective.output_blocks(n)).checked_mul(block)?;
    if gpu {
        let read_back = if check { output } else { 0 };
        return input
            .checked_add(STAGE_BYTES as u64)?
            .checked_add(read_back);
    }
    let held = input.checked_mul(2)?.checked_add(input.max(output))?;
    held.checked_add(if check { block } else { 0 })
}

/// The host memory the largest size needs, on the `here` ranks this
/// process holds, against what the machine has available; an error names
/// both (a warning on GPU backends, whose ranks hold little host memory).
/// Machines that do not say (no `/proc/meminfo`) are not checked
/// up front: the allocations themselves are fallible.
pub(crate) fn check_memory(args: &BenchArgs, setup: &Setup) -> Result<(), String> {
    let here = if ranks_are_threads(args) {
        args.ranks
    } else {
        1
    };
    let need = memory_need(args, setup, here)?;
    let Some(available) = available_memory() else {
        return Ok(());
    };
    if need.total > available {
        let message = format!(
            "bench needs {} for {here} rank(s) × {} per rank ({} of {} at -e {}{}), but {} is available; \
             lower -e or --ranks{}",
            gib(need.total),
            gib(need.per_rank),
            need.collective,
            need.dtype,
            args.max_bytes,
            if args.check != 0 {
                ", checking included"
            } else {
                ""
            },
            gib(available),
            if args.check != 0 {
                ", or pass -c 0"
            } else {
                ""
            }
        );
        // A GPU rank's host memory is its input and a staging chunk, and
        // a VM's memory may grow as it is used: advice, not a refusal.
        if args.backend != Backend::Cpu {
            eprintln!("# warning: {message}");
            return Ok(());
        }
        return Err(message);
    }
    Ok(())
}

/// The most memory any section needs at the largest size.
struct Need {
    total: u64,
    per_rank: u64,
    collective: String,
    dtype: &'static str,
}

fn memory_need(args: &BenchArgs, setup: &Setup, here: u32) -> Result<Need, String> {
    let Some(&size) = setup.sizes.last() else {
        return Ok(Need {
            total: 0,
            per_rank: 0,
            collective: String::new(),
            dtype: "",
        });
    };
    let overflow = || {
        format!(
            "-e {} on {} ranks overflows the bench's buffer arithmetic",
            args.max_bytes, args.ranks
        )
    };
    let mut worst: Option<Need> = None;
    for section in &setup.sections {
        let collective = setup.collective(section, args);
        let elem = section.dtype.size_bytes();
        let blocks = collective.size_blocks(args.ranks) as usize;
        let count = size / elem.checked_mul(blocks).ok_or_else(overflow)?.max(1);
        // Each rank keeps one time per timed call (the median needs them).
        let samples = u64::from(args.iters) * std::mem::size_of::<f64>() as u64;
        let gpu = args.backend != Backend::Cpu;
        let per_rank = bytes_per_rank(collective, args.ranks, count, elem, args.check != 0, gpu)
            .and_then(|b| b.checked_add(samples))
            .and_then(|b| b.checked_add(probe_bytes_per_rank(args)))
            .ok_or_else(overflow)?;
        let total = per_rank.checked_mul(u64::from(here)).ok_or_else(overflow)?;
        if worst.as_ref().is_none_or(|w| total > w.total) {
            worst = Some(Need {
                total,
                per_rank,
                collective: collective.kind().name().to_owned(),
                dtype: section.dtype.nccl_tests_name(),
            });
        }
    }
    worst.ok_or_else(|| "no section to run".to_owned())
}

/// The memory probe's two arrays each rank holds beside its buffers when
/// `--membw` may pair rows with probes (`paired.rs`: two or more ranks on
/// host memory, threads or shared memory); counted whatever the sizes,
/// since the cache that decides which rows pair is the ranks'.
fn probe_bytes_per_rank(args: &BenchArgs) -> u64 {
    let host = args.backend == Backend::Cpu
        && matches!(
            args.transport,
            None | Some(
                ferrocoll::process::TransportKind::Shm | ferrocoll::process::TransportKind::Auto
            )
        );
    match args.membw && host && args.ranks >= 2 {
        true => 2 * (membw::ARRAY_BYTES / args.ranks as usize) as u64,
        false => 0,
    }
}

/// `MemAvailable` of `/proc/meminfo`, bytes: what the kernel says can be
/// allocated without swapping.
fn available_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line
        .trim_start_matches("MemAvailable:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    kib.checked_mul(1024)
}

/// `12.5 GiB`.
fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / f64::from(1u32 << 30))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffer_arithmetic_is_checked() {
        let ar = Collective::AllReduce;
        // 1 element of 4 bytes, 4 ranks, no check: input, its shared
        // copy, the output.
        assert_eq!(bytes_per_rank(ar, 4, 1, 4, false, false), Some(12));
        // Checking adds the untouched pattern's block, not every rank's
        // input: those are made a block at a time.
        assert_eq!(bytes_per_rank(ar, 4, 1, 4, true, false), Some(16));
        let gib = 1 << 30;
        let stage = STAGE_BYTES as u64;
        let ag = Collective::AllGather;
        assert_eq!(
            bytes_per_rank(ag, 8, gib / 4, 4, false, false),
            Some(10 * gib as u64),
        );
        // A GPU rank at -c 0 holds its input and one staging chunk, not
        // three copies; checking reads the output back.
        assert_eq!(
            bytes_per_rank(ar, 8, gib / 4, 4, false, true),
            Some(gib as u64 + stage)
        );
        assert_eq!(
            bytes_per_rank(ar, 8, gib / 4, 4, true, true),
            Some(2 * gib as u64 + stage)
        );
        assert_eq!(bytes_per_rank(ar, 4, usize::MAX / 2, 4, false, false), None);
        assert_eq!(bytes_per_rank(ag, u32::MAX, 1 << 40, 8, true, true), None);
        assert_eq!(bytes_per_rank(ag, u32::MAX, 1 << 40, 8, true, false), None);
    }

    #[test]
    fn gib_prints_one_decimal() {
        assert_eq!(gib(3 << 29), "1.5 GiB");
    }
}
