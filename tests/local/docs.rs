//! The documents hold together: every relative link in the repository's Markdown points at
//! a file or directory that exists, and a `#fragment` at a heading of the linked document
//! (GitHub's anchors); every `make TARGET` the documents name in code is a target of the
//! Makefile; the README gives the commands `.ci/run` runs; and every shell block of the
//! operator pages is run by a test or says why not. Needs nothing running.
#![allow(clippy::unwrap_used)] // tests: a panic is a failure with its message

use testkit::pages::{self, Mark};

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::{Component, Path, PathBuf},
};

/// What the checks found in one tree.
#[derive(Debug, Default)]
struct Report {
    problems: Vec<String>,
    links: usize,
    anchors: usize,
    targets: usize,
}

/// One Markdown document, split into prose (inline code removed) and code (shell blocks
/// and inline code spans), each with its line number. Other fenced blocks (output, layout,
/// JSON) are neither: they hold no links and no commands.
struct Document {
    prose: Vec<(usize, String)>,
    code: Vec<(usize, String)>,
    anchors: BTreeSet<String>,
}

impl Document {
    fn parse(text: &str) -> Self {
        let mut document = Document {
            prose: Vec::new(),
            code: Vec::new(),
            anchors: BTreeSet::new(),
        };
        let mut seen: BTreeMap<String, usize> = BTreeMap::new();
        // Inside a fenced block: whether it is a shell block.
        let mut fenced: Option<bool> = None;
        for (index, line) in text.lines().enumerate() {
            let number = index + 1;
            if let Some(info) = line.trim_start().strip_prefix("```") {
                fenced = match fenced {
                    Some(_) => None,
                    None => Some(matches!(info.trim(), "" | "sh" | "shell" | "bash" | "console")),
                };
                continue;
            }
            if let Some(shell) = fenced {
                if shell {
                    document.code.push((number, line.to_owned()));
                }
                continue;
            }
            let (prose, spans) = split_inline_code(line);
            document.code.extend(spans.into_iter().map(|span| (number, span)));
            if let Some(heading) = heading(line) {
                // GitHub numbers repeated headings: slug, slug-1, slug-2…
                let slug = slug(heading);
                let count = seen.entry(slug.clone()).or_default();
                let anchor = if *count == 0 { slug } else { format!("{slug}-{count}") };
                *count += 1;
                document.anchors.insert(anchor);
            }
            document.prose.push((number, prose));
        }
        document
    }
}

/// The text of an ATX heading (`## Text`), if the line is one.
fn heading(line: &str) -> Option<&str> {
    let hashes = line.len() - line.trim_start_matches('#').len();
    (1..=6).contains(&hashes).then_some(())?;
    line[hashes..]
        .strip_prefix(' ')
        .map(|text| text.trim().trim_end_matches('#').trim())
}

/// GitHub's anchor for a heading: its text without markup, lowercased, with every
/// character but letters, digits, `_`, `-` and spaces dropped and spaces made `-`.
fn slug(heading: &str) -> String {
    let text = strip_links(heading);
    text.to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '_' | '-' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// `[text](target)` → `text`, for headings that hold links.
fn strip_links(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(open) = rest.find('[') {
        let Some(close) = rest[open..].find("](").map(|i| open + i) else {
            break;
        };
        let Some(end) = rest[close..].find(')').map(|i| close + i) else {
            break;
        };
        out.push_str(&rest[..open]);
        out.push_str(&rest[open + 1..close]);
        rest = &rest[end + 1..];
    }
    out.push_str(rest);
    out
}

/// Splits a line into its prose (inline code spans blanked out) and its code spans.
fn split_inline_code(line: &str) -> (String, Vec<String>) {
    let mut prose = String::new();
    let mut spans = Vec::new();
    let mut rest = line;
    while let Some(start) = rest.find('`') {
        let ticks = rest[start..].len() - rest[start..].trim_start_matches('`').len();
        let fence = &rest[start..start + ticks];
        let after = &rest[start + ticks..];
        let Some(end) = after.find(fence) else {
            break;
        };
        prose.push_str(&rest[..start]);
        prose.push(' ');
        spans.push(after[..end].to_owned());
        rest = &after[end + ticks..];
    }
    prose.push_str(rest);
    (prose, spans)
}

/// The targets of `[text](target)` and `![alt](target)` links in a line of prose.
fn link_targets(prose: &str) -> Vec<String> {
    let mut targets = Vec::new();
    let mut rest = prose;
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let Some(end) = after.find(')') else {
            break;
        };
        // A title after the target (`(path "title")`) is not part of it.
        let target = after[..end].split_whitespace().next().unwrap_or("");
        targets.push(target.to_owned());
        rest = &after[end + 1..];
    }
    targets
}

/// The targets named as `make TARGET` in a line of code; a shell comment is not code.
fn make_targets(code: &str) -> Vec<String> {
    let code = match code.find(" #") {
        Some(comment) => &code[..comment],
        None if code.trim_start().starts_with('#') => "",
        None => code,
    };
    let words: Vec<&str> = code
        .split(|c: char| c.is_whitespace() || matches!(c, ';' | '&' | '|' | '(' | ')'))
        .filter(|w| !w.is_empty())
        .collect();
    words
        .windows(2)
        .filter(|pair| pair[0] == "make")
        .map(|pair| pair[1])
        .filter(|word| !word.starts_with('-') && !word.contains('='))
        .map(str::to_owned)
        .collect()
}

/// The Makefile's targets (`name:` at the start of a line).
fn makefile_targets(makefile: &str) -> BTreeSet<String> {
    makefile
        .lines()
        .filter_map(|line| line.split_once(':').map(|(name, _)| name))
        .filter(|name| {
            !name.is_empty()
                && !name.starts_with('.')
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_'))
        })
        .map(str::to_owned)
        .collect()
}

/// Every Markdown file under `root`, but in build output and hidden directories.
fn markdown_files(root: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if path.is_dir() {
                if name != "target" && !name.starts_with('.') {
                    dirs.push(path);
                }
            } else if name.ends_with(".md") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// `base/relative` with `.` and `..` resolved, or `None` when it leaves `root`.
fn resolve(root: &Path, base: &Path, relative: &str) -> Option<PathBuf> {
    let mut path = base.to_path_buf();
    for component in Path::new(relative).components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                path.pop();
            }
            Component::Normal(part) => path.push(part),
            Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    path.starts_with(root).then_some(path)
}

/// Runs every check on the tree at `root`.
fn check(root: &Path) -> Report {
    let mut report = Report::default();
    let targets = makefile_targets(&fs::read_to_string(root.join("Makefile")).unwrap_or_default());
    let files = markdown_files(root);
    let documents: BTreeMap<PathBuf, Document> = files
        .iter()
        .map(|file| (file.clone(), Document::parse(&fs::read_to_string(file).unwrap())))
        .collect();
    for (file, document) in &documents {
        let shown = file.strip_prefix(root).unwrap().display().to_string();
        for (line, prose) in &document.prose {
            for target in link_targets(prose) {
                if target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                report.links += 1;
                let (path, fragment) = target.split_once('#').unwrap_or((&target, ""));
                let linked = if path.is_empty() {
                    Some(file.clone())
                } else {
                    resolve(root, file.parent().unwrap(), path)
                };
                let Some(linked) = linked.filter(|p| p.exists()) else {
                    report.problems.push(format!(
                        "{shown}:{line}: link to {target}: no such file in the repository"
                    ));
                    continue;
                };
                if fragment.is_empty() {
                    continue;
                }
                if let Some(target_document) = documents.get(&linked) {
                    report.anchors += 1;
                    if !target_document.anchors.contains(fragment) {
                        report
                            .problems
                            .push(format!("{shown}:{line}: link to {target}: no heading with that anchor"));
                    }
                }
            }
        }
        for (line, code) in &document.code {
            for target in make_targets(code) {
                report.targets += 1;
                if !targets.contains(&target) {
                    report.problems.push(format!(
                        "{shown}:{line}: `make {target}`: no such target in the Makefile"
                    ));
                }
            }
        }
    }
    report
}

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn every_link_anchor_and_make_target_in_the_documents_exists() {
    let report = check(repo());
    assert!(
        report.problems.is_empty(),
        "{} broken:\n{}",
        report.problems.len(),
        report.problems.join("\n")
    );
    // The checks found what the documents hold: a parser that finds nothing passes too.
    assert!(report.links >= 100, "only {} relative links found", report.links);
    assert!(report.anchors >= 30, "only {} anchors found", report.anchors);
    assert!(report.targets >= 20, "only {} make targets found", report.targets);
}

#[test]
fn the_readme_gives_the_commands_ci_runs() {
    let readme = Document::parse(&fs::read_to_string(repo().join("README.md")).unwrap());
    let named: BTreeSet<String> = readme.code.iter().flat_map(|(_, code)| make_targets(code)).collect();
    let ci = fs::read_to_string(repo().join(".ci/run")).unwrap();
    let run: Vec<String> = ci.lines().flat_map(make_targets).collect();
    assert!(run.contains(&"test".to_owned()), ".ci/run does not run make test");
    for target in &run {
        assert!(
            named.contains(target),
            "README.md never names `make {target}`, which .ci/run runs"
        );
    }
    let prose: String = readme
        .prose
        .iter()
        .map(|(_, p)| p.as_str())
        .collect::<Vec<_>>()
        .join(" ");
    assert!(
        prose.contains("is the test command"),
        "README.md must say that `make test` is the test command"
    );
}

#[test]
fn broken_links_anchors_and_targets_are_found() {
    let root = tempfile::tempdir().unwrap();
    let root = root.path();
    fs::create_dir(root.join("docs")).unwrap();
    fs::write(root.join("Makefile"), "run: ## Run\n\thack/local.sh up\n.PHONY: run\n").unwrap();
    fs::write(
        root.join("docs/page.md"),
        "# A page\n\n## Its `second` part: here\n\nBack to the [front](../README.md#the-front).\n",
    )
    .unwrap();
    fs::write(
        root.join("README.md"),
        "# The front\n\n\
         Good: [page](docs/page.md), [part](docs/page.md#its-second-part-here), [self](#the-front),\n\
         [web](https://example.com/missing), `[not a link](nowhere.md)`.\n\n\
         Broken: [gone](docs/gone.md), [anchor](docs/page.md#no-such-part), [out](../outside.md).\n\n\
         ```sh\nmake run     # make ignored in a comment\nCDS=1 make nothing ARGS=x\n```\n\n\
         And `make missing`, but prose may make sense.\n\n\
         ```text\n# make fenced-heading\nmake output-only\n```\n",
    )
    .unwrap();
    let report = check(root);
    let problems: Vec<&str> = report.problems.iter().map(String::as_str).collect();
    assert_eq!(
        problems,
        [
            "README.md:6: link to docs/gone.md: no such file in the repository",
            "README.md:6: link to docs/page.md#no-such-part: no heading with that anchor",
            "README.md:6: link to ../outside.md: no such file in the repository",
            "README.md:10: `make nothing`: no such target in the Makefile",
            "README.md:13: `make missing`: no such target in the Makefile",
        ],
        "{report:#?}"
    );
    assert_eq!(report.links, 7, "{report:#?}");
}

#[test]
fn anchors_are_githubs() {
    for (heading, anchor) in [
        ("`serve`: flags and environment", "serve-flags-and-environment"),
        (
            "A worker secret's life, and the race",
            "a-worker-secrets-life-and-the-race",
        ),
        (
            "10,000 pods in the namespace against 10",
            "10000-pods-in-the-namespace-against-10",
        ),
        ("Guard vs ceiling — HTTP/2", "guard-vs-ceiling--http2"),
        ("See [rules](rules.md) first", "see-rules-first"),
        ("snake_case and-dashes", "snake_case-and-dashes"),
    ] {
        assert_eq!(slug(heading), anchor, "{heading}");
    }
    let document = Document::parse("# Twice\n\n## Twice\n\n```sh\n# not a heading\n```\n");
    assert_eq!(
        document.anchors,
        BTreeSet::from(["twice".to_owned(), "twice-1".to_owned()])
    );
}

/// The rows of the first Markdown table after `heading` in `page`: its cells, trimmed.
fn table_after(page: &str, heading: &str) -> Vec<Vec<String>> {
    let text = fs::read_to_string(repo().join(page)).unwrap();
    let start = text
        .find(heading)
        .unwrap_or_else(|| panic!("{page} has no {heading:?}"));
    text[start..]
        .lines()
        .skip_while(|line| !line.starts_with('|'))
        .take_while(|line| line.starts_with('|'))
        .skip(2) // the header and its rule
        .map(|line| {
            line.trim_matches('|')
                .split(" | ")
                .map(|cell| cell.trim().to_owned())
                .collect()
        })
        .collect()
}

/// The `code spans` of a table cell.
fn spans(cell: &str) -> Vec<String> {
    split_inline_code(cell).1
}

/// docs/configuration.md's table of `serve` is the binary's: every flag with its variable
/// and its default, and no other.
#[test]
fn the_serve_flags_documented_are_the_binarys() {
    use clap::CommandFactory;
    let cli = cds_secret_guard::cli::Cli::command();
    let serve = cli.find_subcommand("serve").unwrap();
    let mut binary = BTreeMap::new();
    for arg in serve.get_arguments().filter(|arg| arg.get_long().is_some()) {
        let long = format!("--{}", arg.get_long().unwrap());
        if long == "--help" {
            continue;
        }
        let env = arg.get_env().map(|env| env.to_string_lossy().into_owned());
        let defaults: Vec<String> = arg
            .get_default_values()
            .iter()
            .map(|value| value.to_string_lossy().into_owned())
            .collect();
        binary.insert(long, (env, defaults.join(",")));
    }
    let rows = table_after("docs/configuration.md", "## `serve`: flags and environment");
    let mut documented = BTreeSet::new();
    for row in &rows {
        let flag = spans(&row[0]).into_iter().next().unwrap_or_default();
        let (env, default) = binary
            .get(&flag)
            .unwrap_or_else(|| panic!("docs/configuration.md documents {flag}, which serve does not take"));
        assert_eq!(spans(&row[1]).first(), env.as_ref(), "{flag}'s variable");
        if !default.is_empty() {
            assert_eq!(spans(&row[2]).first(), Some(default), "{flag}'s default");
        }
        documented.insert(flag);
    }
    let missing: Vec<&String> = binary.keys().filter(|flag| !documented.contains(*flag)).collect();
    assert!(
        missing.is_empty(),
        "serve flags missing from docs/configuration.md: {missing:?}"
    );
}

/// docs/configuration.md's table of chart values names every value of values.yaml, and
/// only those (a documented key covers the values under it).
#[test]
fn the_chart_values_documented_are_values_yaml() {
    fn leaves(prefix: &str, value: &serde_json::Value, out: &mut BTreeSet<String>) {
        match value.as_object() {
            Some(map) if !map.is_empty() => {
                for (key, child) in map {
                    let path = if prefix.is_empty() {
                        key.clone()
                    } else {
                        format!("{prefix}.{key}")
                    };
                    leaves(&path, child, out);
                }
            }
            _ => {
                out.insert(prefix.to_owned());
            }
        }
    }
    let values: serde_json::Value = serde_saphyr::from_str(
        &fs::read_to_string(repo().join("manifests/helm/cds-secret-guard/values.yaml")).unwrap(),
    )
    .unwrap();
    let mut chart = BTreeSet::new();
    leaves("", &values, &mut chart);

    let mut documented = BTreeSet::new();
    for row in table_after("docs/configuration.md", "## Helm chart values") {
        // `a.b.c`, `.d`: the second is a sibling of the first.
        let mut last = String::new();
        for key in spans(&row[0]) {
            let key = match key.strip_prefix('.') {
                Some(sibling) => format!("{}.{sibling}", last.rsplit_once('.').map_or("", |(parent, _)| parent)),
                None => key,
            };
            last = key.clone();
            documented.insert(key);
        }
    }
    for key in &documented {
        assert!(
            chart
                .iter()
                .any(|leaf| leaf == key || leaf.starts_with(&format!("{key}."))),
            "docs/configuration.md documents the value {key}, which values.yaml does not have"
        );
    }
    let undocumented: Vec<&String> = chart
        .iter()
        .filter(|leaf| {
            !documented
                .iter()
                .any(|key| *leaf == key || leaf.starts_with(&format!("{key}.")))
        })
        .collect();
    assert!(
        undocumented.is_empty(),
        "values.yaml values missing from docs/configuration.md: {undocumented:?}"
    );
}

/// The text of every Rust file of the tests and of testkit, without whitespace (rustfmt
/// may break a call over lines).
fn test_sources() -> String {
    let mut text = String::new();
    let mut dirs = vec![repo().join("tests"), repo().join("testkit/src")];
    while let Some(dir) = dirs.pop() {
        for entry in fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                let source = fs::read_to_string(&path).unwrap();
                text.extend(source.chars().filter(|c| !c.is_whitespace()));
            }
        }
    }
    text
}

/// Every shell block of the operator pages (README.md, `docs/*.md`) is either read from
/// the page and run by a test (`<!-- run: ID -->`, and a test names that page and id), or
/// says on the page why it is not run here (`<!-- not run here: REASON -->`). Prints each
/// block's status.
#[test]
fn every_command_block_of_the_operator_pages_is_run_or_says_why_not() {
    let sources = test_sources();
    let mut problems = Vec::new();
    let mut ids = BTreeSet::new();
    let (mut run, mut not_run) = (0, 0);
    for block in pages::all_blocks() {
        let at = format!("{}:{}", block.page, block.line);
        match &block.mark {
            Mark::Run(id) => {
                run += 1;
                println!("{at:28} run: {id}");
                if !ids.insert((block.page.clone(), id.clone())) {
                    problems.push(format!("{at}: a second block marked run: {id}"));
                }
                if !sources.contains(&format!("\"{}\",\"{id}\"", block.page)) {
                    problems.push(format!(
                        "{at}: marked run: {id}, but no test reads it (as (\"{}\", \"{id}\"))",
                        block.page
                    ));
                }
            }
            Mark::NotRun(reason) => {
                not_run += 1;
                println!("{at:28} not run here: {reason}");
            }
            Mark::Unmarked => problems.push(format!(
                "{at}: a shell block neither run by a test (<!-- run: ID -->) nor marked <!-- not run here: REASON -->"
            )),
        }
    }
    println!("{run} blocks run by the tests, {not_run} not run here");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    // The pages hold about fifty: a parser that finds none passes too.
    assert!(run + not_run >= 40, "only {} shell blocks found", run + not_run);
}

#[test]
fn unmarked_blocks_and_marks_without_a_reason_are_found() {
    let page = "Text.\n\n```sh\nls\n```\n<!-- not run here: -->\n```sh\nls\n```\n\
                <!-- run: listing -->\n```sh\nls\n```\n<!-- not run here: why -->\n```text\nout\n```\n\
                <!-- not run here: a reason -->\n```sh\nls\n```\n";
    let blocks = pages::parse("page.md", page);
    let marks: Vec<&Mark> = blocks.iter().map(|block| &block.mark).collect();
    assert_eq!(
        marks,
        [
            &Mark::Unmarked,
            &Mark::Unmarked,
            &Mark::Run("listing".into()),
            &Mark::NotRun("a reason".into())
        ]
    );
    assert_eq!((blocks[2].line, blocks[2].text.as_str()), (11, "ls\n"));
}
