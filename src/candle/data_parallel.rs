//! DDP's gradient sync for candle models: replicas start from rank 0's
//! parameters, and after each backward pass every gradient is averaged
//! across the ranks, bucket by bucket ([`GradientSync`]).

use candle_core::backprop::GradStore;
use candle_core::{Device, Storage, Tensor, Var, WithDType};

use super::{CandleError, host};
use crate::comm::{AsyncCommunicator, Communicator, CommunicatorExt};
use crate::grad_sync::GradientSync;
use crate::{Reduce, ReduceOp};

/// Data-parallel training of one model's parameters (all of dtype `T`, on
/// the CPU) over a communicator: [`new`](Self::new) broadcasts rank 0's
/// parameters, [`sync`](Self::sync) averages the gradients of one step.
///
/// Every rank must pass the same parameters in the same order (their
/// lengths and the bucket size are compared across ranks at `new`; a
/// difference is an error on every rank). A parameter without a gradient
/// on some rank (unused in its step) counts as zeros there, so the calls
/// stay the same on every rank.
pub struct DataParallel<T: Reduce + WithDType + Default, C: Communicator + Send + 'static> {
    vars: Vec<Var>,
    sync: GradientSync<T, C>,
}

impl<T: Reduce + WithDType + Default, C: Communicator + Send + 'static> DataParallel<T, C> {
    /// Take `vars` (forward order) over `comm`: check them, copy rank 0's
    /// values into every rank's, and lay out buckets of about
    /// `bucket_bytes` (PyTorch's default is 25 MiB).
    pub fn new(mut comm: C, vars: Vec<Var>, bucket_bytes: usize) -> Result<Self, CandleError> {
        let refused = vars.iter().enumerate().find_map(|(i, var)| {
            (!var.device().is_cpu() || var.dtype() != T::DTYPE).then(|| {
                CandleError::Unsupported(format!(
                    "parameter {i} is {:?} on {:?}; this DataParallel takes {:?} on the CPU",
                    var.dtype(),
                    var.device().location(),
                    T::DTYPE
                ))
            })
        });
        // Every rank learns whether any refused, before any collective on
        // the parameters: a refusal on one rank fails them all at once.
        let mut ok = [u64::from(refused.is_none())];
        comm.all_reduce_in_place(&mut ok, ReduceOp::Min)?;
        if let Some(e) = refused {
            return Err(e);
        }
        if ok[0] == 0 {
            return Err(CandleError::Unsupported(
                "another rank refused its parameters (see its error)".into(),
            ));
        }
        // Lengths and bucket size agree across ranks (or every rank fails)
        // before rank 0's values are copied in.
        let lens: Vec<usize> = vars.iter().map(|v| v.elem_count()).collect();
        let mut sync = GradientSync::new(AsyncCommunicator::new(comm)?, &lens, bucket_bytes)?;
        for var in &vars {
            host::broadcast(sync.communicator(), var.as_tensor(), 0)?;
        }
        Ok(DataParallel { vars, sync })
    }

    /// The model's parameters of a candle-nn [`VarMap`](candle_nn::VarMap),
    /// in name order — the map's own order differs from process to
    /// process, and every rank must list them alike.
    #[cfg(feature = "candle-nn")]
    pub fn from_var_map(
        comm: C,
        vars: &candle_nn::VarMap,
        bucket_bytes: usize,
    ) -> Result<Self, CandleError> {
        let mut named: Vec<(String, Var)> = vars
            .data()
            .lock()
            .map_err(|_| CandleError::Unsupported("the VarMap's lock is poisoned".into()))?
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        named.sort_by(|a, b| a.0.cmp(&b.0));
        Self::new(
            comm,
            named.into_iter().map(|(_, v)| v).collect(),
            bucket_bytes,
        )
    }

    /// The parameters, in the order given.
    pub fn vars(&self) -> &[Var] {
        &self.vars
    }

    /// Replace every parameter's gradient in `grads` by its average
    /// across the ranks ([`ReduceOp::Avg`]). Gradients are handed over
    /// last parameter first, the order backward produces them, so the
    /// first bucket's all-reduce runs while the rest are copied in. A
    /// parameter no rank has a gradient for (unused everywhere, or frozen)
    /// is left without one, as DDP leaves it, so optimizers skip it.
    pub fn sync(&mut self, grads: &mut GradStore) -> Result<(), CandleError> {
        let mut used: Vec<u8> = self
            .vars
            .iter()
            .map(|v| u8::from(grads.get(v.as_tensor()).is_some()))
            .collect();
        // Which parameters any rank used (unused everywhere: no gradient).
        self.sync
            .communicator()
            .all_reduce_in_place(&mut used, ReduceOp::Max)?;
        let mut first_error = None;
        for (i, var) in self.vars.iter().enumerate().rev() {
            let marked = match grads.get(var.as_tensor()) {
                Some(g) => mark(&mut self.sync, i, g),
                None => {
                    let zeros = self
                        .sync
                        .gradient_to_overwrite(i)
                        .map(|b| b.fill(T::default()));
                    zeros
                        .and_then(|()| self.sync.mark_ready_in_place(i))
                        .map_err(Into::into)
                }
            };
            if let Err(e) = marked {
                first_error.get_or_insert(e);
            }
        }
        // Every bucket runs even after a local error, so peers are not
        // left waiting; the step is then invalid everywhere.
        let finished = self.sync.finish();
        if let Some(e) = first_error {
            return Err(e);
        }
        finished?;
        for (i, var) in self.vars.iter().enumerate() {
            if used[i] == 0 {
                continue;
            }
            let avg = self.sync.gradient(i).ok_or_else(|| {
                CandleError::Unsupported(format!("parameter {i} has no synced gradient"))
            })?;
            let t = Tensor::from_slice(avg, var.shape(), &Device::Cpu)?;
            grads.insert(var.as_tensor(), t);
        }
        Ok(())
    }

    /// The communicator the gradients are averaged over (for a barrier or
    /// a metric's all-reduce between steps).
    pub fn communicator(&mut self) -> &mut AsyncCommunicator<C> {
        self.sync.communicator()
    }

    /// Average a metric (a loss, an accuracy) across the ranks, in place.
    pub fn average(&mut self, tensor: &Tensor) -> Result<(), CandleError> {
        host::all_reduce(self.sync.communicator(), tensor, ReduceOp::Avg)
    }
}

/// Copy gradient `g` of parameter `i` into its bucket and mark it ready.
fn mark<T: Reduce + WithDType + Default, C: Communicator + Send + 'static>(
    sync: &mut GradientSync<T, C>,
    i: usize,
    g: &Tensor,
) -> Result<(), CandleError> {
    let g = g.contiguous()?;
    let (storage, layout) = g.storage_and_layout();
    let Storage::Cpu(cpu) = &*storage else {
        return Err(CandleError::Unsupported(format!(
            "the gradient of parameter {i} is not on the CPU"
        )));
    };
    let all = T::cpu_storage_as_slice(cpu)?;
    let (start, end) = layout
        .contiguous_offsets()
        .expect("`contiguous` made it contiguous");
    Ok(sync.mark_ready(i, &all[start..end])?)
}
