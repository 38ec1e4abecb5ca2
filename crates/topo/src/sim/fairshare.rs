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
#[cfg(test)]
pub(crate) fn rates(capacity: &[f64], flows: &[&Uses]) -> Vec<f64> {
    let mut rate = Vec::new();
    Scratch::default().rates(capacity, flows, &mut rate);
    rate
}

/// The working memory of [`Scratch::rates`], kept between calls: a run
/// recomputes the shares at every flow's start and end.
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    /// Resource → its dense number among those in use (`usize::MAX`: none).
    dense: Vec<usize>,
    /// Dense number → resource.
    id: Vec<usize>,
    weight: Vec<f64>,
    left: Vec<f64>,
    /// Unfrozen flows on each resource; a resource closes at zero.
    count: Vec<usize>,
    /// The flows of dense resource `d`: `members[start[d]..start[d + 1]]`.
    start: Vec<usize>,
    members: Vec<usize>,
    open: Vec<usize>,
    frozen: Vec<bool>,
}

impl Scratch {
    /// Progressive filling into `rate` (one per flow). Only the resources
    /// some flow crosses take part, each with the list of its flows, so a
    /// round costs the open resources and freezing a flow its own uses.
    /// Runs fill in a few rounds (the links saturate together), so a heap
    /// of fill levels was tried and lost: it pays a logarithm per use.
    pub(crate) fn rates(&mut self, capacity: &[f64], flows: &[&Uses], rate: &mut Vec<f64>) {
        self.index(capacity, flows);
        rate.clear();
        rate.resize(flows.len(), f64::INFINITY);
        let mut level = 0.0;
        while !self.open.is_empty() {
            // The resource that fills first, and how far every flow rises.
            let (mut tightest, mut step) = (usize::MAX, f64::INFINITY);
            for &d in &self.open {
                let s = self.left[d].max(0.0) / self.weight[d];
                if s < step {
                    (tightest, step) = (d, s);
                }
            }
            if tightest == usize::MAX {
                break;
            }
            for &d in &self.open {
                self.left[d] -= step * self.weight[d];
            }
            level += step;
            // Freeze every flow on a resource that is now full: the
            // tightest one by construction (rounding must not leave it
            // open, or flows elsewhere would stop rising), and any other
            // within rounding.
            for k in 0..self.open.len() {
                let d = self.open[k];
                if d == tightest || self.left[d] <= capacity[self.id[d]] * 1e-9 {
                    self.freeze(d, flows, rate, level);
                }
            }
            let (count, weight) = (&self.count, &self.weight);
            self.open.retain(|&d| count[d] > 0 && weight[d] > 0.0);
        }
        for (r, fz) in rate.iter_mut().zip(&self.frozen) {
            if !fz {
                *r = level;
            }
        }
        for &r in &self.id {
            self.dense[r] = usize::MAX;
        }
    }

    /// Number the resources in use and list each one's flows.
    fn index(&mut self, capacity: &[f64], flows: &[&Uses]) {
        self.dense.resize(capacity.len(), usize::MAX);
        self.id.clear();
        self.weight.clear();
        self.count.clear();
        for f in flows {
            for &(r, w) in f.iter() {
                if self.dense[r] == usize::MAX {
                    self.dense[r] = self.id.len();
                    self.id.push(r);
                    self.weight.push(0.0);
                    self.count.push(0);
                }
                self.weight[self.dense[r]] += w;
                self.count[self.dense[r]] += 1;
            }
        }
        self.start.clear();
        self.start.push(0);
        for &c in &self.count {
            let last = *self.start.last().expect("starts at 0");
            self.start.push(last + c);
        }
        self.members.clear();
        self.members
            .resize(*self.start.last().expect("starts at 0"), 0);
        let mut fill = self.start.clone();
        for (i, f) in flows.iter().enumerate() {
            for &(r, _) in f.iter() {
                let d = self.dense[r];
                self.members[fill[d]] = i;
                fill[d] += 1;
            }
        }
        self.left.clear();
        self.left.extend(self.id.iter().map(|&r| capacity[r]));
        self.frozen.clear();
        self.frozen.extend(flows.iter().map(|f| f.is_empty()));
        self.open.clear();
        self.open
            .extend((0..self.id.len()).filter(|&d| self.weight[d] > 0.0));
    }

    /// Freeze the unfrozen flows of dense resource `d` at `level`.
    fn freeze(&mut self, d: usize, flows: &[&Uses], rate: &mut [f64], level: f64) {
        for k in self.start[d]..self.start[d + 1] {
            let i = self.members[k];
            if self.frozen[i] {
                continue;
            }
            self.frozen[i] = true;
            rate[i] = level;
            for &(r, w) in flows[i].iter() {
                let e = self.dense[r];
                self.weight[e] -= w;
                self.count[e] -= 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The plain progressive filling, every round over every flow and
    /// resource: the reference the indexed version must equal.
    fn old_rates(capacity: &[f64], flows: &[&Uses]) -> Vec<f64> {
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
            let full =
                |r: usize| weight[r] > 0.0 && (r == tightest || left[r] <= capacity[r] * 1e-9);
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

    #[test]
    fn equals_plain_progressive_filling() {
        let mut seed = 1u64;
        let mut next = |m: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % m
        };
        for _ in 0..2000 {
            let resources = 1 + next(12) as usize;
            let capacity: Vec<f64> = (0..resources).map(|_| 1.0 + next(100) as f64).collect();
            let flows: Vec<Uses> = (0..next(15))
                .map(|_| {
                    let mut u: Uses = Vec::new();
                    for r in 0..resources {
                        if next(3) == 0 {
                            u.push((r, if next(4) == 0 { 2.0 } else { 1.0 }));
                        }
                    }
                    u
                })
                .collect();
            let refs: Vec<&Uses> = flows.iter().collect();
            let (a, b) = (rates(&capacity, &refs), old_rates(&capacity, &refs));
            for (x, y) in a.iter().zip(&b) {
                assert!(
                    x == y || (x - y).abs() <= 1e-7 * y.abs(),
                    "{a:?} vs {b:?}\n{capacity:?}\n{flows:?}"
                );
            }
        }
    }

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
