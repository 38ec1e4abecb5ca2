//! Max-min fair sharing of resources among concurrent flows.
//!
//! Each flow crosses some resources (links, a memory, a pool of cores) with
//! a weight: a copy staged in host memory uses that memory twice, once to
//! land and once to leave. Progressive filling raises every unfrozen flow's
//! rate together until some resource is full, freezes the flows on it, and
//! repeats; the result is the max-min fair allocation, which is what
//! credit-based links shared by equal-priority streams converge to.

/// One flow's resources: `(resource index, weight)`.
pub(crate) type Uses = Vec<(usize, f64)>;

/// Rates (bytes per µs, like the capacities) of `flows` over resources of
/// `capacity`. A flow that uses no resource gets `f64::INFINITY`.
pub(crate) fn rates(capacity: &[f64], flows: &[&Uses]) -> Vec<f64> {
    let mut rate = vec![0.0; flows.len()];
    let mut frozen: Vec<bool> = flows.iter().map(|f| f.is_empty()).collect();
    for (i, f) in flows.iter().enumerate() {
        if f.is_empty() {
            rate[i] = f64::INFINITY;
        }
    }
    let mut left = capacity.to_vec();
    let mut weight = vec![0.0; capacity.len()];
    loop {
        weight.iter_mut().for_each(|w| *w = 0.0);
        for (i, f) in flows.iter().enumerate() {
            if !frozen[i] {
                for &(r, w) in f.iter() {
                    weight[r] += w;
                }
            }
        }
        // The resource that fills first, and how far every flow rises.
        let Some((tightest, step)) = (0..capacity.len())
            .filter(|&r| weight[r] > 0.0)
            .map(|r| (r, left[r].max(0.0) / weight[r]))
            .min_by(|a, b| a.1.total_cmp(&b.1))
        else {
            break;
        };
        for r in 0..capacity.len() {
            left[r] -= step * weight[r];
        }
        for (r, &fz) in rate.iter_mut().zip(&frozen) {
            if !fz {
                *r += step;
            }
        }
        // Freeze every flow on a resource that is now full: the tightest
        // one by construction (rounding must not leave it open, or flows
        // elsewhere would stop rising), and any other within rounding.
        let full = |r: usize| weight[r] > 0.0 && (r == tightest || left[r] <= capacity[r] * 1e-9);
        let mut any = false;
        for (i, f) in flows.iter().enumerate() {
            if !frozen[i] && f.iter().any(|&(r, _)| full(r)) {
                frozen[i] = true;
                any = true;
            }
        }
        if !any {
            break;
        }
    }
    rate
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shared_link_is_split_and_leftovers_go_to_the_rest() {
        // Flows 0 and 1 share resource 0 (10); flow 1 also crosses resource
        // 1 (2), so it is held to 2 and flow 0 takes the other 8.
        let a: Uses = vec![(0, 1.0)];
        let b: Uses = vec![(0, 1.0), (1, 1.0)];
        let r = rates(&[10.0, 2.0], &[&a, &b]);
        assert!(
            (r[0] - 8.0).abs() < 1e-9 && (r[1] - 2.0).abs() < 1e-9,
            "{r:?}"
        );
        // Equal flows on one link halve it.
        let r = rates(&[10.0], &[&a, &a]);
        assert_eq!(r, vec![5.0, 5.0]);
        // Weight 2 (staged copy) counts twice.
        let staged: Uses = vec![(0, 2.0)];
        let r = rates(&[10.0], &[&staged]);
        assert_eq!(r, vec![5.0]);
        let none: Uses = vec![];
        assert_eq!(rates(&[1.0], &[&none]), vec![f64::INFINITY]);
    }
}
