//! The layering of docs/architecture.md, checked against the code: which
//! of our crates each crate may depend on, which modules of its own crate
//! each module may name, and no import circle among the files of a folder.
//!
//! Imports are read from the source text: `crate::name` paths (alone or in
//! `crate::{…}` groups; a name the crate root re-exports counts as its
//! module) and, inside a folder, `super::name` paths to a sibling. Comments, `tests.rs` files, `tests/` folders and items under
//! `#[cfg(test)]` are not imports of the module.
//! `FERROCOLL_PRINT_LAYERS=1` prints the graph the code has.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

type Graph = BTreeMap<String, BTreeSet<String>>;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The source with comments and `#[cfg(test)]` items blanked out.
fn code_only(source: &str) -> String {
    let mut out = String::new();
    let mut lines = source.lines().peekable();
    while let Some(line) = lines.next() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("#[cfg(test)]") || trimmed.starts_with("#[cfg(all(test") {
            skip_item(&mut lines);
            continue;
        }
        if trimmed.starts_with("//") {
            continue;
        }
        let code = line.split(" // ").next().unwrap_or(line);
        out.push_str(code);
        out.push('\n');
    }
    out
}

/// Skips the item after a `#[cfg(test)]`: one line ending in `;`, or a
/// block up to its closing brace.
fn skip_item<'a>(lines: &mut std::iter::Peekable<impl Iterator<Item = &'a str>>) {
    let mut depth = 0i64;
    let mut opened = false;
    for line in lines.by_ref() {
        if line.trim_start().starts_with("#[") && !opened {
            continue;
        }
        for c in line.chars() {
            match c {
                '{' => {
                    depth += 1;
                    opened = true;
                }
                '}' => depth -= 1,
                _ => {}
            }
        }
        if (opened && depth <= 0) || (!opened && line.trim_end().ends_with(';')) {
            return;
        }
    }
}

fn ident_at(text: &str) -> Option<&str> {
    let end = text
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(text.len());
    (end > 0).then(|| &text[..end])
}

/// The names that follow `prefix` (`crate::`, `super::`), groups opened.
fn names_after(code: &str, prefix: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for (at, _) in code.match_indices(prefix) {
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$') {
            continue;
        }
        let rest = &code[at + prefix.len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let inner = &group[..group.find("};").unwrap_or(group.len())];
            let mut depth = 0;
            let mut start = true;
            for (i, c) in inner.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => start = true,
                    c if c.is_whitespace() => {}
                    _ if start && depth == 0 => {
                        start = false;
                        if let Some(name) = ident_at(&inner[i..]) {
                            names.insert(name.to_owned());
                        }
                    }
                    _ => {}
                }
            }
        } else if let Some(name) = ident_at(rest) {
            names.insert(name.to_owned());
        }
    }
    names
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.expect("a directory entry").path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            if name != "tests" && name != "bin" {
                rust_files(&path, out);
            }
        } else if name.ends_with(".rs") && name != "tests.rs" {
            out.push(path);
        }
    }
}

/// Module name of a path under `src`: its first component, without `.rs`.
fn top_module(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).unwrap();
    let first = rel
        .components()
        .next()
        .unwrap()
        .as_os_str()
        .to_string_lossy();
    first.trim_end_matches(".rs").to_owned()
}

/// Names the crate root re-exports from its modules (`pub use m::{A, B}`
/// in `lib.rs`): `crate::A` is an import of `m`.
fn root_exports(src: &Path, modules: &BTreeSet<String>) -> BTreeMap<String, String> {
    let mut exports = BTreeMap::new();
    let lib = fs::read_to_string(src.join("lib.rs")).unwrap_or_default();
    for statement in code_only(&lib).split(';') {
        let statement = statement.trim();
        let Some(path) = statement
            .strip_prefix("pub use ")
            .or_else(|| statement.strip_prefix("pub(crate) use "))
        else {
            continue;
        };
        let Some((module, rest)) = path.split_once("::") else {
            continue;
        };
        if !modules.contains(module) {
            continue;
        }
        let items = rest.trim_start_matches('{').trim_end_matches('}');
        for item in items.split(',') {
            let name = item.rsplit([' ', ':']).next().unwrap_or("").trim();
            if !name.is_empty() {
                exports.insert(name.to_owned(), module.to_owned());
            }
        }
    }
    exports
}

/// The modules of `src` and the modules of the same crate each names.
fn crate_graph(src: &Path) -> Graph {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let modules: BTreeSet<String> = files
        .iter()
        .map(|f| top_module(src, f))
        .filter(|m| m != "lib" && m != "main")
        .collect();
    let exports = root_exports(src, &modules);
    let mut graph: Graph = modules
        .iter()
        .map(|m| (m.clone(), BTreeSet::new()))
        .collect();
    for file in &files {
        let module = top_module(src, file);
        let Some(edges) = graph.get_mut(&module) else {
            continue;
        };
        let code = code_only(&fs::read_to_string(file).unwrap());
        for name in names_after(&code, "crate::") {
            let target = exports.get(&name).unwrap_or(&name);
            if *target != module && modules.contains(target) {
                edges.insert(target.clone());
            }
        }
    }
    graph
}

/// For every folder under `src`, its files' `super::` names of siblings.
fn folder_graphs(src: &Path) -> BTreeMap<PathBuf, Graph> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut graphs: BTreeMap<PathBuf, Graph> = BTreeMap::new();
    for file in &files {
        let name = file.file_stem().unwrap().to_string_lossy().into_owned();
        let folder = file.parent().unwrap().to_path_buf();
        if name == "mod" || name == "lib" || folder == src {
            continue;
        }
        let siblings: BTreeSet<String> = fs::read_dir(&folder)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.is_dir() || p.extension().is_some_and(|x| x == "rs"))
            .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
            .filter(|s| s != "mod" && s != "tests")
            .collect();
        let code = code_only(&fs::read_to_string(file).unwrap());
        let graph = graphs.entry(folder).or_default();
        let edges = graph.entry(name.clone()).or_default();
        for sibling in names_after(&code, "super::") {
            if sibling != name && siblings.contains(&sibling) {
                edges.insert(sibling);
            }
        }
    }
    graphs
}

/// A cycle of `graph`, if it has one.
fn cycle(graph: &Graph) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &Graph,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|p| p == node) {
            let mut found = path[at..].to_vec();
            found.push(node.to_owned());
            return Some(found);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(c) = visit(next, graph, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|n| visit(n, graph, &mut Vec::new(), &mut done))
}

/// The rows of the architecture page's table under `heading`: cells with
/// backticks removed, `—` an empty cell.
fn table(heading: &str) -> Vec<Vec<String>> {
    let page = fs::read_to_string(root().join("docs/architecture.md")).unwrap();
    let at = page
        .find(heading)
        .unwrap_or_else(|| panic!("docs/architecture.md has no `{heading}`"));
    page[at..]
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2)
        .map(|row| {
            row.trim_matches('|')
                .split('|')
                .map(|cell| cell.trim().replace(['`', '—'], ""))
                .collect()
        })
        .collect()
}

fn list(cell: &str) -> BTreeSet<String> {
    // Each item's first word: words after it explain.
    cell.split(',')
        .filter_map(|s| s.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

/// `crates/<dir>/src` for each crate of the module table, and the facade.
fn source_folder(krate: &str) -> PathBuf {
    match krate {
        "ferrocoll" => root().join("src"),
        other => root().join("crates").join(other).join("src"),
    }
}

#[test]
fn every_module_imports_only_what_the_architecture_allows() {
    let rows = table("### Who may import whom");
    let mut allowed: BTreeMap<String, Graph> = [
        "core",
        "topo",
        "device",
        "cuda",
        "nccl",
        "process",
        "rendezvous",
        "ferrocoll",
    ]
    .into_iter()
    .map(|k| (k.to_owned(), Graph::new()))
    .collect();
    for row in &rows {
        let [krate, module, may] = &row[..] else {
            panic!("a row of three cells expected: {row:?}");
        };
        allowed
            .entry(krate.clone())
            .or_default()
            .insert(module.clone(), list(may));
    }
    let print = std::env::var_os("FERROCOLL_PRINT_LAYERS").is_some();
    let mut wrong = Vec::new();
    for (krate, rules) in &allowed {
        let graph = crate_graph(&source_folder(krate));
        for (module, imports) in &graph {
            if print {
                let names: Vec<_> = imports.iter().map(|i| format!("`{i}`")).collect();
                println!("| {krate} | `{module}` | {} |", names.join(", "));
            }
            let Some(may) = rules.get(module) else {
                wrong.push(format!("{krate}: module `{module}` has no row"));
                continue;
            };
            for import in imports.difference(may) {
                wrong.push(format!("{krate}: `{module}` imports `{import}`"));
            }
        }
        for module in rules.keys().filter(|m| !graph.contains_key(*m)) {
            wrong.push(format!("{krate}: the row of `{module}` names no module"));
        }
        if let Some(c) = cycle(&graph) {
            wrong.push(format!(
                "{krate}: modules import in a circle: {}",
                c.join(" → ")
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "against docs/architecture.md:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn no_folder_has_an_import_circle() {
    let mut circles = Vec::new();
    let crates = fs::read_dir(root().join("crates")).unwrap();
    let roots = [root().join("src"), root().join("src/bin/ferrocoll")];
    for krate in roots
        .into_iter()
        .chain(crates.map(|e| e.unwrap().path().join("src")))
    {
        for (folder, graph) in folder_graphs(&krate) {
            if let Some(c) = cycle(&graph) {
                let rel = folder.strip_prefix(root()).unwrap().display().to_string();
                circles.push(format!("{rel}: {}", c.join(" → ")));
            }
        }
    }
    assert!(
        circles.is_empty(),
        "import circles:\n{}",
        circles.join("\n")
    );
}

#[test]
fn every_crate_depends_only_on_what_the_architecture_allows() {
    let rows = table("### Which crates each crate may use");
    let mut wrong = Vec::new();
    for row in &rows {
        let [krate, may] = &row[..] else {
            panic!("a row of two cells expected: {row:?}");
        };
        let manifest = match krate.as_str() {
            "ferrocoll" => root().join("Cargo.toml"),
            other => {
                let dir = other
                    .trim_start_matches("ferrocoll-")
                    .trim_end_matches("-rs-sys");
                let dir = if other == "nccl-rs-sys" {
                    "nccl-sys"
                } else {
                    dir
                };
                root().join("crates").join(dir).join("Cargo.toml")
            }
        };
        let text = fs::read_to_string(&manifest).unwrap();
        let ours = normal_dependencies(&text);
        let may = list(may);
        for dep in ours.difference(&may) {
            wrong.push(format!("{krate} depends on {dep}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "against docs/architecture.md:\n{}",
        wrong.join("\n")
    );
}

/// Our crates among a manifest's `[dependencies]` (not dev or build).
fn normal_dependencies(manifest: &str) -> BTreeSet<String> {
    let mut in_section = false;
    let mut ours = BTreeSet::new();
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_section = line == "[dependencies]";
            continue;
        }
        let name = line.split(['=', '.', ' ']).next().unwrap_or("");
        if in_section && (name.starts_with("ferrocoll-") || name == "nccl-rs-sys") {
            ours.insert(name.to_owned());
        }
    }
    ours
}

#[test]
fn the_reader_sees_imports_and_skips_comments_and_tests() {
    let code = code_only(
        "use crate::{a, b::{c, d}};\n// crate::nope\nfn f() { crate::e::g(); }\n\
         #[cfg(test)]\nmod tests {\n    use crate::hidden;\n}\nuse super::sib;\n",
    );
    let names: Vec<_> = names_after(&code, "crate::").into_iter().collect();
    assert_eq!(names, ["a", "b", "e"]);
    assert!(names_after(&code, "super::").contains("sib"));
    let dir = std::env::temp_dir().join(format!("ferrocoll-layering-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    fs::write(
        dir.join("lib.rs"),
        "mod comm;\npub use comm::{Communicator, call::Call as Entry};\npub use other::X;\n",
    )
    .unwrap();
    let modules = BTreeSet::from(["comm".to_owned()]);
    let exports = root_exports(&dir, &modules);
    fs::remove_dir_all(&dir).unwrap();
    assert_eq!(
        exports.get("Communicator").map(String::as_str),
        Some("comm")
    );
    assert_eq!(exports.get("Entry").map(String::as_str), Some("comm"));
    assert!(!exports.contains_key("X"), "not a module of the crate");
    let mut g = Graph::new();
    g.entry("x".into()).or_default().insert("y".into());
    assert!(cycle(&g).is_none());
    g.entry("y".into()).or_default().insert("x".into());
    assert_eq!(cycle(&g).unwrap(), ["x", "y", "x"]);
}
