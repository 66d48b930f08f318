//! The docs name only settings that exist, and docs/configuration.md names
//! every setting of the worker.
//!
//! Flags and variables are renamed, added and removed in the code, and the
//! prose that names them (README.md, ARCHITECTURE.md, docs/*.md) does not
//! follow on its own: an operator who copies a flag that is gone gets an
//! error, and one who sets a variable nothing reads gets a setting silently
//! ignored. So the binary's own `--help`, walked through every subcommand,
//! is the list of what exists: every `--flag` and every `SHEPHERD_*`,
//! `LATITUDE_*`, `METAL_*`, `FAKE_METAL_*` and `FAKE_LATITUDE_*` name in
//! the docs must be in it, or in one of the two short allow-lists below,
//! each entry with its reason. And a flag added to the worker fails here
//! until docs/configuration.md says what it does.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// Flags of other tools that the docs show in commands to type. Each must
/// still be used by some doc (the first test says when one is not), so the
/// list stays as short as the docs need.
const OTHER_TOOLS_FLAGS: &[&str] = &[
    // cargo build --release (README.md, docs/operations.md)
    "--release",
    // cargo build ... --bin shepherd (docs/operations.md)
    "--bin",
    // cargo test --workspace --all-targets, what scripts/test runs (README.md)
    "--workspace",
    "--all-targets",
    // cargo fmt --check, what .ci/run runs (README.md)
    "--check",
    // docker compose up --build (README.md)
    "--build",
    // scripts/bench --quick, the benchmarks' short run (README.md)
    "--quick",
];

/// Variables that exist but that no `[env: ...]` of shepherd's help shows:
/// read with `std::env::var` rather than through clap, or read by the
/// tests, the scripts and the benchmarks.
const ENV_READ_OUTSIDE_CLAP: &[&str] = &[
    // The API token and key, read by workers/src/settings.rs (never a flag
    // value, which `ps` would show).
    "METAL_AUTH_TOKEN",
    "LATITUDE_API_KEY",
    // The token of the demo's fake (workers/src/commands/demo.rs; the
    // secrecy test sets a recognisable one).
    "SHEPHERD_DEMO_TOKEN",
    // The browser tests: whether to write the screenshots, where Chromium
    // and its driver are (workers/tests/web/browser.rs, scripts/test).
    "SHEPHERD_SCREENSHOTS",
    "SHEPHERD_CHROMEDRIVER",
    "SHEPHERD_CHROMIUM",
    // promtool for the metrics tests (workers/tests/metrics.rs,
    // scripts/tools.sh).
    "SHEPHERD_PROMTOOL",
    // The hostile API's fuzzing: its seed and size (tests/hostile_api.rs).
    "SHEPHERD_FUZZ_SEED",
    "SHEPHERD_FUZZ_CASES",
    // The chaos runs' sizes and weather (workers/tests/chaos.rs,
    // workers/tests/chaos_latitude.rs, scripts/chaos).
    "SHEPHERD_CHAOS_RESERVATIONS",
    "SHEPHERD_CHAOS_MAX",
    "SHEPHERD_CHAOS_KILL_EVERY_MS",
    "SHEPHERD_CHAOS_TIMEOUT_SECS",
    "SHEPHERD_CHAOS_LAG_MS",
    "SHEPHERD_CHAOS_HIDDEN_MS",
    // shepherd-bench's database: its own flag's variable (bench/src/lib.rs),
    // set by scripts/bench.
    "SHEPHERD_BENCH_DATABASE_URL",
];

/// Prefixes of the environment variables the docs are checked for.
const ENV_PREFIXES: &[&str] = &[
    "SHEPHERD_",
    "LATITUDE_",
    "METAL_",
    "FAKE_METAL_",
    "FAKE_LATITUDE_",
];

/// Subcommands the walk must reach: a help it could not parse would let
/// every doc through the first test and none through the third.
const WALKED: &[&str] = &[
    "",
    "worker",
    "scheduler",
    "pools plan",
    "machines release",
    "fake-latitude",
];

/// `shepherd <path> --help`, with an empty environment: no variable of the
/// test's runner shows up as a value, or changes what is printed.
fn help_of(path: &[String]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_shepherd"))
        .args(path)
        .arg("--help")
        .env_clear()
        .output()
        .expect("shepherd runs");
    assert!(
        out.status.success(),
        "shepherd {} --help failed ({}): {}",
        path.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("the help is UTF-8")
}

/// The subcommands a help lists under "Commands:", without `help`. A
/// command's line is indented by two spaces (`  name  description`); a
/// deeper line continues a description, and a blank line ends the list.
fn subcommands(help: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut listing = false;
    for line in help.lines() {
        if !listing {
            listing = line.trim_end() == "Commands:";
            continue;
        }
        if line.trim().is_empty() {
            break;
        }
        let Some(rest) = line.strip_prefix("  ") else {
            break;
        };
        if rest.starts_with(' ') {
            continue;
        }
        if let Some(name) = rest.split_whitespace().next()
            && name != "help"
        {
            names.push(name.to_string());
        }
    }
    names
}

/// Every subcommand's help, by its path (`""` for `shepherd` itself,
/// `"pools plan"`), walked once for all the tests of this file.
fn every_help() -> &'static BTreeMap<String, String> {
    static HELP: OnceLock<BTreeMap<String, String>> = OnceLock::new();
    HELP.get_or_init(|| {
        let mut found = BTreeMap::new();
        let mut todo: Vec<Vec<String>> = vec![vec![]];
        while let Some(path) = todo.pop() {
            assert!(path.len() <= 4, "subcommands nested too deep: {path:?}");
            let help = help_of(&path);
            for name in subcommands(&help) {
                let mut sub = path.clone();
                sub.push(name);
                todo.push(sub);
            }
            found.insert(path.join(" "), help);
        }
        for known in WALKED {
            assert!(
                found.contains_key(*known),
                "`shepherd {known} --help` was not reached; walked: {:?}",
                found.keys().collect::<Vec<_>>()
            );
        }
        found
    })
}

/// A byte that continues a word: `--` right after one starts no flag.
fn in_word(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'-' || b == b'_'
}

/// A byte a flag's name may hold after its first letter.
fn in_flag(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'
}

/// A character of a word of the docs' text.
fn in_text_word(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// A byte of an environment variable's name.
fn in_env_name(b: u8) -> bool {
    b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_'
}

/// The `--flag` tokens of a line: `--` not right after a letter, digit,
/// `-` or `_`, then a lowercase letter and more lowercase letters, digits
/// or dashes (`--[a-z][a-z0-9-]+`), trailing dashes dropped.
fn flag_tokens(line: &str) -> Vec<String> {
    let b = line.as_bytes();
    let mut tokens = Vec::new();
    let mut i = 0;
    while i + 2 < b.len() {
        let starts = b[i] == b'-' && b[i + 1] == b'-' && b[i + 2].is_ascii_lowercase();
        if !starts || (i > 0 && in_word(b[i - 1])) {
            i += 1;
            continue;
        }
        let mut j = i + 2;
        while j < b.len() && in_flag(b[j]) {
            j += 1;
        }
        // Only ASCII up to `j`: both ends are character boundaries.
        let token = line[i..j].trim_end_matches('-');
        if token.len() >= 4 {
            tokens.push(token.to_string());
        }
        i = j;
    }
    tokens
}

/// A whole word in capitals that starts with one of `ENV_PREFIXES` and
/// goes on after it, as
/// `\b(SHEPHERD|LATITUDE|METAL|FAKE_METAL|FAKE_LATITUDE)_[A-Z0-9_]+\b`
/// would find it.
fn is_env_name(word: &str) -> bool {
    let prefixed = |p: &&str| word.len() > p.len() && word.starts_with(*p);
    word.bytes().all(in_env_name) && ENV_PREFIXES.iter().any(prefixed)
}

/// The environment variables a line names: its words (letters, digits and
/// `_`) that are such names.
fn env_tokens(line: &str) -> Vec<String> {
    let mut names = Vec::new();
    for word in line.split(|c: char| !in_text_word(c)) {
        if is_env_name(word) {
            names.push(word.to_string());
        }
    }
    names
}

/// The names clap shows as `[env: NAME=value]`, `[env: NAME=]` or, for a
/// hidden value, `[env: NAME]`.
fn env_names_in_help(help: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for (at, marker) in help.match_indices("[env:") {
        let rest = help[at + marker.len()..].trim_start();
        let end = rest.bytes().take_while(|b| in_env_name(*b)).count();
        let (name, after) = rest.split_at(end);
        if !name.is_empty() && after.starts_with(['=', ']']) {
            names.insert(name.to_string());
        }
    }
    names
}

/// Every long flag any help shows, with its aliases and the flags its
/// descriptions name.
fn help_flags() -> BTreeSet<String> {
    let mut flags: BTreeSet<String> = BTreeSet::new();
    for help in every_help().values() {
        for line in help.lines() {
            flags.extend(flag_tokens(line));
        }
    }
    flags
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A file of the repository, by its path from the root.
fn read(name: &str) -> String {
    std::fs::read_to_string(root().join(name)).unwrap_or_else(|e| panic!("cannot read {name}: {e}"))
}

/// README.md, ARCHITECTURE.md and docs/*.md, by their paths from the
/// repository's root, with their text.
fn docs() -> Vec<(String, String)> {
    let dir = root().join("docs");
    let mut pages = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("docs/ lists") {
        let path = entry.expect("docs/ lists").path();
        if path.is_file() && path.extension().is_some_and(|x| x == "md") {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            pages.push(format!("docs/{name}"));
        }
    }
    pages.sort();
    assert!(
        dir.join("configuration.md").is_file(),
        "docs/configuration.md not found under {}",
        dir.display()
    );
    let mut names = vec!["README.md".to_string(), "ARCHITECTURE.md".to_string()];
    names.extend(pages);
    let mut docs = Vec::new();
    for name in names {
        let text = read(&name);
        docs.push((name, text));
    }
    docs
}

#[test]
fn every_flag_the_docs_name_exists() {
    let known = help_flags();
    for flag in OTHER_TOOLS_FLAGS {
        assert!(
            !known.contains(*flag),
            "{flag} is shepherd's own flag now: take it out of OTHER_TOOLS_FLAGS"
        );
    }
    let mut missing = Vec::new();
    let mut used = BTreeSet::new();
    for (name, text) in docs() {
        for (n, line) in text.lines().enumerate() {
            for token in flag_tokens(line) {
                if known.contains(&token) {
                    continue;
                }
                if OTHER_TOOLS_FLAGS.contains(&token.as_str()) {
                    used.insert(token);
                    continue;
                }
                missing.push(format!("{name}:{}: {token}", n + 1));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "the docs name flags no `shepherd ... --help` shows (rename or remove them; a flag of \
         another tool goes in OTHER_TOOLS_FLAGS, with why):\n{}",
        missing.join("\n")
    );
    let mut unused = Vec::new();
    for flag in OTHER_TOOLS_FLAGS {
        if !used.contains(*flag) {
            unused.push(*flag);
        }
    }
    assert!(
        unused.is_empty(),
        "no doc names these any more: take them out of OTHER_TOOLS_FLAGS: {unused:?}"
    );
}

#[test]
fn every_environment_variable_the_docs_name_exists() {
    let mut known: BTreeSet<String> = BTreeSet::new();
    for help in every_help().values() {
        known.extend(env_names_in_help(help));
    }
    assert!(
        known.contains("DATABASE_URL") && known.contains("SHEPHERD_LOG"),
        "the help's [env: ...] markers were not found: {known:?}"
    );
    let mut missing = Vec::new();
    for (name, text) in docs() {
        for (n, line) in text.lines().enumerate() {
            for token in env_tokens(line) {
                let read_elsewhere = ENV_READ_OUTSIDE_CLAP.contains(&token.as_str());
                if !known.contains(&token) && !read_elsewhere {
                    missing.push(format!("{name}:{}: {token}", n + 1));
                }
            }
        }
    }
    assert!(
        missing.is_empty(),
        "the docs name environment variables no `shepherd ... --help` shows (rename or remove \
         them; one read outside clap goes in ENV_READ_OUTSIDE_CLAP, with where):\n{}",
        missing.join("\n")
    );
}

#[test]
fn configuration_md_lists_every_flag_of_the_worker() {
    let mut worker: BTreeSet<String> = BTreeSet::new();
    for line in every_help()["worker"].lines() {
        worker.extend(flag_tokens(line));
    }
    // clap's own, which every subcommand takes.
    worker.remove("--help");
    worker.remove("--version");
    assert!(
        worker.contains("--max-machines") && worker.contains("--scheduler"),
        "the worker's flags were not found in its help: {worker:?}"
    );
    let mut documented: BTreeSet<String> = BTreeSet::new();
    for line in read("docs/configuration.md").lines() {
        documented.extend(flag_tokens(line));
    }
    let missing: Vec<&String> = worker.difference(&documented).collect();
    assert!(
        missing.is_empty(),
        "docs/configuration.md does not name these flags of `shepherd worker`; say there what \
         each does: {missing:?}"
    );
}
