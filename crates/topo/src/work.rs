//! A budget of work for the topology tools: simulated instructions and
//! search steps, counted as they happen, so a question too large for the
//! machine (every algorithm on 64 GPUs at 19 sizes, a thousand-GPU
//! topology) ends with [`TopologyError::Budget`] saying so instead of
//! running for hours or until memory runs out.
//!
//! The meter is per thread and off by default: library calls run
//! unmetered, and a tool opts in with [`within`] around what it asks. The
//! count is of work, not time, so the same question gets the same answer
//! on every machine.

use std::cell::Cell;

use crate::error::TopologyError;

thread_local! {
    /// (spent, limit) while a budget applies on this thread.
    static METER: Cell<Option<(u64, u64)>> = const { Cell::new(None) };
}

/// Run `f` with a budget of `limit` units on this thread (nested budgets
/// replace the outer one until they end); returns `f`'s result and the
/// units it spent.
pub fn within<R>(limit: u64, f: impl FnOnce() -> R) -> (R, u64) {
    let outer = METER.with(|m| m.replace(Some((0, limit))));
    let result = f();
    let spent = METER
        .with(|m| m.replace(outer))
        .map_or(0, |(spent, _)| spent);
    (result, spent)
}

/// Count `units` of work; `Err` once the budget (if any) is spent.
pub(crate) fn charge(units: u64) -> Result<(), TopologyError> {
    METER.with(|m| match m.get() {
        None => Ok(()),
        Some((spent, limit)) => {
            let spent = spent.saturating_add(units);
            m.set(Some((spent, limit)));
            if spent > limit {
                Err(TopologyError::Budget { limit })
            } else {
                Ok(())
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_counts_within_its_scope_only() {
        assert!(charge(u64::MAX).is_ok(), "unmetered by default");
        let (r, spent) = within(10, || {
            charge(4)?;
            charge(6)?;
            charge(1)
        });
        assert_eq!(spent, 11);
        assert_eq!(r, Err(TopologyError::Budget { limit: 10 }));
        assert!(charge(u64::MAX).is_ok(), "the budget ended with its scope");
    }
}
