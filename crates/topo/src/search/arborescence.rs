//! The cheapest spanning arborescence (directed spanning tree) rooted at a
//! given node — Chu–Liu/Edmonds: every node takes its cheapest incoming
//! edge; where those edges close cycles, each cycle becomes one node whose
//! incoming edges cost what they would save over the cycle's own, and the
//! smaller graph is solved the same way. `O(V · E)`; dense graphs of up to
//! a few dozen ranks here.

/// One directed edge and its cost.
#[derive(Debug, Clone, Copy)]
struct Edge {
    from: usize,
    to: usize,
    cost: f64,
}

/// The parent of every node in the cheapest arborescence rooted at `root`
/// of the graph on `n` nodes whose edge `a → b` costs `cost[a * n + b]`
/// (infinite: no edge); `None` for the root. `None` when some node cannot
/// be reached.
pub(super) fn cheapest(n: usize, cost: &[f64], root: usize) -> Option<Vec<Option<usize>>> {
    let edges: Vec<Edge> = (0..n)
        .flat_map(|a| (0..n).map(move |b| (a, b)))
        .filter(|&(a, b)| a != b && b != root && cost[a * n + b].is_finite())
        .map(|(a, b)| Edge {
            from: a,
            to: b,
            cost: cost[a * n + b],
        })
        .collect();
    let chosen = solve(n, root, &edges)?;
    let mut parent = vec![None; n];
    for (v, e) in chosen.into_iter().enumerate() {
        if let Some(e) = e {
            parent[v] = Some(edges[e].from);
        }
    }
    Some(parent)
}

/// The edge (index into `edges`) each node but the root takes.
fn solve(n: usize, root: usize, edges: &[Edge]) -> Option<Vec<Option<usize>>> {
    let mut best: Vec<Option<usize>> = vec![None; n];
    for (i, e) in edges.iter().enumerate() {
        if e.to != root && best[e.to].is_none_or(|b| e.cost < edges[b].cost) {
            best[e.to] = Some(i);
        }
    }
    if (0..n).any(|v| v != root && best[v].is_none()) {
        return None;
    }
    let (group, groups, cyclic) = contract(n, root, edges, &best);
    if !cyclic {
        return Some(best);
    }
    // Entering a cycle at v replaces v's cheapest edge: it costs the rest.
    let mut smaller = Vec::new();
    let mut origin = Vec::new();
    for (i, e) in edges.iter().enumerate() {
        let (a, b) = (group[e.from], group[e.to]);
        if a != b {
            let saved = best[e.to].map_or(0.0, |x| edges[x].cost);
            smaller.push(Edge {
                from: a,
                to: b,
                cost: e.cost - saved,
            });
            origin.push(i);
        }
    }
    let inner = solve(groups, group[root], &smaller)?;
    let mut chosen = best;
    for e in inner.into_iter().flatten() {
        let original = origin[e];
        chosen[edges[original].to] = Some(original);
    }
    Some(chosen)
}

/// Each node's group: one per cycle of the cheapest edges, one for every
/// other node; the number of groups; whether there was a cycle.
fn contract(
    n: usize,
    root: usize,
    edges: &[Edge],
    best: &[Option<usize>],
) -> (Vec<usize>, usize, bool) {
    const NONE: usize = usize::MAX;
    let mut group = vec![NONE; n];
    let mut seen = vec![NONE; n];
    let mut groups = 0;
    for start in 0..n {
        let mut v = start;
        while v != root && seen[v] == NONE && group[v] == NONE {
            seen[v] = start;
            v = edges[best[v].expect("checked")].from;
        }
        if v != root && group[v] == NONE && seen[v] == start {
            // A new cycle through v.
            let mut u = v;
            loop {
                group[u] = groups;
                u = edges[best[u].expect("checked")].from;
                if u == v {
                    break;
                }
            }
            groups += 1;
        }
    }
    let cyclic = groups > 0;
    for g in group.iter_mut() {
        if *g == NONE {
            *g = groups;
            groups += 1;
        }
    }
    (group, groups, cyclic)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every arborescence rooted at `root`, by brute force over parent
    /// choices; the cheapest cost.
    fn brute(n: usize, cost: &[f64], root: usize) -> f64 {
        let others: Vec<usize> = (0..n).filter(|&v| v != root).collect();
        let mut best = f64::INFINITY;
        let total = (n as u64).pow(others.len() as u32);
        for code in 0..total {
            let mut parent = vec![usize::MAX; n];
            let mut c = code;
            for &v in &others {
                parent[v] = (c % n as u64) as usize;
                c /= n as u64;
            }
            let reaches = others.iter().all(|&v| {
                let mut u = v;
                for _ in 0..n {
                    if u == root {
                        return true;
                    }
                    u = parent[u];
                    if u == usize::MAX {
                        return false;
                    }
                }
                u == root
            });
            if reaches && others.iter().all(|&v| parent[v] != v) {
                let sum: f64 = others.iter().map(|&v| cost[parent[v] * n + v]).sum();
                best = best.min(sum);
            }
        }
        best
    }

    #[test]
    fn matches_brute_force_on_random_graphs() {
        let mut state = 99u64;
        let mut next = || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 33) as f64 / (1u64 << 31) as f64
        };
        for n in 2..=6 {
            for _ in 0..40 {
                let cost: Vec<f64> = (0..n * n).map(|_| (next() * 10.0).floor() + 1.0).collect();
                for root in [0, n - 1] {
                    let parent = cheapest(n, &cost, root).expect("complete graph");
                    let got: f64 = (0..n)
                        .filter_map(|v| parent[v].map(|p| cost[p * n + v]))
                        .sum();
                    assert_eq!(got, brute(n, &cost, root), "n={n} root={root} {cost:?}");
                    assert!(parent[root].is_none());
                }
            }
        }
    }

    #[test]
    fn an_unreachable_node_has_no_arborescence() {
        let inf = f64::INFINITY;
        // Node 2 has no incoming edge.
        let cost = [inf, 1.0, inf, 1.0, inf, inf, 1.0, 1.0, inf];
        assert!(cheapest(3, &cost, 0).is_none());
    }
}
