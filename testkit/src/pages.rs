//! The shell blocks of the operator pages (README.md and `docs/*.md`, not `docs/design/`),
//! each marked on the line above its fence: `<!-- run: ID -->` when a test runs it, read
//! from the page by [`block`], or `<!-- not run here: REASON -->`.

use std::path::PathBuf;

use crate::repo;

/// What the line above a shell block says about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mark {
    /// Run by a test, which names it by `page` and this id.
    Run(String),
    /// Not run by the tests, for this reason.
    NotRun(String),
    Unmarked,
}

/// One shell block of a page.
#[derive(Debug, Clone)]
pub struct Block {
    /// Relative to the repository, as `docs/install.md`.
    pub page: String,
    /// The line of its opening fence.
    pub line: usize,
    pub mark: Mark,
    pub text: String,
}

/// The operator pages: README.md and `docs/*.md`.
pub fn operator_pages() -> Vec<String> {
    let mut pages = vec!["README.md".to_owned()];
    let mut docs: Vec<String> = std::fs::read_dir(repo().join("docs"))
        .expect("docs/")
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .map(|path| format!("docs/{}", path.file_name().unwrap_or_default().to_string_lossy()))
        .collect();
    docs.sort();
    pages.extend(docs);
    pages
}

/// The shell blocks (` ```sh `) of `text`, the page `page`.
pub fn parse(page: &str, text: &str) -> Vec<Block> {
    let lines: Vec<&str> = text.lines().collect();
    let mut blocks = Vec::new();
    let mut index = 0;
    while index < lines.len() {
        let Some(info) = lines[index].trim_start().strip_prefix("```") else {
            index += 1;
            continue;
        };
        let end = (index + 1..lines.len())
            .find(|&end| lines[end].trim_start().starts_with("```"))
            .unwrap_or(lines.len());
        if matches!(info.trim(), "sh" | "shell" | "bash") {
            let above = index
                .checked_sub(1)
                .map(|above| lines[above].trim())
                .unwrap_or_default();
            let mark = match above.strip_prefix("<!--").and_then(|c| c.strip_suffix("-->")) {
                Some(comment) => match comment.trim().split_once(':') {
                    Some(("run", id)) => Mark::Run(id.trim().to_owned()),
                    Some(("not run here", reason)) if !reason.trim().is_empty() => {
                        Mark::NotRun(reason.trim().to_owned())
                    }
                    _ => Mark::Unmarked,
                },
                None => Mark::Unmarked,
            };
            blocks.push(Block {
                page: page.to_owned(),
                line: index + 1,
                mark,
                text: lines[index + 1..end].join("\n") + "\n",
            });
        }
        index = end + 1;
    }
    blocks
}

/// Every shell block of the operator pages.
pub fn all_blocks() -> Vec<Block> {
    operator_pages()
        .iter()
        .flat_map(|page| parse(page, &read(page)))
        .collect()
}

/// The block of `page` marked `<!-- run: id -->`, as the page writes it.
pub fn block(page: &str, id: &str) -> String {
    parse(page, &read(page))
        .into_iter()
        .find(|block| block.mark == Mark::Run(id.to_owned()))
        .unwrap_or_else(|| panic!("{page} has no shell block marked <!-- run: {id} -->"))
        .text
}

fn read(page: &str) -> String {
    let path: PathBuf = repo().join(page);
    std::fs::read_to_string(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
}

/// A shell that runs the pages' blocks as an operator's terminal would: in `dir`, with
/// the control plane's kubectl, the tools (helm, crane, cosign) and the guard's binary on
/// `PATH` and `KUBECONFIG` set, the page's example values replaced by this cluster's.
pub struct Shell {
    dir: PathBuf,
    env: Vec<(String, String)>,
    substitutions: Vec<(String, String)>,
}

/// What a block did: its exit status and its output (stdout and stderr, interleaved).
pub struct Ran {
    pub status: std::process::ExitStatus,
    pub output: String,
}

/// A block that runs longer is stuck.
const BLOCK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(900);

impl Shell {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        let guard_bin = crate::cluster::guard_binary();
        let mut path = vec![
            repo().join("target/controlplane/bin"),
            repo().join("target/tools/bin"),
            guard_bin.parent().expect("the guard binary's folder").to_path_buf(),
        ];
        path.extend(std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()));
        let path = std::env::join_paths(path).expect("PATH");
        Self {
            dir: dir.into(),
            env: vec![
                ("PATH".into(), path.to_string_lossy().into_owned()),
                (
                    "KUBECONFIG".into(),
                    crate::cluster::control_plane().display().to_string(),
                ),
            ],
            substitutions: Vec::new(),
        }
    }

    /// `name=value` in every block's environment.
    pub fn env(mut self, name: &str, value: impl Into<String>) -> Self {
        self.env.retain(|(set, _)| set != name);
        self.env.push((name.to_owned(), value.into()));
        self
    }

    /// `dir` first on `PATH`.
    pub fn path_first(self, dir: &std::path::Path) -> Self {
        let path = self
            .env
            .iter()
            .find(|(name, _)| name == "PATH")
            .map(|(_, path)| format!("{}:{path}", dir.display()))
            .unwrap_or_default();
        self.env("PATH", path)
    }

    /// Every `example` of the pages written as `here`.
    pub fn substitute(mut self, example: &str, here: impl Into<String>) -> Self {
        self.substitutions.push((example.to_owned(), here.into()));
        self
    }

    /// Runs the block `<!-- run: id -->` of `page` with `set -e -o pipefail` and its
    /// placeholders (`NS`, `NAME`: whole words) replaced; panics unless it succeeds.
    pub fn run(&self, page: &str, id: &str, placeholders: &[(&str, &str)]) -> String {
        let ran = self.execute(page, id, placeholders, true);
        assert!(
            ran.status.success(),
            "{page} ({id}) failed, {}:\n{}",
            ran.status,
            ran.output
        );
        ran.output
    }

    /// Runs the block as pasted into a terminal: every command, whatever the one before
    /// it did (a page may show a refusal); the caller judges the outcome.
    pub fn paste(&self, page: &str, id: &str, placeholders: &[(&str, &str)]) -> Ran {
        self.execute(page, id, placeholders, false)
    }

    fn execute(&self, page: &str, id: &str, placeholders: &[(&str, &str)], strict: bool) -> Ran {
        use std::os::unix::process::CommandExt;

        let mut script = block(page, id);
        for (example, here) in &self.substitutions {
            script = script.replace(example, here);
        }
        for (word, value) in placeholders {
            script = replace_word(&script, word, value);
        }
        let logs = repo().join("target/shipped/blocks");
        std::fs::create_dir_all(&logs).expect("target/shipped/blocks");
        let log_path = logs.join(format!("{}-{id}.log", page.replace('/', "_")));
        let log = std::fs::File::create(&log_path).expect("the block's log");
        let mut command = std::process::Command::new("bash");
        if strict {
            command.args(["-e", "-o", "pipefail"]);
        }
        command
            .arg("-c")
            .arg(&script)
            .current_dir(&self.dir)
            .envs(self.env.iter().map(|(name, value)| (name, value)))
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().expect("the block's log"))
            .stderr(log)
            // Its own process group: what it leaves in the background goes with it.
            .process_group(0);
        let started = std::time::Instant::now();
        let mut child = command.spawn().expect("bash");
        let status = loop {
            if let Some(status) = child.try_wait().expect("the block's shell") {
                break Some(status);
            }
            if started.elapsed() > BLOCK_TIMEOUT {
                break None;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        };
        let _ = std::process::Command::new("kill")
            .args(["-TERM", "--", &format!("-{}", child.id())])
            .output();
        let _ = child.wait();
        let output = std::fs::read_to_string(&log_path).unwrap_or_default();
        let Some(status) = status else {
            panic!("{page} ({id}) still ran after {BLOCK_TIMEOUT:?}:\n{output}");
        };
        println!(
            "{page} ({id}), {:.1?}, {status}:\n{}",
            started.elapsed(),
            output.lines().map(|line| format!("  | {line}\n")).collect::<String>()
        );
        Ran { status, output }
    }
}

/// `text` with `word` replaced by `value` where it stands alone (not in `CDS_WORKER_NAME`).
fn replace_word(text: &str, word: &str, value: &str) -> String {
    let is_word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut replaced = String::new();
    let mut rest = text;
    while let Some(at) = rest.find(word) {
        let before = rest[..at].chars().next_back();
        let after = rest[at + word.len()..].chars().next();
        replaced.push_str(&rest[..at]);
        if before.is_some_and(is_word) || after.is_some_and(is_word) {
            replaced.push_str(word);
        } else {
            replaced.push_str(value);
        }
        rest = &rest[at + word.len()..];
    }
    replaced.push_str(rest);
    replaced
}
