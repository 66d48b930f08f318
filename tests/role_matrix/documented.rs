//! The matrix docs/security.md shows is the one this file checks.

use super::*;

/// The names in backticks of docs/security.md's matrix row that begins
/// with `label`.
fn documented_functions(label: &str) -> BTreeSet<String> {
    let doc =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/security.md")).unwrap();
    let row = doc
        .lines()
        .find(|l| l.starts_with(&format!("| {label} (")))
        .unwrap_or_else(|| panic!("docs/security.md has no matrix row {label:?}"));
    // Only the first cell, the one that names the functions.
    let cell = row[2..].split(" |").next().unwrap();
    cell.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

fn short_names(signatures: &[&str]) -> BTreeSet<String> {
    signatures
        .iter()
        .map(|s| {
            s.trim_start_matches("shepherd.")
                .split('(')
                .next()
                .unwrap()
                .to_string()
        })
        .collect()
}

/// The matrix docs/security.md shows is the one this file checks against
/// the database: the same functions for each role, none missing from the
/// docs and none the docs name that the roles do not have.
#[test]
fn the_documented_matrix_is_the_one_checked() {
    let helpers = documented_functions("Read helpers");
    assert_eq!(helpers, short_names(READER_FUNCTIONS), "read helpers");
    let worker: BTreeSet<String> = documented_functions("Worker functions")
        .union(&helpers)
        .cloned()
        .collect();
    assert_eq!(worker, short_names(WORKER_FUNCTIONS), "worker functions");
    // The operator's, with `pause_*` standing for each pause.
    let documented = documented_functions("Operator functions");
    let called: BTreeSet<String> = OPERATOR_CALLS
        .iter()
        .map(|c| {
            c.trim_start_matches("select shepherd.")
                .split('(')
                .next()
                .unwrap()
                .to_string()
        })
        .collect();
    let covers = |doc: &str, name: &str| match doc.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => doc == name,
    };
    for name in &called {
        assert!(
            documented.iter().any(|d| covers(d, name)),
            "docs/security.md's operator row lacks {name}"
        );
    }
    for doc in &documented {
        assert!(
            called.iter().any(|n| covers(doc, n)),
            "docs/security.md names operator function {doc}, which no role check calls"
        );
    }
}
