//! What the load benchmarks share: running `oha` and reading its JSON summary, medians of
//! alternating rounds, CPU time and memory of a process, the servers they start, and the
//! tables they print.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    net::{SocketAddr, TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;

/// One `oha` run: a closed loop of `connections` clients for `duration`.
#[derive(Debug, Clone)]
pub struct Load {
    pub url: String,
    pub method: &'static str,
    pub body: Option<PathBuf>,
    pub http2: bool,
    pub connections: usize,
    pub duration: Duration,
    /// Requests a second in all, open loop (`oha -q`); as fast as answered when `None`.
    pub rate: Option<f64>,
    /// Client certificate and key (the apiserver's admin).
    pub client_cert: Option<(PathBuf, PathBuf)>,
    pub cacert: Option<PathBuf>,
}

/// What one run measured.
#[derive(Debug, Clone, Default)]
pub struct Measured {
    pub rps: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub requests: f64,
    /// Status codes and errors other than `expect`, with their counts.
    pub unexpected: BTreeMap<String, u64>,
}

/// The `oha` binary: `$OHA`, else the one `make bench` installs, else `oha` on the PATH.
pub fn oha() -> PathBuf {
    if let Some(path) = std::env::var_os("OHA") {
        return path.into();
    }
    let home = std::env::var_os("HOME").unwrap_or_default();
    let cached = Path::new(&home).join(".cache/cds-secret-guard/tools/bin/oha");
    if cached.exists() { cached } else { "oha".into() }
}

impl Load {
    /// Runs the load and checks that every answer has status `expect`.
    pub fn run(&self, expect: u16) -> Measured {
        let mut command = Command::new(oha());
        command
            .args(["--no-tui", "--output-format", "json", "-c"])
            .arg(self.connections.to_string())
            .arg("-z")
            .arg(format!("{}ms", self.duration.as_millis()))
            .args(["-m", self.method]);
        if let Some(rate) = self.rate {
            command.arg("-q").arg(rate.to_string());
        }
        if self.http2 {
            // One stream per connection: the same concurrency as HTTP/1.1.
            command.args(["--http2", "-p", "1"]);
        }
        if let Some(body) = &self.body {
            command.args(["-T", "application/json", "-D"]).arg(body);
        }
        if let Some((cert, key)) = &self.client_cert {
            command.arg("--cert").arg(cert).arg("--key").arg(key);
        }
        match &self.cacert {
            Some(ca) => command.arg("--cacert").arg(ca),
            None => command.arg("--insecure"),
        };
        command.arg(&self.url);
        let output = command.output().expect("run oha (make bench installs it)");
        assert!(
            output.status.success(),
            "oha failed: {}\n{}",
            String::from_utf8_lossy(&output.stderr),
            String::from_utf8_lossy(&output.stdout)
        );
        let json: Value = serde_json::from_slice(&output.stdout).expect("oha prints JSON");
        let metrics = &json["metrics"];
        let mut unexpected = BTreeMap::new();
        let mut ok = 0.0;
        for (status, count) in json["statusCodeDistribution"].as_object().into_iter().flatten() {
            let count = count.as_u64().unwrap_or_default();
            if status == &expect.to_string() {
                ok += count as f64;
            } else {
                unexpected.insert(format!("HTTP {status}"), count);
            }
        }
        for (error, count) in json["errorDistribution"].as_object().into_iter().flatten() {
            // Requests cut at the deadline are not failures.
            if !error.contains("aborted due to deadline") {
                unexpected.insert(error.clone(), count.as_u64().unwrap_or_default());
            }
        }
        Measured {
            rps: ok / json["summary"]["total"].as_f64().unwrap_or(f64::NAN),
            p50_ms: metrics["latency_ms"]["p50"].as_f64().unwrap_or(f64::NAN),
            p99_ms: metrics["latency_ms"]["p99"].as_f64().unwrap_or(f64::NAN),
            requests: ok,
            unexpected,
        }
    }
}

/// The median; NaN for no values.
pub fn median(values: &[f64]) -> f64 {
    let mut sorted: Vec<f64> = values.iter().copied().filter(|v| !v.is_nan()).collect();
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted.sort_by(f64::total_cmp);
    let mid = sorted.len() / 2;
    if sorted.len().is_multiple_of(2) {
        (sorted[mid - 1] + sorted[mid]) / 2.0
    } else {
        sorted[mid]
    }
}

/// The median of the ratios of paired rounds: each ratio compares two figures measured
/// one right after the other.
pub fn median_ratio(a: &[f64], b: &[f64]) -> f64 {
    let ratios: Vec<f64> = a.iter().zip(b).map(|(a, b)| a / b).collect();
    median(&ratios)
}

/// CPU time (user + system) a process has used so far.
pub fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces, within parentheses).
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok()).unwrap_or_default();
    // utime and stime are fields 14 and 15 of the whole line: 11 and 12 after the name.
    let ticks_per_second = 100; // USER_HZ on Linux
    Duration::from_millis((ticks(11) + ticks(12)) * 1000 / ticks_per_second)
}

/// Resident memory of a process, in MiB.
pub fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(f64::NAN, |kib| kib / 1024.0)
}

/// A Markdown table.
pub struct Table {
    pub title: String,
    pub header: Vec<String>,
    pub rows: Vec<Vec<String>>,
    pub notes: Vec<String>,
}

impl Table {
    pub fn new(title: impl Into<String>, header: &[&str]) -> Self {
        Self {
            title: title.into(),
            header: header.iter().map(|h| (*h).to_owned()).collect(),
            rows: Vec::new(),
            notes: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub fn note(&mut self, note: impl Into<String>) {
        self.notes.push(note.into());
    }

    pub fn render(&self) -> String {
        let mut out = format!(
            "\n## {}\n\n| {} |\n|{}\n",
            self.title,
            self.header.join(" | "),
            "---|".repeat(self.header.len())
        );
        for row in &self.rows {
            let _ = writeln!(out, "| {} |", row.join(" | "));
        }
        if !self.notes.is_empty() {
            out.push('\n');
            for note in &self.notes {
                let _ = writeln!(out, "{note}");
            }
        }
        out
    }

    /// Prints the table, and appends it to `$CDS_BENCH_REPORT` when set.
    pub fn print(&self) {
        let text = self.render();
        print!("{text}");
        if let Ok(path) = std::env::var("CDS_BENCH_REPORT") {
            use std::io::Write;
            let mut file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .unwrap();
            file.write_all(text.as_bytes()).unwrap();
        }
    }
}

/// A number with two decimals, or `-`.
pub fn f2(value: f64) -> String {
    if value.is_nan() {
        "-".to_owned()
    } else {
        format!("{value:.2}")
    }
}

/// Requests per second, rounded.
pub fn rps(value: f64) -> String {
    if value.is_nan() {
        "-".to_owned()
    } else {
        format!("{value:.0}")
    }
}

/// A goal line: the figure, the goal and whether it is met.
pub fn goal(figure: f64, met: bool, goal: &str) -> String {
    if figure.is_nan() {
        return format!("- ({goal})");
    }
    format!("{} {} ({goal})", f2(figure), if met { "ok" } else { "MISSED" })
}

// === processes ===

/// The directory of the running example's profile (`target/release`, `target/bench`…),
/// where the binaries it starts were built.
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().and_then(Path::parent).unwrap().to_owned()
}

/// A loopback address nobody listens on (yet).
pub fn free_port() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

/// A server process, killed when dropped.
pub struct Process {
    pub name: &'static str,
    pub child: Child,
    pub addr: SocketAddr,
}

impl Process {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits until `child` accepts connections on `addr`.
pub fn wait_listening(addr: SocketAddr, child: &mut Child, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while TcpStream::connect(addr).is_err() {
        assert!(child.try_wait().unwrap().is_none(), "{what} exited");
        assert!(Instant::now() < deadline, "{what} does not listen on {addr}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// What `examples/ceiling` answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CeilingAnswer {
    /// One constant review, whatever was asked (the TLS benchmark's ceiling).
    Constant,
    /// A refusal echoing each review's uid (the floor of a deny on the apiserver's path).
    Deny,
    /// An allow echoing each review's uid, with a warning (the floor of an allow).
    Allow,
}

/// Starts `examples/ceiling` with the certificates in `certs`, answering `answer`.
pub fn start_ceiling(certs: &Path, answer: CeilingAnswer) -> Process {
    let addr = free_port();
    let mut command = Command::new(profile_dir().join("examples/ceiling"));
    command
        .arg("--listen")
        .arg(addr.to_string())
        .arg("--tls-cert")
        .arg(certs.join("tls.crt"))
        .arg("--tls-key")
        .arg(certs.join("tls.key"))
        .stdout(Stdio::null());
    match answer {
        CeilingAnswer::Constant => {}
        CeilingAnswer::Deny => {
            command.arg("--deny");
        }
        CeilingAnswer::Allow => {
            command.arg("--allow");
        }
    }
    let mut child = command
        .spawn()
        .expect("start examples/ceiling (build it with --release)");
    wait_listening(addr, &mut child, "the ceiling");
    Process {
        name: "ceiling",
        child,
        addr,
    }
}
