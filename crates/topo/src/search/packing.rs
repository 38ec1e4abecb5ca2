//! Packing rings into the link graph: the widest ring (the one whose
//! busiest resource has the most capacity left) at its full rate, then
//! again on what is left, until no ring has capacity; each ring then runs
//! on as many channels as its rate is multiple of the slowest one's, since
//! every channel carries an equal share of the data.
//!
//! The widest Hamiltonian cycle is found exactly by dynamic programming
//! over subsets (rank 0 first), `O(2^n · n²)`: up to
//! [`PACKING_MAX_RANKS`] ranks. The width of an edge is what its busiest
//! resource has left over what the edge puts on it; a ring's rate is then
//! computed exactly, counting resources its edges share.

use ferrocoll_core::Rank;

use super::costs::{Costs, RingSet};

/// Up to this many ranks rings are packed (`2^12 · 144` steps per ring).
pub const PACKING_MAX_RANKS: usize = 12;

/// A ring whose rate is below this fraction of the first's ends the
/// packing: too slow to be worth a channel.
const SLOWEST_WORTH_KEEPING: f64 = 0.05;

/// The packing of rings on `costs`, at most `max_rings` channels; `None`
/// below 3 or above [`PACKING_MAX_RANKS`] ranks, or where no ring has
/// capacity.
pub(super) fn pack(costs: &Costs, max_rings: usize) -> Option<RingSet> {
    let n = costs.n;
    if !(3..=PACKING_MAX_RANKS).contains(&n) || max_rings < 2 {
        return None;
    }
    let mut left = costs.capacity.clone();
    let mut rings: Vec<(Vec<Rank>, f64)> = Vec::new();
    let mut candidates = 0;
    while rings.len() < max_rings {
        let Some((order, scored)) = widest_ring(costs, &left) else {
            break;
        };
        candidates += scored;
        let rate = ring_rate(costs, &left, &order);
        let first = rings.first().map_or(rate, |r| r.1);
        if !(rate.is_finite() && rate > first * SLOWEST_WORTH_KEEPING) {
            break;
        }
        for (r, w) in ring_use(costs, &order) {
            left[r] -= rate * w;
        }
        rings.push((order, rate));
    }
    // Slow rings last: the best set is some prefix (a slow ring's single
    // channel still takes an equal share of the data).
    (1..=rings.len())
        .map(|k| {
            let orders = channels(&rings[..k], max_rings);
            let bandwidth = set_bandwidth(costs, &orders);
            RingSet {
                orders,
                bandwidth,
                candidates,
            }
        })
        // Equal bandwidth: the fewer channels.
        .fold(None, |best: Option<RingSet>, set| match best {
            Some(b) if b.bandwidth >= set.bandwidth => Some(b),
            _ => Some(set),
        })
}

/// What `orders` move per second together, each carrying an equal share,
/// GB/s (as [`RingSet::bandwidth`]).
fn set_bandwidth(costs: &Costs, orders: &[Vec<Rank>]) -> f64 {
    let mut load = vec![0.0; costs.capacity.len()];
    for o in orders {
        costs.add(&mut load, o);
    }
    let worst = costs.worst(&load);
    if worst == 0.0 {
        f64::INFINITY
    } else {
        orders.len() as f64 / worst / 1e3
    }
}

/// Each ring repeated in proportion to its rate (the slowest once), the
/// whole scaled down to fit `max_rings`.
fn channels(rings: &[(Vec<Rank>, f64)], max_rings: usize) -> Vec<Vec<Rank>> {
    let slowest = rings.iter().map(|r| r.1).fold(f64::INFINITY, f64::min);
    let mut copies: Vec<usize> = rings
        .iter()
        .map(|r| ((r.1 / slowest).round() as usize).max(1))
        .collect();
    while copies.iter().sum::<usize>() > max_rings {
        let most = (0..copies.len()).max_by_key(|&i| copies[i]).expect("rings");
        if copies[most] == 1 {
            // One channel each is still too many: keep the fastest rings.
            copies.truncate(max_rings);
            break;
        }
        copies[most] -= 1;
    }
    rings
        .iter()
        .zip(&copies)
        .flat_map(|((o, _), &k)| std::iter::repeat_n(o.clone(), k))
        .collect()
}

/// Per resource, the weight ring `order` puts on it (summed over edges).
fn ring_use(costs: &Costs, order: &[Rank]) -> Vec<(usize, f64)> {
    let mut used: Vec<(usize, f64)> = Vec::new();
    for i in 0..order.len() {
        for &(r, w) in costs.edge(order[i], order[(i + 1) % order.len()]) {
            match used.iter_mut().find(|u| u.0 == r) {
                Some(u) => u.1 += w,
                None => used.push((r, w)),
            }
        }
    }
    used
}

/// The rate ring `order` can run at on what is `left` (bytes per µs of
/// each unit of weight).
fn ring_rate(costs: &Costs, left: &[f64], order: &[Rank]) -> f64 {
    ring_use(costs, order)
        .iter()
        .map(|&(r, w)| left[r].max(0.0) / w)
        .fold(f64::INFINITY, f64::min)
}

/// The width of edge `a → b`: what its tightest resource has left over
/// the weight the edge puts on it.
fn edge_width(costs: &Costs, left: &[f64], a: usize, b: usize) -> f64 {
    costs
        .edge(a as Rank, b as Rank)
        .iter()
        .map(|&(r, w)| left[r].max(0.0) / w)
        .fold(f64::INFINITY, f64::min)
}

/// The Hamiltonian cycle (rank 0 first) whose narrowest edge is widest,
/// and the states scored; `None` when every cycle has a full edge.
fn widest_ring(costs: &Costs, left: &[f64]) -> Option<(Vec<Rank>, u64)> {
    let n = costs.n;
    let width: Vec<f64> = (0..n * n)
        .map(|i| {
            let (a, b) = (i / n, i % n);
            if a == b {
                0.0
            } else {
                edge_width(costs, left, a, b)
            }
        })
        .collect();
    let full = 1usize << n;
    // best[mask][v]: the widest path from 0 through `mask` ending at v.
    let mut best = vec![-1.0f64; full * n];
    let mut parent = vec![usize::MAX; full * n];
    best[n] = f64::INFINITY; // mask {0}, at rank 0
    let mut scored = 0u64;
    for mask in 1..full {
        if mask & 1 == 0 {
            continue;
        }
        for v in 0..n {
            let here = best[mask * n + v];
            if here < 0.0 {
                continue;
            }
            for u in 1..n {
                if mask & (1 << u) != 0 {
                    continue;
                }
                scored += 1;
                let w = here.min(width[v * n + u]);
                let at = (mask | 1 << u) * n + u;
                if w > best[at] {
                    best[at] = w;
                    parent[at] = v;
                }
            }
        }
    }
    let all = full - 1;
    let (last, w) = (1..n)
        .map(|v| (v, best[all * n + v].min(width[v * n])))
        .max_by(|a, b| a.1.total_cmp(&b.1))?;
    if w <= 0.0 {
        return None;
    }
    let mut order = Vec::with_capacity(n);
    let (mut mask, mut v) = (all, last);
    while v != usize::MAX && v != 0 {
        order.push(v as Rank);
        let p = parent[mask * n + v];
        mask &= !(1 << v);
        v = p;
    }
    order.push(0);
    order.reverse();
    (order.len() == n).then_some((order, scored))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::presets;
    use crate::sim::CostModel;

    fn costs_of(name: &str, keep: &[usize]) -> Costs {
        let t = presets::by_name(name, 0).unwrap();
        let t = t.with_devices(keep).unwrap();
        Costs::new(&t, &t.devices(), &CostModel::default()).unwrap()
    }

    /// The DGX-1V's six NVLink bricks per GPU: the NVLink-2 cycle twice in
    /// each direction and the NVLink-1 cycle once in each, 120 GB/s — the
    /// graph's bound, where the greedy search stops at two rings (80).
    #[test]
    fn six_rings_fill_a_dgx1() {
        let c = costs_of("dgx1-v100", &[0, 1, 2, 3, 4, 5, 6, 7]);
        let p = pack(&c, 8).unwrap();
        assert!((p.bandwidth - 120.0).abs() < 1e-6, "{p:?}");
        assert_eq!(p.orders.len(), 6, "{p:?}");
    }
}
