//! Reading the text of `nvidia-smi topo -m` into a matrix of cells, with
//! the line of every row, before any graph is built.

use crate::error::TopologyError;
use crate::graph::PathClass;

pub(super) fn smi_error(line: usize, message: impl Into<String>) -> TopologyError {
    TopologyError::Smi {
        line,
        message: message.into(),
    }
}

/// One cell of the matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Cell {
    Same,
    Nv(u8),
    Pix,
    Pxb,
    Phb,
    Node,
    Sys,
}

impl Cell {
    pub(super) fn parse(code: &str) -> Option<Cell> {
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
    pub(super) fn pcie_level(self) -> Option<u8> {
        match self {
            Cell::Pix => Some(0),
            Cell::Pxb => Some(1),
            Cell::Phb => Some(2),
            Cell::Node => Some(3),
            Cell::Sys => Some(4),
            Cell::Same | Cell::Nv(_) => None,
        }
    }

    pub(super) fn class(self) -> PathClass {
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
pub(super) const TRAILING_COLUMNS: [&str; 3] = ["CPU Affinity", "NUMA Affinity", "GPU NUMA ID"];

/// The cells of the header row. Tabs separate them where the output is
/// raw; once tabs became spaces (copied from a terminal), the multi-word
/// column names have to be put back together.
pub(super) fn header_cells(line: &str) -> Vec<String> {
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
pub(super) fn looks_like_code(token: &str) -> bool {
    token.starts_with(|c: char| c.is_ascii_alphabetic())
        && token
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '#' || c == '?')
}

pub(super) fn is_gpu_name(name: &str) -> bool {
    name.strip_prefix("GPU")
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// One row of the matrix.
#[derive(Debug, Clone)]
pub(super) struct Row {
    pub(super) line: usize,
    pub(super) cells: Vec<Cell>,
    pub(super) cpu_affinity: Option<String>,
    pub(super) numa: Option<u32>,
}

/// The parsed text, before any graph is built.
#[derive(Debug)]
pub(super) struct Matrix {
    pub(super) header_line: usize,
    /// Device columns in header order.
    pub(super) names: Vec<String>,
    /// Rows in header order (not necessarily the order printed).
    pub(super) rows: Vec<Row>,
    /// `NIC Legend:` entries: column name, device name.
    pub(super) nic_legend: Vec<(String, String)>,
}

impl Matrix {
    pub(super) fn parse(text: &str) -> Result<Matrix, TopologyError> {
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
        let (names, trailing) = header_columns(header_line, header)?;
        let header = Header {
            line: header_line,
            names: &names,
            trailing: &trailing,
        };
        let mut rows: Vec<Option<Row>> = vec![None; names.len()];
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
            let (r, row) = header.row(line, trimmed, &rows)?;
            rows[r] = Some(row);
        }
        let rows = square(&names, rows, end_line)?;
        check_cells(&names, &rows)?;
        let nic_legend = nic_legend(&lines[at..], &names);
        Ok(Matrix {
            header_line,
            names,
            rows,
            nic_legend,
        })
    }

    pub(super) fn level(&self, a: usize, b: usize) -> Option<u8> {
        self.rows[a].cells[b].pcie_level()
    }

    /// Whether some known cell between the two groups is farther apart
    /// than `threshold`, so they cannot share the subtree it stands for.
    pub(super) fn apart(&self, a: &[usize], b: &[usize], threshold: u8) -> bool {
        a.iter().any(|&x| {
            b.iter()
                .any(|&y| self.level(x, y).is_some_and(|l| l > threshold))
        })
    }
}

/// The header's device columns and the trailing columns after them.
fn header_columns(line: usize, header: &str) -> Result<(Vec<String>, Vec<String>), TopologyError> {
    let cells = header_cells(header);
    if let Some(code) = cells.iter().find(|c| Cell::parse(c).is_some()) {
        return Err(smi_error(
            line,
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
    if names.is_empty() {
        return Err(smi_error(
            line,
            "the header names no device columns (expected GPU0, GPU1, ...)",
        ));
    }
    for (i, name) in names.iter().enumerate() {
        if names[..i].contains(name) {
            return Err(smi_error(
                line,
                format!("the header names column `{name}` twice"),
            ));
        }
    }
    Ok((names, cells[split..].to_vec()))
}

/// The header, as the rows are read against it.
struct Header<'a> {
    line: usize,
    names: &'a [String],
    trailing: &'a [String],
}

impl Header<'_> {
    /// One row: which device it is, its cells and its affinities.
    fn row(
        &self,
        line: usize,
        trimmed: &str,
        seen: &[Option<Row>],
    ) -> Result<(usize, Row), TopologyError> {
        let (names, n) = (self.names, self.names.len());
        let words: Vec<&str> = trimmed.split_whitespace().collect();
        let label = words[0];
        let Some(r) = names.iter().position(|c| c == label) else {
            return Err(smi_error(
                line,
                format!(
                    "row `{label}` is not a column of the header on line {} (columns: {})",
                    self.line,
                    names.join(", ")
                ),
            ));
        };
        if seen[r].is_some() {
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
                format!("row `{label}` has {codes} matrix cells, but the header has {n} devices"),
            ));
        }
        let extra = &values[n..];
        if extra.len() > self.trailing.len() {
            return Err(smi_error(
                line,
                format!(
                    "row `{label}` has {} cells, but the header has only {} columns",
                    values.len(),
                    n + self.trailing.len()
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
        for (column, &value) in self.trailing.iter().zip(extra) {
            affinity(&mut row, column, value);
        }
        Ok((r, row))
    }
}

/// A trailing column's value, kept where the graph builder uses it.
fn affinity(row: &mut Row, column: &str, value: &str) {
    match column {
        "CPU Affinity" if value != "N/A" => row.cpu_affinity = Some(value.to_string()),
        "NUMA Affinity" => match value.parse() {
            Ok(numa) => row.numa = Some(numa),
            Err(_) if value == "N/A" => {}
            Err(_) => tracing::debug!(
                line = row.line,
                value,
                "nvidia-smi topo -m: NUMA affinity is not one node; ignored"
            ),
        },
        _ => {}
    }
}

/// Every device has its row.
fn square(
    names: &[String],
    rows: Vec<Option<Row>>,
    end_line: usize,
) -> Result<Vec<Row>, TopologyError> {
    let n = names.len();
    names
        .iter()
        .zip(rows)
        .map(|(name, row)| {
            row.ok_or_else(|| {
                smi_error(
                    end_line,
                    format!("no row for `{name}`: the matrix must be square ({n} columns)"),
                )
            })
        })
        .collect()
}

/// X exactly on the diagonal, a symmetric matrix, NVLink between GPUs only.
fn check_cells(names: &[String], rows: &[Row]) -> Result<(), TopologyError> {
    let n = names.len();
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
            check_cell(names, rows, i, j)?;
        }
    }
    Ok(())
}

fn check_cell(names: &[String], rows: &[Row], i: usize, j: usize) -> Result<(), TopologyError> {
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
    Ok(())
}

/// `NIC Legend:` entries that name a column: (column, device).
fn nic_legend(lines: &[(usize, &str)], names: &[String]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut in_nic_legend = false;
    for &(line, raw) in lines {
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
                out.push((column.to_string(), device.to_string()));
            }
            _ => tracing::debug!(
                line,
                text = trimmed,
                "nvidia-smi topo -m: NIC legend line names no column; ignored"
            ),
        }
    }
    out
}
