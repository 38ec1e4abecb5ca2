//! Maximum flow on a small directed graph with real capacities (Dinic's
//! algorithm), and the minimum cut it leaves behind.

/// A flow network: nodes `0..n`, edges added in pairs (forward and its
/// residual reverse).
#[derive(Debug, Clone)]
pub(crate) struct FlowNet {
    /// `(to, capacity left)` per edge; edge `e ^ 1` is its reverse.
    edges: Vec<(usize, f64)>,
    adjacent: Vec<Vec<usize>>,
}

/// Capacities below this count as used up (they are sums of GB/s rates).
const EPSILON: f64 = 1e-9;

impl FlowNet {
    pub fn new(nodes: usize) -> Self {
        FlowNet {
            edges: Vec::new(),
            adjacent: vec![Vec::new(); nodes],
        }
    }

    pub fn add_edge(&mut self, from: usize, to: usize, capacity: f64) {
        self.adjacent[from].push(self.edges.len());
        self.edges.push((to, capacity));
        self.adjacent[to].push(self.edges.len());
        self.edges.push((from, 0.0));
    }

    /// Push as much as possible from `s` to `t`; the residual network is
    /// kept, so [`reachable`](Self::reachable) then gives the minimum cut.
    pub fn max_flow(&mut self, s: usize, t: usize) -> f64 {
        let mut total = 0.0;
        while let Some(level) = self.levels(s, t) {
            let mut next = vec![0usize; self.adjacent.len()];
            loop {
                let pushed = self.augment(s, t, f64::INFINITY, &level, &mut next);
                if pushed <= EPSILON {
                    break;
                }
                total += pushed;
            }
        }
        total
    }

    /// Nodes reachable from `s` through edges with capacity left.
    pub fn reachable(&self, s: usize) -> Vec<bool> {
        let mut seen = vec![false; self.adjacent.len()];
        let mut stack = vec![s];
        seen[s] = true;
        while let Some(u) = stack.pop() {
            for &e in &self.adjacent[u] {
                let (v, cap) = self.edges[e];
                if cap > EPSILON && !seen[v] {
                    seen[v] = true;
                    stack.push(v);
                }
            }
        }
        seen
    }

    /// Breadth-first levels from `s`; `None` once `t` is out of reach.
    fn levels(&self, s: usize, t: usize) -> Option<Vec<usize>> {
        let mut level = vec![usize::MAX; self.adjacent.len()];
        level[s] = 0;
        let mut queue = std::collections::VecDeque::from([s]);
        while let Some(u) = queue.pop_front() {
            for &e in &self.adjacent[u] {
                let (v, cap) = self.edges[e];
                if cap > EPSILON && level[v] == usize::MAX {
                    level[v] = level[u] + 1;
                    queue.push_back(v);
                }
            }
        }
        (level[t] != usize::MAX).then_some(level)
    }

    /// One blocking-flow push along level-increasing edges (iterative
    /// depth-first search, so a deep graph cannot overflow the stack).
    fn augment(
        &mut self,
        s: usize,
        t: usize,
        limit: f64,
        level: &[usize],
        next: &mut [usize],
    ) -> f64 {
        let mut path: Vec<usize> = Vec::new();
        let mut u = s;
        loop {
            if u == t {
                let pushed = path.iter().map(|&e| self.edges[e].1).fold(limit, f64::min);
                for &e in &path {
                    self.edges[e].1 -= pushed;
                    self.edges[e ^ 1].1 += pushed;
                }
                return pushed;
            }
            let mut advanced = false;
            while next[u] < self.adjacent[u].len() {
                let e = self.adjacent[u][next[u]];
                let (v, cap) = self.edges[e];
                if cap > EPSILON && level[v] == level[u] + 1 {
                    path.push(e);
                    u = v;
                    advanced = true;
                    break;
                }
                next[u] += 1;
            }
            if advanced {
                continue;
            }
            // Dead end: retreat and never try this node again this phase.
            let Some(e) = path.pop() else {
                return 0.0;
            };
            u = self.edges[e ^ 1].0;
            next[u] += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_textbook_network_carries_its_min_cut() {
        // Two paths of 3 and 2 sharing nothing, plus a cross edge.
        let mut f = FlowNet::new(4);
        f.add_edge(0, 1, 3.0);
        f.add_edge(0, 2, 2.0);
        f.add_edge(1, 2, 5.0);
        f.add_edge(1, 3, 2.0);
        f.add_edge(2, 3, 3.0);
        assert!((f.max_flow(0, 3) - 5.0).abs() < 1e-9);
        let side = f.reachable(0);
        assert!(side[0] && !side[3]);
        let mut g = FlowNet::new(3);
        g.add_edge(0, 1, 1.5);
        assert_eq!(g.max_flow(0, 2), 0.0, "no path, no flow");
    }
}
