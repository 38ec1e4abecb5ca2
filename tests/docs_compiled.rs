//! Every Markdown page of the repository is compiled as a doctest
//! (`src/lib.rs`'s `docs_compile` module): a page left out of that list
//! would let its code blocks drift from the API unnoticed.

use std::path::{Path, PathBuf};

fn markdown_pages(root: &Path) -> Vec<PathBuf> {
    let mut pages = vec![root.join("README.md"), root.join("cuda/README.md")];
    let docs = std::fs::read_dir(root.join("docs")).expect("docs/ is readable");
    for entry in docs {
        let path = entry.expect("a docs/ entry").path();
        if path.extension().is_some_and(|e| e == "md") {
            pages.push(path);
        }
    }
    pages
}

#[test]
fn every_page_is_in_the_doctest_list() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let lib = std::fs::read_to_string(root.join("src/lib.rs")).expect("src/lib.rs");
    let missing: Vec<_> = markdown_pages(root)
        .into_iter()
        .map(|p| p.strip_prefix(root).unwrap().display().to_string())
        .filter(|rel| !lib.contains(&format!("include_str!(\"../{rel}\")")))
        .collect();
    assert!(
        missing.is_empty(),
        "pages whose code blocks no doctest compiles (add them to docs_compile in src/lib.rs): {missing:?}"
    );
}
