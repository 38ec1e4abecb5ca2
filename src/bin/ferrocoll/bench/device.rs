//! What the GPU backends (`cuda`, `nccl`) share: host data as bytes in
//! device memory and back, and calls timed on the device, nccl-tests'
//! way.

use std::borrow::Cow;
use std::sync::Arc;

use cudarc::driver::{CudaEvent, CudaSlice, CudaStream, DevicePtr, sys};
use ferrocoll::comm::CommError;
use ferrocoll::conformance::KitElement;
use ferrocoll::cuda::{GpuProbe, probe};
use ferrocoll::device::{DeviceCall, DeviceCommunicator};
use ferrocoll::topo::probe::membw::MemoryBandwidth;
use ferrocoll::topo::probe::{LinkProbe, ProbeOptions};
use ferrocoll::{Collective, ReduceOp};

use super::buffers::Pattern;

/// A host slice's bytes.
pub(crate) fn bytes_of<T>(data: &[T]) -> &[u8] {
    // SAFETY: every bench element type is plain data without padding, so
    // its bytes are initialised and any alignment of u8 holds.
    unsafe { std::slice::from_raw_parts(data.as_ptr().cast::<u8>(), std::mem::size_of_val(data)) }
}

fn backend(e: cudarc::driver::DriverError) -> CommError {
    CommError::backend("cuda", e)
}

/// `bytes` in new device memory on `stream` (at least one byte).
pub(crate) fn upload(stream: &Arc<CudaStream>, bytes: &[u8]) -> Result<CudaSlice<u8>, CommError> {
    let mut slice = stream
        .alloc_zeros::<u8>(bytes.len().max(1))
        .map_err(backend)?;
    if !bytes.is_empty() {
        stream
            .memcpy_htod(bytes, &mut slice.slice_mut(..bytes.len()))
            .map_err(backend)?;
    }
    Ok(slice)
}

/// Device bytes back as values of `T`.
pub(crate) fn download<T>(
    stream: &Arc<CudaStream>,
    slice: &CudaSlice<u8>,
) -> Result<Vec<T>, CommError> {
    let bytes = stream.clone_dtoh(slice).map_err(backend)?;
    let n = bytes.len() / std::mem::size_of::<T>();
    // SAFETY: the bytes were uploaded from a `Vec<T>` of `n` elements and
    // written by kernels of the same type; read unaligned.
    Ok((0..n)
        .map(|i| unsafe { bytes.as_ptr().cast::<T>().add(i).read_unaligned() })
        .collect())
}

/// Wait for `stream`.
pub(crate) fn sync(stream: &Arc<CudaStream>) -> Result<(), CommError> {
    stream.synchronize().map_err(backend)
}

/// A call's buffers in device memory, as bytes.
pub(crate) struct Buffers {
    pub input: CudaSlice<u8>,
    pub output: CudaSlice<u8>,
}

/// `input` and `output` in new device memory on `stream`, waited for.
pub(crate) fn place<T: KitElement>(
    stream: &Arc<CudaStream>,
    input: &[T],
    output: &Pattern<'_, T>,
) -> Result<Buffers, CommError> {
    let b = Buffers {
        input: upload(stream, bytes_of(input))?,
        output: staged(stream, output)?,
    };
    sync(stream)?;
    Ok(b)
}

/// Host memory one upload of a pattern stages at a time: a rank need not
/// hold a second copy of a gigabyte output on the host to fill it.
pub(crate) const STAGE_BYTES: usize = 16 << 20;

/// `pattern` in new device memory on `stream` (at least one byte).
fn staged<T: KitElement>(
    stream: &Arc<CudaStream>,
    pattern: &Pattern<'_, T>,
) -> Result<CudaSlice<u8>, CommError> {
    let bytes = pattern.len() * std::mem::size_of::<T>();
    let mut slice = stream.alloc_zeros::<u8>(bytes.max(1)).map_err(backend)?;
    write_staged(stream, &mut slice, pattern)?;
    Ok(slice)
}

/// Write `pattern` over the start of `slice` through a staging chunk,
/// waiting for each upload before the chunk is written again.
fn write_staged<T: KitElement>(
    stream: &Arc<CudaStream>,
    slice: &mut CudaSlice<u8>,
    pattern: &Pattern<'_, T>,
) -> Result<(), CommError> {
    let size = std::mem::size_of::<T>();
    let per = (STAGE_BYTES / size).max(1);
    let mut host = vec![T::poison(); per.min(pattern.len())];
    for at in (0..pattern.len()).step_by(per) {
        let chunk = &mut host[..per.min(pattern.len() - at)];
        pattern.write(at, chunk);
        let bytes = bytes_of(chunk);
        let from = at * size;
        stream
            .memcpy_htod(bytes, &mut slice.slice_mut(from..from + bytes.len()))
            .map_err(backend)?;
        sync(stream)?;
    }
    Ok(())
}

/// Write `pattern` into the placed output (new memory where its length
/// changed), waited for.
pub(crate) fn rewrite<T: KitElement>(
    stream: &Arc<CudaStream>,
    b: &mut Buffers,
    pattern: &Pattern<'_, T>,
) -> Result<(), CommError> {
    let bytes = pattern.len() * std::mem::size_of::<T>();
    if b.output.len() == bytes.max(1) {
        write_staged(stream, &mut b.output, pattern)
    } else {
        // Freed first: device memory need not hold both.
        b.output = stream.alloc_zeros::<u8>(1).map_err(backend)?;
        b.output = staged(stream, pattern)?;
        sync(stream)
    }
}

/// A GPU backend's rank: the device API on its own stream.
pub(crate) trait DeviceRank: DeviceCommunicator
where
    CommError: From<Self::Error>,
{
    /// The rank's stream, where the bench enqueues its calls.
    fn rank_stream(&self) -> Arc<CudaStream>;
}

/// The call of a row on placed buffers.
fn device_call<T: KitElement>(
    b: &Buffers,
    stream: &CudaStream,
    collective: Collective,
    op: ReduceOp,
    in_place: bool,
    count: usize,
) -> DeviceCall {
    let (input, _i) = b.input.device_ptr(stream);
    let (output, _o) = b.output.device_ptr(stream);
    DeviceCall {
        collective,
        dtype: T::DATA_TYPE,
        count,
        input: (!in_place).then_some(input),
        output,
        op,
    }
}

/// Every GPU backend's rank is a bench rank the same way: buffers in
/// device memory on its stream, calls on the device API, timed there.
impl<C: DeviceRank + ferrocoll::comm::Communicator> super::run::BenchRank for C
where
    CommError: From<C::Error>,
{
    type Buffers<T: KitElement> = Buffers;

    fn place<T: KitElement>(
        &mut self,
        input: &Arc<ferrocoll::aligned::AlignedBuffer<T>>,
        output: &Pattern<'_, T>,
    ) -> Result<Buffers, CommError> {
        place(&self.rank_stream(), input, output)
    }

    fn rewrite<T: KitElement>(
        &mut self,
        b: &mut Buffers,
        output: &Pattern<'_, T>,
    ) -> Result<(), CommError> {
        rewrite(&self.rank_stream(), b, output)
    }

    fn collective<T: KitElement>(
        &mut self,
        b: &mut Buffers,
        collective: Collective,
        op: ReduceOp,
        in_place: bool,
        count: usize,
    ) -> Result<(), CommError> {
        call::<T, _>(self, b, collective, op, in_place, count)
    }

    fn timed<T: KitElement>(
        &mut self,
        b: &mut Buffers,
        collective: Collective,
        op: ReduceOp,
        in_place: bool,
        count: usize,
        iters: u32,
    ) -> Option<Result<Vec<f64>, CommError>> {
        Some(timed::<T, _>(
            self, b, collective, op, in_place, count, iters,
        ))
    }

    fn output<'b, T: KitElement>(&mut self, b: &'b Buffers) -> Result<Cow<'b, [T]>, CommError> {
        download(&self.rank_stream(), &b.output).map(Cow::Owned)
    }
}

/// One call, waited for (warm-up, the checked run).
fn call<T: KitElement, C: DeviceRank>(
    comm: &mut C,
    b: &Buffers,
    collective: Collective,
    op: ReduceOp,
    in_place: bool,
    count: usize,
) -> Result<(), CommError>
where
    CommError: From<C::Error>,
{
    let stream = comm.rank_stream();
    let call = device_call::<T>(b, &stream, collective, op, in_place, count);
    // SAFETY: `place` sized the buffers for this call's shape (the bench
    // computes `count` from the same lengths) on this rank's device;
    // nothing else uses them until the stream is waited for, below.
    unsafe { comm.enqueue(&call, &stream) }?;
    Ok(comm.synchronize(&stream)?)
}

/// `iters` calls timed nccl-tests' way: enqueued back to back on the
/// rank's stream, timed by CUDA events between them, one wait at the end.
/// Seconds of each call, as the device ran them.
fn timed<T: KitElement, C: DeviceRank>(
    comm: &mut C,
    b: &Buffers,
    collective: Collective,
    op: ReduceOp,
    in_place: bool,
    count: usize,
    iters: u32,
) -> Result<Vec<f64>, CommError>
where
    CommError: From<C::Error>,
{
    let stream = comm.rank_stream();
    let call = device_call::<T>(b, &stream, collective, op, in_place, count);
    let mut events = Events(stream.clone());
    let comm = std::cell::RefCell::new(comm);
    back_to_back(
        &mut events,
        iters,
        // SAFETY: as in `call`; the buffers stay placed until the wait.
        || Ok(unsafe { comm.borrow_mut().enqueue(&call, &stream) }?),
        || Ok(comm.borrow_mut().synchronize(&stream)?),
    )
}

/// What timing marks a device run records.
pub(crate) trait Clock {
    /// A mark.
    type Mark;
    /// A new mark, not yet recorded.
    fn make(&mut self) -> Result<Self::Mark, CommError>;
    /// Record `mark` behind the work enqueued so far.
    fn record(&mut self, mark: &Self::Mark) -> Result<(), CommError>;
    /// Seconds between two recorded marks, once both have passed.
    fn seconds(&self, from: &Self::Mark, to: &Self::Mark) -> Result<f64, CommError>;
}

/// Run `iters` calls back to back between marks — every mark made before
/// the first call, one recorded before it and one after each, and no
/// wait until the last is enqueued — then wait once and read each
/// call's time. The host's pace never enters the figures, only the
/// device's (a wait per call would add its own latency to each).
pub(crate) fn back_to_back<C: Clock>(
    clock: &mut C,
    iters: u32,
    mut call: impl FnMut() -> Result<(), CommError>,
    wait: impl FnOnce() -> Result<(), CommError>,
) -> Result<Vec<f64>, CommError> {
    let marks = (0..=iters)
        .map(|_| clock.make())
        .collect::<Result<Vec<_>, _>>()?;
    clock.record(&marks[0])?;
    for m in &marks[1..] {
        call()?;
        clock.record(m)?;
    }
    wait()?;
    marks
        .windows(2)
        .map(|w| clock.seconds(&w[0], &w[1]))
        .collect()
}

/// CUDA events on a stream (with timing).
struct Events(Arc<CudaStream>);

impl Clock for Events {
    type Mark = CudaEvent;

    fn make(&mut self) -> Result<CudaEvent, CommError> {
        self.0
            .context()
            .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(backend)
    }

    fn record(&mut self, mark: &CudaEvent) -> Result<(), CommError> {
        mark.record(&self.0).map_err(backend)
    }

    fn seconds(&self, from: &CudaEvent, to: &CudaEvent) -> Result<f64, CommError> {
        Ok(f64::from(from.elapsed_ms(to).map_err(backend)?) / 1e3)
    }
}

/// Device memory bandwidth of `device` as the bench's ceiling wants it:
/// bytes read plus written per second by a device-to-device copy of
/// 256 MiB (the copy rate twice over).
pub(crate) fn device_bandwidth(device: usize) -> Result<MemoryBandwidth, String> {
    let report = GpuProbe {
        devices: vec![device],
    }
    .measure(&ProbeOptions {
        bytes: 256 << 20,
        repeats: 5,
        p2p: true,
    })
    .map_err(|e| e.to_string())?;
    let traffic = 2.0 * report.unidirectional_gbps.get(0, 0);
    Ok(MemoryBandwidth {
        copy: traffic,
        nt_copy: None,
        accumulate: traffic,
        best: traffic,
        threads: 1,
    })
}

/// The device of each of `ranks` ranks, from `--devices` or round the
/// visible devices; a typed "unavailable" message without CUDA.
pub(crate) fn devices(ranks: u32, list: Option<&str>) -> Result<Vec<usize>, String> {
    let count = probe::available().map_err(|e| e.to_string())?;
    let given: Vec<usize> = match list {
        Some(s) => s
            .split(',')
            .map(|d| {
                d.trim()
                    .parse::<usize>()
                    .map_err(|_| format!("--devices: `{d}` is not a device number"))
            })
            .collect::<Result<_, _>>()?,
        None => (0..count).collect(),
    };
    if given.is_empty() {
        return Err("--devices is empty".into());
    }
    if let Some(bad) = given.iter().find(|&&d| d >= count) {
        return Err(format!(
            "--devices: device {bad} does not exist (this machine has {count})"
        ));
    }
    Ok((0..ranks as usize)
        .map(|r| given[r % given.len()])
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A clock that writes down what happens, in order, and says each
    /// call took as many milliseconds as its number.
    #[derive(Default)]
    struct Log(Vec<String>);

    impl Clock for Log {
        type Mark = usize;

        fn make(&mut self) -> Result<usize, CommError> {
            self.0.push("make".into());
            Ok(self.0.iter().filter(|e| *e == "make").count() - 1)
        }

        fn record(&mut self, mark: &usize) -> Result<(), CommError> {
            self.0.push(format!("mark {mark}"));
            Ok(())
        }

        fn seconds(&self, from: &usize, to: &usize) -> Result<f64, CommError> {
            Ok((to * to - from * from) as f64 / 2e3)
        }
    }

    #[test]
    fn calls_are_enqueued_back_to_back_and_waited_for_once() {
        let log = std::cell::RefCell::new(Log::default());
        let mut clock = Log::default();
        let times = back_to_back(
            &mut clock,
            3,
            || {
                log.borrow_mut().0.push("call".into());
                Ok(())
            },
            || {
                log.borrow_mut().0.push("wait".into());
                Ok(())
            },
        )
        .unwrap();
        assert_eq!(
            clock.0,
            [
                "make", "make", "make", "make", "mark 0", "mark 1", "mark 2", "mark 3"
            ]
        );
        assert_eq!(log.borrow().0, ["call", "call", "call", "wait"]);
        // Per call: marks 0-1, 1-2, 2-3.
        assert_eq!(times, [0.5e-3, 1.5e-3, 2.5e-3]);
        // A failing call stops the run before its wait.
        let waited = std::cell::Cell::new(false);
        let r = back_to_back(
            &mut Log::default(),
            3,
            || Err(CommError::Unsupported { what: "x".into() }),
            || {
                waited.set(true);
                Ok(())
            },
        );
        assert!(r.is_err() && !waited.get());
    }
}
