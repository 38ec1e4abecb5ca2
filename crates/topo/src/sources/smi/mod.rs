//! A topology from the connection matrix that `nvidia-smi topo -m` prints.
//!
//! The matrix names every GPU and NIC in a header row and gives, for each
//! pair, the kind of path between them: `X` (itself), `NV#` (a bonded set
//! of `#` NVLinks), `PIX` (at most one PCIe switch), `PXB` (several PCIe
//! switches), `PHB` (through a PCIe host bridge, the CPU), `NODE` (between
//! host bridges of one NUMA node) or `SYS` (across the socket
//! interconnect). [`parse_smi`] builds the smallest graph — CPUs, host
//! bridges, PCIe switches, NVLinks, an NVSwitch — on which
//! [`Topology::path_class`] gives back every cell of the matrix.
//!
//! Tolerated, because drivers print them differently over the years:
//! cells separated by tabs or by runs of spaces; the multi-word columns
//! `CPU Affinity`, `NUMA Affinity` and `GPU NUMA ID`, any of them absent;
//! rows that end early or in empty cells (newer drivers leave a NIC's
//! affinity empty); NICs named `NIC0` or by device (`mlx5_0`); the legacy
//! codes `SOC` (now `SYS`) and `PSB` (now `PXB`); a trailing `Legend:`
//! block and a `NIC Legend:` block, whose names go into the description;
//! Windows line endings. Anything else that does not fit — an unknown
//! code, a row of the wrong length, a row the header does not name, a
//! matrix that is not square or not symmetric, or one no PCIe tree can
//! produce — is a [`TopologyError::Smi`] with its 1-based line.
//!
//! What the matrix does not say is assumed: the NVLink and PCIe
//! generations come from [`SmiOptions`], every PCIe link is x16, and
//! peer-to-peer is on for every pair.

use crate::error::TopologyError;
use crate::graph::{LinkKind, Node, NodeId, NodeKind, PathClass, Topology};
use crate::presets::pcie::{UPI_GBPS, UPI_LATENCY_US};

/// Join every pair of CPU nodes with the socket interconnect, at the
/// presets' UPI figures. A full mesh, not a chain: multi-socket boards
/// link every socket pair directly, and NCCL models CPUs the same way
/// (`ncclTopoConnectCpus`).
pub(crate) fn join_cpus(t: &mut Topology, cpus: &[NodeId]) {
    for (i, &a) in cpus.iter().enumerate() {
        for &b in &cpus[i + 1..] {
            t.connect_with(a, b, LinkKind::CpuInterconnect, UPI_GBPS, UPI_LATENCY_US);
        }
    }
}

/// What `nvidia-smi topo -m` leaves out and the graph needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SmiOptions {
    /// NVLink generation (1..=5) of every `NV#` bundle: 1 for P100, 2 for
    /// V100, 3 for A100, 4 for H100, 5 for Blackwell. It sets the rate per
    /// link and how many links a GPU has (4, 6, 12, 18, 18), which decides
    /// between a direct mesh and an NVSwitch.
    pub nvlink_generation: u8,
    /// PCIe generation (1..=6) of every PCIe link; all are taken as x16.
    pub pcie_generation: u8,
}

impl Default for SmiOptions {
    /// NVLink 3 and PCIe 4.0: an A100-era server.
    fn default() -> Self {
        SmiOptions {
            nvlink_generation: 3,
            pcie_generation: 4,
        }
    }
}

/// Parse the output of `nvidia-smi topo -m` with the default
/// [`SmiOptions`] (NVLink 3, PCIe 4.0).
pub fn parse_smi(text: &str) -> Result<Topology, TopologyError> {
    parse_smi_with(text, &SmiOptions::default())
}

/// Parse the output of `nvidia-smi topo -m`, taking the link generations
/// the matrix does not print from `options`.
///
/// On the result, [`Topology::path_class`] of any two GPUs or NICs is the
/// cell the matrix gives them; a matrix no graph can reproduce is an
/// error. The generations only set the rates.
pub fn parse_smi_with(text: &str, options: &SmiOptions) -> Result<Topology, TopologyError> {
    if !(1..=5).contains(&options.nvlink_generation) {
        return Err(TopologyError::Invalid(format!(
            "SmiOptions: NVLink generation {} is not 1..=5",
            options.nvlink_generation
        )));
    }
    if !(1..=6).contains(&options.pcie_generation) {
        return Err(TopologyError::Invalid(format!(
            "SmiOptions: PCIe generation {} is not 1..=6",
            options.pcie_generation
        )));
    }
    let matrix = Matrix::parse(text)?;
    build(&matrix, options)
}

fn smi_error(line: usize, message: impl Into<String>) -> TopologyError {
    TopologyError::Smi {
        line,
        message: message.into(),
    }
}

/// One cell of the matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cell {
    Same,
    Nv(u8),
    Pix,
    Pxb,
    Phb,
    Node,
    Sys,
}

impl Cell {
    fn parse(code: &str) -> Option<Cell> {
        Some(match code {
            "X" => Cell::Same,
            "PIX" => Cell::Pix,
            "PXB" | "PSB" => Cell::Pxb,
            "PHB" => Cell::Phb,
            "NODE" => Cell::Node,
            "SYS" | "SOC" => Cell::Sys,
            _ => {
                let digits = code.strip_prefix("NV")?;
                if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                    return None;
                }
                match digits.parse::<u8>() {
                    Ok(n) if n > 0 => Cell::Nv(n),
                    _ => return None,
                }
            }
        })
    }

    /// How far apart a PCIe path puts the two ends: 0 (`PIX`) to 4
    /// (`SYS`). `None` for NVLink, whose cell hides the PCIe path.
    fn pcie_level(self) -> Option<u8> {
        match self {
            Cell::Pix => Some(0),
            Cell::Pxb => Some(1),
            Cell::Phb => Some(2),
            Cell::Node => Some(3),
            Cell::Sys => Some(4),
            Cell::Same | Cell::Nv(_) => None,
        }
    }

    fn class(self) -> PathClass {
        match self {
            Cell::Same => PathClass::Same,
            Cell::Nv(n) => PathClass::NvLink(n),
            Cell::Pix => PathClass::Pix,
            Cell::Pxb => PathClass::Pxb,
            Cell::Phb => PathClass::Phb,
            Cell::Node => PathClass::Node,
            Cell::Sys => PathClass::Sys,
        }
    }
}

/// The columns after the devices, in the spelling every driver uses.
const TRAILING_COLUMNS: [&str; 3] = ["CPU Affinity", "NUMA Affinity", "GPU NUMA ID"];

/// The cells of the header row. Tabs separate them where the output is
/// raw; once tabs became spaces (copied from a terminal), the multi-word
/// column names have to be put back together.
fn header_cells(line: &str) -> Vec<String> {
    if line.contains('\t') {
        return line
            .split('\t')
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .map(String::from)
            .collect();
    }
    let words: Vec<&str> = line.split_whitespace().collect();
    let mut cells = Vec::new();
    let mut i = 0;
    'words: while i < words.len() {
        for name in TRAILING_COLUMNS {
            let phrase: Vec<&str> = name.split(' ').collect();
            if words[i..].starts_with(&phrase) {
                cells.push(name.to_string());
                i += phrase.len();
                continue 'words;
            }
        }
        cells.push(words[i].to_string());
        i += 1;
    }
    cells
}

/// Whether a token that is not a cell code was meant as one (`QPI`,
/// `NV?`), rather than being an affinity that slid left because the row
/// is short (`0-11,24-35`, `N/A`).
fn looks_like_code(token: &str) -> bool {
    token.starts_with(|c: char| c.is_ascii_alphabetic())
        && token
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '#' || c == '?')
}

fn is_gpu_name(name: &str) -> bool {
    name.strip_prefix("GPU")
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// One row of the matrix.
#[derive(Debug, Clone)]
struct Row {
    line: usize,
    cells: Vec<Cell>,
    cpu_affinity: Option<String>,
    numa: Option<u32>,
}

/// The parsed text, before any graph is built.
#[derive(Debug)]
struct Matrix {
    header_line: usize,
    /// Device columns in header order.
    names: Vec<String>,
    /// Rows in header order (not necessarily the order printed).
    rows: Vec<Row>,
    /// `NIC Legend:` entries: column name, device name.
    nic_legend: Vec<(String, String)>,
}

impl Matrix {
    fn parse(text: &str) -> Result<Matrix, TopologyError> {
        let lines: Vec<(usize, &str)> = text.lines().enumerate().map(|(i, l)| (i + 1, l)).collect();
        let mut at = 0;
        while at < lines.len() && lines[at].1.trim().is_empty() {
            at += 1;
        }
        let Some(&(header_line, header)) = lines.get(at) else {
            return Err(smi_error(
                1,
                "empty input: expected the matrix printed by `nvidia-smi topo -m`",
            ));
        };
        at += 1;
        let cells = header_cells(header);
        if let Some(code) = cells.iter().find(|c| Cell::parse(c).is_some()) {
            return Err(smi_error(
                header_line,
                format!(
                    "missing header row: this line holds the cell code `{code}`, but the first \
                     line must name the columns (GPU0, GPU1, ..., CPU Affinity)"
                ),
            ));
        }
        let split = cells
            .iter()
            .position(|c| TRAILING_COLUMNS.contains(&c.as_str()))
            .unwrap_or(cells.len());
        let names = cells[..split].to_vec();
        let trailing = &cells[split..];
        if names.is_empty() {
            return Err(smi_error(
                header_line,
                "the header names no device columns (expected GPU0, GPU1, ...)",
            ));
        }
        for (i, name) in names.iter().enumerate() {
            if names[..i].contains(name) {
                return Err(smi_error(
                    header_line,
                    format!("the header names column `{name}` twice"),
                ));
            }
        }

        let n = names.len();
        let mut rows: Vec<Option<Row>> = vec![None; n];
        let mut end_line = lines.last().map_or(1, |&(l, _)| l + 1);
        while at < lines.len() {
            let (line, raw) = lines[at];
            let trimmed = raw.trim();
            if trimmed.is_empty()
                || trimmed.starts_with("Legend")
                || trimmed.starts_with("NIC Legend")
            {
                end_line = line;
                break;
            }
            at += 1;
            let words: Vec<&str> = trimmed.split_whitespace().collect();
            let label = words[0];
            let Some(r) = names.iter().position(|c| c == label) else {
                return Err(smi_error(
                    line,
                    format!(
                        "row `{label}` is not a column of the header on line {header_line} \
                         (columns: {})",
                        names.join(", ")
                    ),
                ));
            };
            if rows[r].is_some() {
                return Err(smi_error(line, format!("row `{label}` appears twice")));
            }
            let values = &words[1..];
            let codes = values
                .iter()
                .take_while(|w| Cell::parse(w).is_some())
                .count();
            if codes < n
                && let Some(bad) = values.get(codes).filter(|w| looks_like_code(w))
            {
                return Err(smi_error(
                    line,
                    format!(
                        "unknown cell `{bad}` in row `{label}`, column `{}`: expected X, NV#, \
                         PIX, PXB, PHB, NODE or SYS",
                        names[codes]
                    ),
                ));
            }
            if codes != n {
                return Err(smi_error(
                    line,
                    format!(
                        "row `{label}` has {codes} matrix cells, but the header has {n} devices"
                    ),
                ));
            }
            let extra = &values[n..];
            if extra.len() > trailing.len() {
                return Err(smi_error(
                    line,
                    format!(
                        "row `{label}` has {} cells, but the header has only {} columns",
                        values.len(),
                        n + trailing.len()
                    ),
                ));
            }
            let mut row = Row {
                line,
                // Every value was checked to parse just above.
                cells: values[..n].iter().filter_map(|w| Cell::parse(w)).collect(),
                cpu_affinity: None,
                numa: None,
            };
            for (column, &value) in trailing.iter().zip(extra) {
                match column.as_str() {
                    "CPU Affinity" if value != "N/A" => row.cpu_affinity = Some(value.to_string()),
                    "NUMA Affinity" => match value.parse() {
                        Ok(numa) => row.numa = Some(numa),
                        Err(_) if value == "N/A" => {}
                        Err(_) => tracing::debug!(
                            line,
                            value,
                            "nvidia-smi topo -m: NUMA affinity is not one node; ignored"
                        ),
                    },
                    _ => {}
                }
            }
            rows[r] = Some(row);
        }

        let mut complete = Vec::with_capacity(n);
        for (name, row) in names.iter().zip(rows) {
            let Some(row) = row else {
                return Err(smi_error(
                    end_line,
                    format!("no row for `{name}`: the matrix must be square ({n} columns)"),
                ));
            };
            complete.push(row);
        }
        let rows = complete;

        for i in 0..n {
            if rows[i].cells[i] != Cell::Same {
                return Err(smi_error(
                    rows[i].line,
                    format!(
                        "`{}` meets itself as {}, expected X",
                        names[i],
                        rows[i].cells[i].class()
                    ),
                ));
            }
            for j in 0..n {
                let cell = rows[i].cells[j];
                if i != j && cell == Cell::Same {
                    return Err(smi_error(
                        rows[i].line,
                        format!(
                            "`X` off the diagonal: row `{}`, column `{}`",
                            names[i], names[j]
                        ),
                    ));
                }
                if j > i && cell != rows[j].cells[i] {
                    let line = rows[i].line.max(rows[j].line);
                    return Err(smi_error(
                        line,
                        format!(
                            "asymmetric matrix: `{a}` to `{b}` is {}, but `{b}` to `{a}` is {}",
                            cell.class(),
                            rows[j].cells[i].class(),
                            a = names[i],
                            b = names[j],
                        ),
                    ));
                }
                if let Cell::Nv(_) = cell
                    && !(is_gpu_name(&names[i]) && is_gpu_name(&names[j]))
                {
                    return Err(smi_error(
                        rows[i].line,
                        format!(
                            "`{}` to `{}` is {}: NVLink joins GPUs only",
                            names[i],
                            names[j],
                            cell.class()
                        ),
                    ));
                }
            }
        }

        let mut nic_legend = Vec::new();
        let mut in_nic_legend = false;
        for &(line, raw) in &lines[at..] {
            let trimmed = raw.trim();
            if trimmed.starts_with("NIC Legend") {
                in_nic_legend = true;
                continue;
            }
            if trimmed.starts_with("Legend") {
                in_nic_legend = false;
                continue;
            }
            if !in_nic_legend || trimmed.is_empty() {
                continue;
            }
            let entry = trimmed
                .split_once(':')
                .map(|(k, v)| (k.trim(), v.trim()))
                .filter(|(k, v)| !k.is_empty() && !v.is_empty() && !k.contains(' '));
            match entry {
                Some((column, device)) if names.iter().any(|c| c == column) => {
                    nic_legend.push((column.to_string(), device.to_string()));
                }
                _ => tracing::debug!(
                    line,
                    text = trimmed,
                    "nvidia-smi topo -m: NIC legend line names no column; ignored"
                ),
            }
        }

        Ok(Matrix {
            header_line,
            names,
            rows,
            nic_legend,
        })
    }

    fn level(&self, a: usize, b: usize) -> Option<u8> {
        self.rows[a].cells[b].pcie_level()
    }

    /// Whether some known cell between the two groups is farther apart
    /// than `threshold`, so they cannot share the subtree it stands for.
    fn apart(&self, a: &[usize], b: &[usize], threshold: u8) -> bool {
        a.iter().any(|&x| {
            b.iter()
                .any(|&y| self.level(x, y).is_some_and(|l| l > threshold))
        })
    }
}

/// Merge groups while some pair satisfies `join`, first pairs first.
fn merge_while(groups: &mut Vec<Vec<usize>>, join: impl Fn(&[usize], &[usize]) -> bool) {
    'again: loop {
        for p in 0..groups.len() {
            for q in p + 1..groups.len() {
                if join(groups[p].as_slice(), groups[q].as_slice()) {
                    let moved = groups.remove(q);
                    groups[p].extend(moved);
                    continue 'again;
                }
            }
        }
        return;
    }
}

/// Split `members` into the subtrees below one level of the PCIe tree:
/// the devices whose cells are at most `threshold` apart (and the devices
/// those join, since a subtree is closed under that), then groups that a
/// hint puts together and nothing keeps apart, then — with `merge_free` —
/// any groups nothing keeps apart. NVLink cells say nothing about PCIe,
/// so devices seen only through them are placed by hints, or freely.
fn partition(
    m: &Matrix,
    members: &[usize],
    threshold: u8,
    hints: Option<&[Option<String>]>,
    merge_free: bool,
) -> Result<Vec<Vec<usize>>, TopologyError> {
    let mut groups: Vec<Vec<usize>> = members.iter().map(|&i| vec![i]).collect();
    merge_while(&mut groups, |a, b| {
        a.iter().any(|&x| {
            b.iter()
                .any(|&y| m.level(x, y).is_some_and(|l| l <= threshold))
        })
    });
    for g in &groups {
        for (k, &x) in g.iter().enumerate() {
            for &y in &g[k + 1..] {
                if m.level(x, y).is_some_and(|l| l > threshold) {
                    let place = match threshold {
                        0 => "on one PCIe switch",
                        1 => "under one tree of PCIe switches",
                        2 => "under one host bridge",
                        _ => "under one CPU",
                    };
                    let (a, b) = (x.min(y), x.max(y));
                    return Err(smi_error(
                        m.rows[a].line.max(m.rows[b].line),
                        format!(
                            "no PCIe tree fits this matrix: `{}` to `{}` is {}, yet their cells \
                             with other devices put both {place}",
                            m.names[a],
                            m.names[b],
                            m.rows[a].cells[b].class()
                        ),
                    ));
                }
            }
        }
    }
    if let Some(hints) = hints {
        merge_while(&mut groups, |a, b| {
            let shared = a
                .iter()
                .any(|&x| hints[x].is_some() && b.iter().any(|&y| hints[y] == hints[x]));
            shared && !m.apart(a, b, threshold)
        });
    }
    if merge_free {
        merge_while(&mut groups, |a, b| !m.apart(a, b, threshold));
    }
    for g in &mut groups {
        g.sort_unstable();
    }
    groups.sort_unstable_by_key(|g| g[0]);
    Ok(groups)
}

/// Links per GPU of each NVLink generation: P100 4, V100 6, A100 12,
/// H100 and Blackwell 18 (the NVIDIA architecture whitepapers).
fn links_per_gpu(generation: u8) -> u32 {
    match generation {
        1 => 4,
        2 => 6,
        3 => 12,
        _ => 18,
    }
}

/// Adds nodes with unique names from a running count.
struct Namer {
    switches: usize,
    bridges: usize,
}

fn build(m: &Matrix, options: &SmiOptions) -> Result<Topology, TopologyError> {
    let n = m.names.len();
    let gpus: Vec<usize> = (0..n).filter(|&i| is_gpu_name(&m.names[i])).collect();
    let nics: Vec<usize> = (0..n).filter(|&i| !is_gpu_name(&m.names[i])).collect();
    if gpus.is_empty() {
        return Err(smi_error(m.header_line, "the matrix names no GPU"));
    }
    let pcie = LinkKind::Pcie {
        generation: options.pcie_generation,
        width: 16,
    };

    // CPUs: the matrix keeps SYS pairs apart and joins the rest; affinity
    // places the devices the matrix only relates by NVLink.
    let hints: Vec<Option<String>> = m
        .rows
        .iter()
        .map(|r| {
            r.numa
                .map(|x| format!("numa {x}"))
                .or_else(|| r.cpu_affinity.as_ref().map(|c| format!("cpus {c}")))
        })
        .collect();
    let all: Vec<usize> = (0..n).collect();
    let cpu_groups = partition(m, &all, 3, Some(&hints), true)?;
    let mut group_numa: Vec<Option<u32>> = Vec::with_capacity(cpu_groups.len());
    for g in &cpu_groups {
        let mut numa = None;
        for &d in g {
            if let Some(x) = m.rows[d].numa {
                match numa {
                    None => numa = Some(x),
                    Some(y) if y != x => tracing::debug!(
                        device = m.names[d].as_str(),
                        "nvidia-smi topo -m: devices of one CPU name NUMA nodes {y} and {x}; using {y}"
                    ),
                    _ => {}
                }
            }
        }
        if numa.is_some_and(|x| group_numa.contains(&Some(x))) {
            tracing::debug!("nvidia-smi topo -m: two CPUs claim NUMA node {numa:?}; renumbering");
            numa = None;
        }
        group_numa.push(numa);
    }
    let mut numas: Vec<u32> = Vec::with_capacity(cpu_groups.len());
    for known in &group_numa {
        let numa = match *known {
            Some(x) => x,
            None => (0..)
                .find(|x| !group_numa.contains(&Some(*x)) && !numas.contains(x))
                .unwrap_or(0),
        };
        numas.push(numa);
    }
    let mut order: Vec<usize> = (0..cpu_groups.len()).collect();
    order.sort_unstable_by_key(|&g| numas[g]);
    let mut numa_of = vec![0u32; n];
    for (g, members) in cpu_groups.iter().enumerate() {
        for &d in members {
            numa_of[d] = m.rows[d].numa.unwrap_or(numas[g]);
        }
    }

    let gpu_count = gpus.len();
    let legend = if m.nic_legend.is_empty() {
        String::new()
    } else {
        let pairs: Vec<String> = m
            .nic_legend
            .iter()
            .map(|(c, d)| format!("{c} = {d}"))
            .collect();
        format!(" ({})", pairs.join(", "))
    };
    let mut t = Topology::new(
        format!("nvidia-smi-{gpu_count}gpu"),
        format!(
            "from `nvidia-smi topo -m`: {gpu_count} GPUs, {} NICs{legend}, {} CPUs; NVLink {} and \
             PCIe {}.0 x16 assumed",
            nics.len(),
            cpu_groups.len(),
            options.nvlink_generation,
            options.pcie_generation
        ),
    );
    let mut node_of = vec![0; n];
    for &d in gpus.iter().chain(&nics) {
        let kind = if is_gpu_name(&m.names[d]) {
            NodeKind::Gpu
        } else {
            NodeKind::Nic
        };
        node_of[d] = t.add_node(Node::new(m.names[d].clone(), kind).numa(numa_of[d]));
    }
    let mut cpu_node = vec![0; cpu_groups.len()];
    for &g in &order {
        cpu_node[g] =
            t.add_node(Node::new(format!("CPU{}", numas[g]), NodeKind::Cpu).numa(numas[g]));
    }
    let cpu_nodes: Vec<NodeId> = order.iter().map(|&g| cpu_node[g]).collect();
    join_cpus(&mut t, &cpu_nodes);

    let mut namer = Namer {
        switches: 0,
        bridges: 0,
    };
    for &g in &order {
        let numa = numas[g];
        let bridge_groups = partition(m, &cpu_groups[g], 2, None, true)?;
        for members in &bridge_groups {
            let parent = if bridge_groups.len() > 1 {
                let hb = t.add_node(
                    Node::new(format!("HB{}", namer.bridges), NodeKind::HostBridge).numa(numa),
                );
                namer.bridges += 1;
                t.connect(hb, cpu_node[g], pcie.clone());
                hb
            } else {
                cpu_node[g]
            };
            add_switches(
                m, &mut t, &mut namer, members, parent, numa, &node_of, &pcie,
            )?;
        }
    }

    add_nvlinks(m, &mut t, &gpus, &node_of, options.nvlink_generation);

    for i in 0..n {
        for j in i + 1..n {
            let cell = m.rows[i].cells[j];
            let got = t.path_class(node_of[i], node_of[j])?;
            if got == cell.class() {
                continue;
            }
            return Err(smi_error(
                m.rows[i].line.max(m.rows[j].line),
                format!(
                    "cannot model `{}` to `{}` as {}: the graph built from the matrix gives {got}",
                    m.names[i],
                    m.names[j],
                    cell.class()
                ),
            ));
        }
    }
    t.validate()?;
    Ok(t)
}

/// Hang the devices of one host bridge (or CPU) below `parent`: a device
/// alone goes straight to it; devices `PXB` or `PIX` to each other share
/// a switch, and where some of them are `PXB` apart, each `PIX` group
/// gets a switch of its own below that one, so a path between groups
/// crosses several switches and a path inside one crosses one.
#[allow(clippy::too_many_arguments)]
fn add_switches(
    m: &Matrix,
    t: &mut Topology,
    namer: &mut Namer,
    members: &[usize],
    parent: NodeId,
    numa: u32,
    node_of: &[NodeId],
    pcie: &LinkKind,
) -> Result<(), TopologyError> {
    let mut new_switch = |t: &mut Topology, up: NodeId| {
        let sw = t
            .add_node(Node::new(format!("PLX{}", namer.switches), NodeKind::PcieSwitch).numa(numa));
        namer.switches += 1;
        t.connect(sw, up, pcie.clone());
        sw
    };
    for tree in partition(m, members, 1, None, false)? {
        if let [alone] = tree.as_slice() {
            t.connect(node_of[*alone], parent, pcie.clone());
            continue;
        }
        let top = new_switch(t, parent);
        let leaves = partition(m, &tree, 0, None, false)?;
        if leaves.len() == 1 {
            for &d in &tree {
                t.connect(node_of[d], top, pcie.clone());
            }
            continue;
        }
        for leaf in leaves {
            let sw = new_switch(t, top);
            for d in leaf {
                t.connect(node_of[d], sw, pcie.clone());
            }
        }
    }
    Ok(())
}

/// NVLink bundles: one NVSwitch when every GPU pair shows the same `NV#`
/// and a direct mesh of such bundles would need more links per GPU than
/// the generation has (8 A100s at NV12, 8 H100s at NV18); a direct link
/// per `NV#` pair otherwise (DGX-1, NVLink bridges, the 4-GPU HGX A100's
/// real mesh of NV4).
fn add_nvlinks(m: &Matrix, t: &mut Topology, gpus: &[usize], node_of: &[NodeId], generation: u8) {
    let mut pairs = Vec::new();
    for (k, &a) in gpus.iter().enumerate() {
        for &b in &gpus[k + 1..] {
            if let Cell::Nv(count) = m.rows[a].cells[b] {
                pairs.push((a, b, count));
            }
        }
    }
    let every_pair = gpus.len() * (gpus.len() - 1) / 2;
    let uniform =
        pairs.len() == every_pair && pairs.windows(2).all(|w| w[0].2 == w[1].2) && gpus.len() >= 3;
    if let (true, Some(&(_, _, count))) = (uniform, pairs.first()) {
        let needed = u32::from(count) * (gpus.len() as u32 - 1);
        if needed > links_per_gpu(generation) {
            let fabric = t.add_node(Node::new("NVSwitch", NodeKind::NvSwitch));
            for &g in gpus {
                t.connect(node_of[g], fabric, LinkKind::Nvlink { generation, count });
            }
            return;
        }
    }
    for (a, b, count) in pairs {
        t.connect(
            node_of[a],
            node_of[b],
            LinkKind::Nvlink { generation, count },
        );
    }
}

#[cfg(test)]
mod tests;
