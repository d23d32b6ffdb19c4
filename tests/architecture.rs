//! The shape of the house, checked: the core stays pure, and the service's modules depend
//! only downwards, with no circle between them (ARCHITECTURE in README.md).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The service's top-level modules from the bottom up: a module may use those of a lower
/// layer, never one of its own or a higher one (the core is a crate below them all).
const LAYERS: &[&[&str]] = &[
    &["clock", "failpoint", "ids"],
    &["config", "metrics"],
    &["store"],
    &["tokens"],
    &["billing"],
    &["app"],
    &["http", "sim"],
    &["cli"],
];

/// Crates the core must never depend on: I/O, async runtimes, randomness.
const NOT_IN_CORE: &[&str] = &[
    "tokio", "sqlx", "axum", "reqwest", "hyper", "tower", "mio", "rand", "tracing", "moka",
];

/// What a pure function never calls: the clock, the file system, the network, processes.
const IMPURE: &[&str] = &[
    "Utc::now",
    "Local::now",
    "SystemTime",
    "Instant::now",
    "std::fs",
    "std::net",
    "std::process",
    "std::thread",
    "std::env",
    "tokio",
    "sqlx",
    "axum",
    "reqwest",
];

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    out.sort();
    out
}

/// The text without comments, so that prose may name what code may not use.
fn code_of(text: &str) -> String {
    text.lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn the_core_depends_on_nothing_that_does_io() {
    let manifest = std::fs::read_to_string(format!("{ROOT}/core/Cargo.toml")).unwrap();
    let deps = manifest
        .split("[dependencies]")
        .nth(1)
        .unwrap()
        .split("\n[")
        .next()
        .unwrap();
    for line in deps.lines().filter(|l| !l.trim_start().starts_with('#')) {
        let name = line.split('=').next().unwrap().trim();
        assert!(
            !NOT_IN_CORE.contains(&name),
            "core/Cargo.toml depends on {name}: the core does no I/O"
        );
        if name == "chrono" {
            assert!(
                !line.contains("\"clock\""),
                "the core's chrono must not have the `clock` feature: the core reads no clock"
            );
        }
    }
}

#[test]
fn no_core_file_reads_a_clock_or_does_io() {
    let mut found = Vec::new();
    for file in rust_files(Path::new(&format!("{ROOT}/core/src"))) {
        let code = code_of(&std::fs::read_to_string(&file).unwrap());
        for word in IMPURE {
            if code.contains(word) {
                found.push(format!("{}: {word}", file.display()));
            }
        }
    }
    assert!(found.is_empty(), "the core must stay pure: {found:#?}");
}

/// `(top, sub)` of a file under src/: `src/app/ingest.rs` is `("app", "ingest")`,
/// `src/app/mod.rs` is `("app", "")`, `src/config.rs` is `("config", "")`.
fn module_of(file: &Path) -> (String, String) {
    let rel = file.strip_prefix(format!("{ROOT}/src")).unwrap();
    let parts: Vec<String> = rel
        .components()
        .map(|c| {
            c.as_os_str()
                .to_string_lossy()
                .trim_end_matches(".rs")
                .to_owned()
        })
        .collect();
    match parts.as_slice() {
        [top] => (top.clone(), String::new()),
        [top, sub, ..] if sub == "mod" => (top.clone(), String::new()),
        [top, sub, ..] => (top.clone(), sub.clone()),
        [] => unreachable!(),
    }
}

/// Every `crate::a::b` a file names, as `(a, b)` (`b` empty when not a module of `a`).
fn uses(code: &str, modules: &BTreeMap<String, BTreeSet<String>>) -> BTreeSet<(String, String)> {
    let mut out = BTreeSet::new();
    for (i, _) in code.match_indices("crate::") {
        if code[..i].ends_with('$') {
            continue; // `$crate::` in a macro
        }
        let rest = &code[i + "crate::".len()..];
        let mut names = rest.split("::").map(|n| {
            n.split(|c: char| !(c.is_alphanumeric() || c == '_'))
                .next()
                .unwrap()
        });
        let top = names.next().unwrap_or("").to_owned();
        if let Some(subs) = modules.get(&top) {
            let sub = names.next().unwrap_or("").to_owned();
            let sub = if subs.contains(&sub) {
                sub
            } else {
                String::new()
            };
            out.insert((top, sub));
        }
    }
    out
}

fn dependency_graph() -> BTreeMap<(String, String), BTreeSet<(String, String)>> {
    let files = rust_files(Path::new(&format!("{ROOT}/src")));
    let mut modules: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in &files {
        let (top, sub) = module_of(f);
        modules.entry(top).or_default().insert(sub);
    }
    let mut graph: BTreeMap<(String, String), BTreeSet<(String, String)>> = BTreeMap::new();
    for f in &files {
        let from = module_of(f);
        if from.0 == "main" || from.0 == "lib" {
            continue;
        }
        let code = code_of(&std::fs::read_to_string(f).unwrap());
        let mut to = uses(&code, &modules);
        // `super::x` in src/top/sub.rs names a sibling, `top::x`.
        let depth = f
            .strip_prefix(format!("{ROOT}/src"))
            .unwrap()
            .components()
            .count();
        if depth == 2 && !from.1.is_empty() {
            for (i, _) in code.match_indices("super::") {
                let name: String = code[i + 7..]
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if modules[&from.0].contains(&name) {
                    to.insert((from.0.clone(), name));
                }
            }
        }
        to.remove(&from);
        graph.entry(from).or_default().extend(to);
    }
    graph
}

fn layer(top: &str) -> usize {
    LAYERS
        .iter()
        .position(|l| l.contains(&top))
        .unwrap_or_else(|| panic!("src/{top} is in no layer of tests/architecture.rs: place it"))
}

#[test]
fn modules_depend_only_on_lower_layers() {
    let mut wrong = Vec::new();
    for ((top, sub), to) in dependency_graph() {
        for (t, s) in to {
            if t != top && layer(&t) >= layer(&top) {
                wrong.push(format!("{top}::{sub} uses {t}::{s}"));
            }
        }
    }
    assert!(wrong.is_empty(), "dependencies must point down: {wrong:#?}");
}

#[test]
fn no_circle_between_modules() {
    let graph = dependency_graph();
    // Depth-first search for a back edge, at the level of a layer's modules.
    fn visit(
        node: &(String, String),
        graph: &BTreeMap<(String, String), BTreeSet<(String, String)>>,
        path: &mut Vec<(String, String)>,
        done: &mut BTreeSet<(String, String)>,
    ) -> Option<Vec<(String, String)>> {
        if let Some(i) = path.iter().position(|n| n == node) {
            return Some(path[i..].to_vec());
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.clone());
        for next in graph.get(node).into_iter().flatten() {
            // A module's own submodules are its parts, not a circle.
            if next.0 == node.0 && next.1.is_empty() {
                continue;
            }
            if let Some(c) = visit(next, graph, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(node.clone());
        None
    }
    let mut done = BTreeSet::new();
    for node in graph.keys() {
        if let Some(circle) = visit(node, &graph, &mut Vec::new(), &mut done) {
            let names: Vec<String> = circle.iter().map(|(t, s)| format!("{t}::{s}")).collect();
            panic!(
                "modules import each other in a circle: {}",
                names.join(" -> ")
            );
        }
    }
    assert!(
        graph.len() > 20,
        "the graph was read: {} modules",
        graph.len()
    );
}
