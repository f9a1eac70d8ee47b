//! `docs/ops.md` shows each declared op's schema exactly as its declaration states it: the
//! tables between `<!-- dlkern-schema NAME -->` and `<!-- /dlkern-schema -->` are generated
//! from `dlkern::ops::declarations()`. Run with `DLKERN_BLESS=1` to rewrite them after changing a
//! declaration (the prose around them stays as written).

use std::path::{Path, PathBuf};

use dlkern::ops::declarations;

/// `docs/ops.md` in the tree this test was built in, or in the working directory when the test
/// executable was carried to another machine (the GPU host runs it from the repository root).
fn doc_path() -> PathBuf {
    let built_in = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/ops.md");
    if built_in.is_file() { built_in } else { PathBuf::from("docs/ops.md") }
}
const END: &str = "<!-- /dlkern-schema -->";

fn begin(name: &str) -> String {
    format!("<!-- dlkern-schema {name} -->")
}

/// The document with every schema block replaced by the declaration's tables, and the names of
/// the blocks it holds in order.
fn regenerate(doc: &str) -> Result<(String, Vec<String>), String> {
    let mut out = String::with_capacity(doc.len());
    let mut names = Vec::new();
    let mut rest = doc;
    while let Some(at) = rest.find("<!-- dlkern-schema ") {
        let line_end = rest[at..].find("-->").ok_or("unterminated schema marker")? + at + 3;
        let name = rest[at + "<!-- dlkern-schema ".len()..line_end - 3].trim().to_string();
        let decl = declarations()
            .find(|d| d.name == name)
            .ok_or_else(|| format!("docs/ops.md has a schema block for '{name}', which no op declares"))?;
        let end =
            rest[line_end..].find(END).ok_or_else(|| format!("schema block '{name}' has no end marker"))? + line_end;
        out.push_str(&rest[..at]);
        out.push_str(&begin(&name));
        out.push('\n');
        out.push_str(&decl.schema_markdown());
        out.push_str(END);
        rest = &rest[end + END.len()..];
        names.push(name);
    }
    out.push_str(rest);
    Ok((out, names))
}

#[test]
fn docs_ops_md_matches_the_declarations() {
    let doc = std::fs::read_to_string(doc_path()).expect("docs/ops.md");
    let (generated, names) = regenerate(&doc).unwrap_or_else(|e| panic!("{e}"));
    for decl in declarations() {
        assert_eq!(
            names.iter().filter(|n| *n == decl.name).count(),
            1,
            "docs/ops.md needs exactly one `{}` block for op '{}'",
            begin(decl.name),
            decl.name
        );
    }
    if std::env::var_os("DLKERN_BLESS").is_some() {
        std::fs::write(doc_path(), &generated).expect("write docs/ops.md");
        return;
    }
    if generated != doc {
        let line = doc.lines().zip(generated.lines()).position(|(a, b)| a != b).map_or(0, |l| l + 1);
        panic!("docs/ops.md disagrees with the op declarations from line {line}; rerun with DLKERN_BLESS=1");
    }
}

#[test]
fn every_declared_name_is_registered_and_unique() {
    let names = dlkern::registry::names();
    let all: Vec<_> = declarations().collect();
    for (i, decl) in all.iter().enumerate() {
        assert!(names.iter().any(|n| n == decl.name), "'{}' is not in the registry", decl.name);
        assert!(all[..i].iter().all(|d| d.name != decl.name), "'{}' is declared twice", decl.name);
        let ort = decl.ort.as_ref().map(|o| o.name);
        assert!(
            ort.is_none() || all[..i].iter().all(|d| d.ort.as_ref().map(|o| o.name) != ort),
            "ORT op {ort:?} is declared twice"
        );
    }
}
