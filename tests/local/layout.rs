//! The folders of `src/` are layers (ARCHITECTURE.md): each builds on the ones below it,
//! nothing imports back up, and the two rule sets do not import each other.
//!
//! The graph is read from the sources: a module `a` depends on `b` when its code (test
//! modules, test files and doc comments aside) names `crate::b`, directly or in a
//! `use crate::{…}` group. The modules are the top-level ones (`src/api/handlers.rs`
//! belongs to `api`); `lib.rs` and `main.rs` are the root and only declare or call them.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::{Path, PathBuf},
};

/// Module → the modules it names.
type Graph = BTreeMap<String, BTreeSet<String>>;

#[test]
fn the_modules_import_each_other_in_no_circle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graph = graph(&src);
    assert!(
        graph.len() >= 8 && graph.values().any(|names| !names.is_empty()),
        "the modules were not read: {graph:?}"
    );
    if let Some(cycle) = cycle(&graph) {
        panic!("the modules import each other in a circle: {}", cycle.join(" → "));
    }
}

/// The layers, from the top down, as ARCHITECTURE.md draws them; a module may name the
/// modules of lower layers only.
const LAYERS: [&[&str]; 7] = [
    &["cli"],
    &["server"],
    &["api"],
    &["config"],
    &["rules", "certs"],
    &["cluster"],
    &["observe"],
];

#[test]
fn no_module_imports_one_of_a_higher_layer() {
    let graph = graph(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    let layer = |module: &str| {
        LAYERS
            .iter()
            .position(|layer| layer.contains(&module))
            .unwrap_or_else(|| panic!("src/{module} is in no layer of LAYERS"))
    };
    for (module, names) in &graph {
        for name in names {
            assert!(
                layer(name) > layer(module),
                "{module} imports {name}, which is not in a lower layer"
            );
        }
    }
}

#[test]
fn the_rule_sets_do_not_import_each_other() {
    let rules = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/rules");
    for (set, other) in [("worker", "in_use"), ("in_use", "worker")] {
        let mut files = Vec::new();
        rust_files(&rules.join(set), &mut files);
        assert!(!files.is_empty(), "no file under src/rules/{set}");
        for file in files.iter().filter(|file| !is_test_file(file)) {
            let code = strip(&fs::read_to_string(file).unwrap_or_else(|error| panic!("{}: {error}", file.display())));
            let named = [format!("{other}::"), format!("{other},"), format!("{other}}}")]
                .iter()
                .any(|path| code.contains(path.as_str()));
            assert!(!named, "{} names the other rule set, {other}", file.display());
        }
    }
}

/// Test code: a `tests.rs` beside the code it tests, and the unit tests' builders.
fn is_test_file(file: &Path) -> bool {
    file.file_name()
        .is_some_and(|name| name == "tests.rs" || name == "fixtures.rs")
}

#[test]
fn a_circle_is_found_and_named() {
    let modules = |edges: &[(&str, &str)]| {
        let mut graph = Graph::new();
        for (from, to) in edges {
            graph.entry((*from).into()).or_default().insert((*to).into());
            graph.entry((*to).into()).or_default();
        }
        graph
    };
    assert_eq!(cycle(&modules(&[("a", "b"), ("b", "c"), ("a", "c")])), None);
    assert_eq!(
        cycle(&modules(&[("a", "b"), ("b", "c"), ("c", "a"), ("d", "a")])),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );

    let names = |code: &str| {
        references(
            &strip(code),
            &["lookup", "pod", "pod_cache", "policy"].map(String::from).into(),
        )
    };
    assert_eq!(
        names(
            "use crate::{\n    Error, Result,\n    lookup::{ClusterLookup, PodState},\n    pod::{PodLiveness, WorkerPod},\n};"
        ),
        ["lookup", "pod"].map(String::from).into()
    );
    assert_eq!(
        names("fn f() { crate::policy::pod_owners(x); }\n/// See [`crate::pod_cache`].\n// crate::lookup\n"),
        ["policy"].map(String::from).into(),
        "doc comments and comments are not imports"
    );
    assert_eq!(
        names(
            "use crate::pod::PodState;\n#[cfg(test)]\nmod tests {\n    use crate::lookup::X;\n    fn f() { let _ = {}; }\n}\n"
        ),
        ["pod"].map(String::from).into(),
        "test modules are not part of the layout"
    );
}

/// The dependency graph of the top-level modules under `src`.
fn graph(src: &Path) -> Graph {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let module_of = |file: &Path| -> Option<String> {
        let relative = file.strip_prefix(src).ok()?;
        let first = relative.components().next()?.as_os_str().to_str()?;
        let name = first.strip_suffix(".rs").unwrap_or(first);
        (!matches!(name, "lib" | "main")).then(|| name.to_owned())
    };
    files.retain(|file| !is_test_file(file));
    let modules: BTreeSet<String> = files.iter().filter_map(|file| module_of(file)).collect();
    let mut graph: Graph = modules.iter().map(|module| (module.clone(), BTreeSet::new())).collect();
    for file in &files {
        let Some(module) = module_of(file) else {
            continue;
        };
        let code = fs::read_to_string(file).unwrap_or_else(|error| panic!("{}: {error}", file.display()));
        let names = references(&strip(&code), &modules);
        let edges = graph.entry(module.clone()).or_default();
        edges.extend(names.into_iter().filter(|name| *name != module));
    }
    graph
}

fn rust_files(dir: &Path, files: &mut Vec<PathBuf>) {
    let entries = fs::read_dir(dir).unwrap_or_else(|error| panic!("{}: {error}", dir.display()));
    for entry in entries {
        let path = entry
            .unwrap_or_else(|error| panic!("{}: {error}", dir.display()))
            .path();
        if path.is_dir() {
            rust_files(&path, files);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            files.push(path);
        }
    }
}

/// The code without its comments and without its `#[cfg(test)] mod … { … }` blocks.
fn strip(code: &str) -> String {
    let uncommented: String = code
        .lines()
        .map(|line| line.find("//").map_or(line, |at| &line[..at]))
        .collect::<Vec<_>>()
        .join("\n");
    let mut kept = String::new();
    let mut rest = uncommented.as_str();
    while let Some(at) = rest.find("#[cfg(test)]") {
        kept.push_str(&rest[..at]);
        let after = &rest[at + "#[cfg(test)]".len()..];
        let is_module = after.trim_start().starts_with("mod ") || after.trim_start().starts_with("pub(crate) mod ");
        let block = after.find(['{', ';']).filter(|_| is_module);
        match block {
            Some(open) if after.as_bytes()[open] == b'{' => {
                let mut depth = 0usize;
                let mut end = after.len();
                for (index, byte) in after.bytes().enumerate().skip(open) {
                    match byte {
                        b'{' => depth += 1,
                        b'}' => {
                            depth -= 1;
                            if depth == 0 {
                                end = index + 1;
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                rest = &after[end..];
            }
            // `#[cfg(test)] mod fixtures;` declares a test-only module: skip the line.
            Some(semicolon) => rest = &after[semicolon + 1..],
            None => rest = after,
        }
    }
    kept.push_str(rest);
    kept
}

/// The modules among `modules` that `code` names through `crate::`.
fn references(code: &str, modules: &BTreeSet<String>) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        let firsts = if rest.starts_with('{') {
            group_heads(rest)
        } else {
            vec![identifier(rest)]
        };
        found.extend(
            firsts
                .into_iter()
                .filter(|name| modules.contains(*name))
                .map(str::to_owned),
        );
    }
    found
}

/// The first path segment of each item of the `{…}` group that `code` starts with.
fn group_heads(code: &str) -> Vec<&str> {
    let mut heads = Vec::new();
    let mut depth = 0usize;
    let mut item_start = true;
    for (index, char) in code.char_indices() {
        match char {
            '{' => {
                depth += 1;
                item_start = depth == 1;
            }
            '}' => {
                depth -= 1;
                if depth == 0 {
                    break;
                }
            }
            ',' if depth == 1 => item_start = true,
            char if item_start && depth == 1 && !char.is_whitespace() => {
                heads.push(identifier(&code[index..]));
                item_start = false;
            }
            _ => {}
        }
    }
    heads
}

fn identifier(code: &str) -> &str {
    let end = code
        .find(|char: char| !(char.is_alphanumeric() || char == '_'))
        .unwrap_or(code.len());
    &code[..end]
}

/// A circle of the graph, as the modules along it with the first repeated at the end.
fn cycle(graph: &Graph) -> Option<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        Open,
        Done,
    }
    fn visit<'a>(
        graph: &'a Graph,
        module: &'a str,
        marks: &mut BTreeMap<&'a str, Mark>,
        path: &mut Vec<&'a str>,
    ) -> Option<Vec<String>> {
        match marks.get(module) {
            Some(Mark::Done) => return None,
            Some(Mark::Open) => {
                let start = path.iter().position(|on| *on == module).unwrap_or(0);
                let mut cycle: Vec<String> = path[start..].iter().map(|name| (*name).to_owned()).collect();
                cycle.push(module.to_owned());
                return Some(cycle);
            }
            None => {}
        }
        marks.insert(module, Mark::Open);
        path.push(module);
        for next in graph.get(module).into_iter().flatten() {
            if let Some(cycle) = visit(graph, next, marks, path) {
                return Some(cycle);
            }
        }
        path.pop();
        marks.insert(module, Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    graph
        .keys()
        .find_map(|module| visit(graph, module, &mut marks, &mut Vec::new()))
}

/// ARCHITECTURE.md maps the tree: every folder of `src/` it names exists, and it names
/// every folder at the top of `src/` and under `src/rules/`.
#[test]
fn the_architecture_page_names_every_folder_and_only_folders_that_exist() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let page = fs::read_to_string(root.join("ARCHITECTURE.md")).expect("ARCHITECTURE.md at the root");
    let named: BTreeSet<&str> = page
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|code| code.starts_with("src/") && code.ends_with('/'))
        .collect();
    assert!(named.len() >= 5, "no folder of src/ named: {named:?}");
    for folder in &named {
        assert!(
            root.join(folder).is_dir(),
            "ARCHITECTURE.md names {folder}, which does not exist"
        );
    }
    for parent in ["src", "src/rules"] {
        let entries = fs::read_dir(root.join(parent)).unwrap_or_else(|error| panic!("{parent}: {error}"));
        for entry in entries {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                let name = path.file_name().and_then(|name| name.to_str()).expect("a UTF-8 name");
                let folder = format!("{parent}/{name}/");
                assert!(
                    named.contains(folder.as_str()),
                    "ARCHITECTURE.md does not name {folder}"
                );
            }
        }
    }
}
