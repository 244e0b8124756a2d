//! Command-line interface. Every `serve` flag can also be set by an environment
//! variable (`CDS_GUARD_…`), which is how the Deployment configures it.

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use clap::{Args, Parser, Subcommand, ValueEnum};

pub mod check;
pub mod wait;
pub mod webhooks;

use crate::{
    cluster::lease::LeaseConfig,
    config::{Config, Limits},
    observe::telemetry::LogFormat,
    rules::{self, Mode},
};

/// `--version`: the release and the commit it was built from (build.rs).
pub const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("CDS_GUARD_COMMIT"), ")");

/// The name the binary answers to as a kubectl plugin (`kubectl cds-guard check`).
pub const KUBECTL_PLUGIN: &str = "kubectl-cds_guard";

/// Keeps CDS worker secrets alive while their pods need them.
#[derive(Debug, Parser)]
#[command(name = "cds-secret-guard", version = VERSION, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the admission webhooks (TLS) and the probes and metrics (plain HTTP).
    Serve(Box<ServeArgs>),
    /// Write a development CA and a serving certificate signed by it.
    Certs(CertsArgs),
    /// Print the webhook configurations for a guard reachable at a URL or a Service.
    Webhooks(WebhooksArgs),
    /// Report every protected secret: its pod, ownerReference and labels; exits 1 on a mismatch.
    Check(CheckArgs),
    /// Remove the guard's finalizer from every Secret and ConfigMap (uninstall; by hand
    /// while no replica runs): deferred deletes then complete at once.
    ReleaseFinalizers(ReleaseArgs),
    /// Wait until the guard answers through its Service, trusted by every webhook's
    /// caBundle, as the apiserver calls it (the chart runs it after an install).
    Wait(WaitArgs),
}

/// Flags of `serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address of the TLS admission server.
    #[arg(long, env = "CDS_GUARD_LISTEN", default_value = "0.0.0.0:8443")]
    pub listen: SocketAddr,

    /// Serving certificate (PEM), reloaded when the file changes.
    #[arg(
        long,
        env = "CDS_GUARD_TLS_CERT",
        default_value = "/etc/cds-secret-guard/tls/tls.crt"
    )]
    pub tls_cert: PathBuf,

    /// Serving key (PEM), reloaded when the file changes.
    #[arg(long, env = "CDS_GUARD_TLS_KEY", default_value = "/etc/cds-secret-guard/tls/tls.key")]
    pub tls_key: PathBuf,

    /// Address of the plain-HTTP server for /healthz, /readyz and /metrics.
    #[arg(long, env = "CDS_GUARD_PROBE_LISTEN", default_value = "0.0.0.0:8080")]
    pub probe_listen: SocketAddr,

    /// A worker secret younger than this is never deleted (e.g. 10m, 90s).
    #[arg(long, env = "CDS_GUARD_GRACE_PERIOD", default_value = "10m", value_parser = humantime::parse_duration)]
    pub grace_period: Duration,

    /// Deadline of the apiserver reads behind one decision; past it, deletes are denied.
    #[arg(long, env = "CDS_GUARD_LOOKUP_TIMEOUT", default_value = "2s", value_parser = humantime::parse_duration)]
    pub lookup_timeout: Duration,

    /// Deadline of a whole admission request, body included; keep it below the secret
    /// webhook's timeoutSeconds.
    #[arg(long, env = "CDS_GUARD_REQUEST_TIMEOUT", default_value = "4s", value_parser = humantime::parse_duration)]
    pub request_timeout: Duration,

    /// Deadline of a pod CREATE review; keep it below the pod webhook's timeoutSeconds.
    #[arg(long, env = "CDS_GUARD_MUTATION_TIMEOUT", default_value = "1s", value_parser = humantime::parse_duration)]
    pub mutation_timeout: Duration,

    /// Which secrets are protected and how they pair with pods.
    #[command(flatten)]
    pub secrets: SecretArgs,

    /// Who is exempt and which namespaces are protected.
    #[command(flatten)]
    pub scope: ScopeArgs,

    /// Which replica does the adoption work.
    #[command(flatten)]
    pub lease: LeaseArgs,

    /// Decide on the deletes of opted-in Secrets and ConfigMaps (`/validate-in-use`):
    /// denied while a pod that stays uses them. Register its webhooks with `webhooks
    /// --in-use-protection`; the guard then also reads the workloads owning those pods.
    #[arg(long, env = "CDS_GUARD_IN_USE_PROTECTION")]
    pub in_use_protection: bool,

    /// What the delete of an object opted in with `enabled` gets while a pod uses it:
    /// `defer` accepts it and keeps the object (a finalizer) until no pod does; `refuse`
    /// denies it. The opt-in label's value `defer` or `refuse` picks one for its object or
    /// namespace.
    #[arg(long, env = "CDS_GUARD_IN_USE_MODE", value_enum, default_value_t = crate::rules::in_use::Mode::Defer)]
    pub in_use_mode: crate::rules::in_use::Mode,

    /// `enforce` denies; `warn` allows but returns the reasons as warnings.
    #[arg(long, env = "CDS_GUARD_MODE", value_enum, default_value_t = Mode::Enforce)]
    pub mode: Mode,

    /// How often the certificate files are checked for changes.
    #[arg(long, env = "CDS_GUARD_TLS_RELOAD_INTERVAL", default_value = "1s", value_parser = humantime::parse_duration)]
    pub tls_reload_interval: Duration,

    /// Certificates the guard makes and renews itself, instead of the files.
    #[command(flatten)]
    pub renewal: RenewalArgs,

    /// How long in-flight requests may take to finish once the drain delay is over.
    #[arg(long, env = "CDS_GUARD_SHUTDOWN_TIMEOUT", default_value = "20s", value_parser = humantime::parse_duration)]
    pub shutdown_timeout: Duration,

    /// After SIGTERM: how long /readyz says 503 while requests are still served.
    #[arg(long, env = "CDS_GUARD_DRAIN_DELAY", default_value = "5s", value_parser = humantime::parse_duration)]
    pub drain_delay: Duration,

    /// Open admission connections at most; more wait to be accepted. Also the admission
    /// requests admitted at once (over HTTP/2 streams too); more are answered 503.
    #[arg(long, env = "CDS_GUARD_MAX_CONNECTIONS", default_value_t = Limits::default().max_connections)]
    pub max_connections: usize,

    /// Admission requests read or answered at once, over all connections; with the body
    /// limit, this bounds the memory bodies can take.
    #[arg(long, env = "CDS_GUARD_MAX_REQUESTS", default_value_t = Limits::default().max_requests)]
    pub max_requests: usize,

    /// Time to finish the TLS handshake and each request's headers; an admission
    /// connection idle this long is closed.
    #[arg(long, env = "CDS_GUARD_IDLE_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub idle_timeout: Duration,

    /// Identical audit lines (same secret, decision, reason, requester) within this
    /// window are written once, then summarised with their count.
    #[arg(long, env = "CDS_GUARD_AUDIT_SUMMARY_WINDOW", default_value = "1m", value_parser = humantime::parse_duration)]
    pub audit_summary_window: Duration,

    /// Log format.
    #[arg(long, env = "CDS_GUARD_LOG_FORMAT", value_enum, default_value_t = LogFormat::Json)]
    pub log_format: LogFormat,
}

/// Certificates renewed by the guard (`--certificate-secret`).
#[derive(Debug, Args)]
pub struct RenewalArgs {
    /// Secret holding the guard's CAs and serving certificate; given, the guard makes,
    /// publishes and renews them itself, and the certificate files are not read.
    #[arg(long, env = "CDS_GUARD_CERTIFICATE_SECRET")]
    pub certificate_secret: Option<String>,

    /// Namespace of that secret (default: the guard's own).
    #[arg(long, env = "CDS_GUARD_CERTIFICATE_NAMESPACE")]
    pub certificate_namespace: Option<String>,

    /// Name of both webhook configurations whose caBundle the guard keeps.
    #[arg(long, env = "CDS_GUARD_WEBHOOK_CONFIGURATION", default_value = "cds-secret-guard")]
    pub webhook_configuration: String,

    /// DNS name or IP address of the serving certificate (repeatable; the first is the
    /// name the apiserver calls).
    #[arg(
        long = "certificate-host",
        env = "CDS_GUARD_CERTIFICATE_HOSTS",
        value_delimiter = ','
    )]
    pub certificate_hosts: Vec<String>,

    /// Validity of a CA the guard makes (e.g. 5y); it is replaced with a third left.
    #[arg(long, env = "CDS_GUARD_CA_VALIDITY", default_value = "5y", value_parser = humantime::parse_duration)]
    pub ca_validity: Duration,

    /// Validity of a serving certificate (e.g. 90d), at most a third of the CA's; it is
    /// renewed with a third left.
    #[arg(long, env = "CDS_GUARD_LEAF_VALIDITY", default_value = "90d", value_parser = humantime::parse_duration)]
    pub leaf_validity: Duration,
}

/// Which secrets are protected and how they pair with pods (shared by the commands).
#[derive(Debug, Args)]
pub struct SecretArgs {
    /// Name prefix of protected secrets (repeatable; comma-separated in the variable).
    #[arg(
        long = "secret-prefix",
        env = "CDS_GUARD_SECRET_PREFIXES",
        value_delimiter = ',',
        default_values_t = [String::from("cds-worker-config-"), String::from("cds-worker-registry-")]
    )]
    pub secret_prefixes: Vec<String>,

    /// Label naming the worker on secrets and pods.
    #[arg(long, env = "CDS_GUARD_WORKER_LABEL", default_value = "CDS_WORKER_NAME")]
    pub worker_label: String,

    /// Label naming the hatchery on secrets and pods.
    #[arg(long, env = "CDS_GUARD_HATCHERY_LABEL", default_value = "CDS_HATCHERY_NAME")]
    pub hatchery_label: String,
}

/// Who may delete protected secrets without checks, and where secrets are protected
/// (shared by `serve` and `webhooks`: the webhooks' match conditions repeat them).
#[derive(Debug, Args)]
pub struct ScopeArgs {
    /// User allowed to delete protected secrets without checks (repeatable).
    #[arg(
        long = "exempt-user",
        env = "CDS_GUARD_EXEMPT_USERS",
        value_delimiter = ',',
        default_values_t = [String::from("system:serviceaccount:kube-system:namespace-controller")]
    )]
    pub exempt_users: Vec<String>,

    /// Group allowed to delete protected secrets without checks (repeatable).
    #[arg(long = "exempt-group", env = "CDS_GUARD_EXEMPT_GROUPS", value_delimiter = ',')]
    pub exempt_groups: Vec<String>,

    /// Namespace to watch and protect (repeatable; default: all).
    #[arg(long = "namespace", env = "CDS_GUARD_NAMESPACES", value_delimiter = ',')]
    pub namespaces: Vec<String>,
}

/// The Lease that elects the one replica doing the adoption work (`serve`).
#[derive(Debug, Args)]
pub struct LeaseArgs {
    /// Name of the Lease, in the guard's own namespace, that elects the one replica adding
    /// ownerReferences (the chart creates it); without it, every replica does that work.
    #[arg(long = "lease", env = "CDS_GUARD_LEASE")]
    pub name: Option<String>,

    /// This replica's name in the Lease (the chart gives the pod's name; default:
    /// hostname_pid).
    #[arg(long = "lease-identity", env = "CDS_GUARD_LEASE_IDENTITY")]
    pub identity: Option<String>,

    /// How long the other replicas wait, after the Lease last changed, before they take
    /// it over (whole seconds).
    #[arg(long = "lease-duration", env = "CDS_GUARD_LEASE_DURATION", default_value = "15s", value_parser = humantime::parse_duration)]
    pub duration: Duration,

    /// How long the holder keeps adopting without renewing the Lease; below the duration.
    #[arg(long = "lease-renew-deadline", env = "CDS_GUARD_LEASE_RENEW_DEADLINE", default_value = "10s", value_parser = humantime::parse_duration)]
    pub renew_deadline: Duration,

    /// How often every replica reads the Lease, and its holder renews it.
    #[arg(long = "lease-retry-period", env = "CDS_GUARD_LEASE_RETRY_PERIOD", default_value = "2s", value_parser = humantime::parse_duration)]
    pub retry_period: Duration,
}

/// Which cluster a command talks to, as kubectl picks it.
#[derive(Debug, Args)]
pub struct ClusterArgs {
    /// Path to the kubeconfig file (default: `KUBECONFIG`, then `~/.kube/config`, then
    /// in-cluster).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,

    /// The kubeconfig context to use (default: its current context).
    #[arg(long)]
    pub context: Option<String>,
}

/// Flags of `check`.
#[derive(Debug, Args)]
#[command(group = clap::ArgGroup::new("scope").args(["namespace", "all_namespaces"]))]
pub struct CheckArgs {
    /// Namespace to check (default: the kubeconfig's namespace).
    #[arg(long, short = 'n')]
    pub namespace: Option<String>,

    /// Check every namespace.
    #[arg(long, short = 'A')]
    pub all_namespaces: bool,

    /// Output format.
    #[arg(long, short = 'o', value_enum, default_value_t = OutputFormat::Table)]
    pub output: OutputFormat,

    /// The cluster to talk to.
    #[command(flatten)]
    pub cluster: ClusterArgs,

    /// Which secrets are protected, as given to `serve`.
    #[command(flatten)]
    pub secrets: SecretArgs,
}

/// Flags of `release-finalizers`.
#[derive(Debug, Args)]
pub struct ReleaseArgs {
    /// Namespace whose objects to release (repeatable; default: all).
    #[arg(long = "namespace", short = 'n', env = "CDS_GUARD_NAMESPACES", value_delimiter = ',')]
    pub namespaces: Vec<String>,

    /// The cluster to talk to.
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

/// Flags of `wait`.
#[derive(Debug, Args)]
pub struct WaitArgs {
    /// The guard's Service.
    #[arg(long, default_value = "cds-secret-guard")]
    pub service: String,

    /// The Service's namespace (default: the kubeconfig's, in a pod its own).
    #[arg(long, short = 'n')]
    pub namespace: Option<String>,

    /// The Service's port.
    #[arg(long, default_value_t = 443)]
    pub port: u16,

    /// The name of the webhook configurations whose caBundles must trust the guard.
    #[arg(long, default_value = "cds-secret-guard")]
    pub webhook_configuration: String,

    /// Calls answered in a row that make the guard callable.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..))]
    pub answers: u32,

    /// How long to try (e.g. 2m).
    #[arg(long, default_value = "2m", value_parser = humantime::parse_duration)]
    pub timeout: Duration,

    /// The cluster to talk to.
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

/// How `check` prints its report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    /// Aligned columns for people.
    Table,
    /// A JSON array for machines.
    Json,
}

/// Flags of `certs`.
#[derive(Debug, Args)]
pub struct CertsArgs {
    /// Directory to write `ca.crt`, `ca.key`, `tls.crt` and `tls.key` to. An existing
    /// CA there is reused, so a new serving certificate is trusted by the old caBundle.
    #[arg(long)]
    pub out: PathBuf,

    /// DNS name or IP address the serving certificate is valid for (repeatable).
    #[arg(long = "host", required = true)]
    pub hosts: Vec<String>,
}

/// Flags of `webhooks`.
#[derive(Debug, Args)]
#[command(group = clap::ArgGroup::new("target").required(true).args(["url", "service"]))]
pub struct WebhooksArgs {
    /// Base URL of a guard outside the cluster, e.g. `https://127.0.0.1:8443`.
    #[arg(long)]
    pub url: Option<String>,

    /// Service of a guard in the cluster, as `NAMESPACE/NAME` (port 443).
    #[arg(long, value_name = "NAMESPACE/NAME")]
    pub service: Option<String>,

    /// CA certificate (PEM) that signed the guard's serving certificate. Leave it out
    /// when cert-manager injects the caBundle.
    #[arg(long)]
    pub ca_bundle: Option<PathBuf>,

    /// Namespace the guard runs in, left out of the secret webhook.
    #[arg(long, default_value = "cds-secret-guard")]
    pub guard_namespace: String,

    /// Which secrets are protected, as given to `serve`.
    #[command(flatten)]
    pub secrets: SecretArgs,

    /// Who is exempt and which namespaces are protected, as given to `serve`.
    #[command(flatten)]
    pub scope: ScopeArgs,

    /// Also register in-use protection (`/validate-in-use`): the deletes of Secrets and
    /// ConfigMaps labelled, or in a namespace labelled,
    /// `cds-secret-guard/in-use-protection=enabled` (the variable is `serve`'s).
    #[arg(long, env = "CDS_GUARD_IN_USE_PROTECTION")]
    pub in_use_protection: bool,

    /// Seconds the apiserver waits for the guard on a secret delete (at most 5).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(i32).range(1..=5))]
    pub timeout_seconds: i32,
}

/// A list flag without its empty items: `CDS_GUARD_EXEMPT_USERS=""` means nobody, not a
/// user named "".
pub fn non_empty(items: Vec<String>) -> Vec<String> {
    items.into_iter().filter(|item| !item.is_empty()).collect()
}

// === impl Cli ===

impl Cli {
    /// Parses the command line; invoked as `kubectl-cds_guard` (kubectl runs it for
    /// `kubectl cds-guard …`), the help says so.
    pub fn parse_args() -> Self {
        use clap::{CommandFactory, FromArgMatches};
        let invoked = std::env::args_os().next().map(PathBuf::from);
        let as_plugin = invoked
            .as_deref()
            .and_then(|path| path.file_name())
            .is_some_and(|name| name == KUBECTL_PLUGIN);
        let command = Self::command();
        let command = if as_plugin {
            command.bin_name("kubectl cds-guard")
        } else {
            command
        };
        let matches = command.get_matches();
        Self::from_arg_matches(&matches).unwrap_or_else(|error| error.exit())
    }
}

// === impl ClusterArgs ===

impl ClusterArgs {
    /// A client as kubectl would make it: from `--kubeconfig` (else `KUBECONFIG`, else
    /// `~/.kube/config`, else in-cluster), in `--context` (else the current one).
    pub async fn client(&self) -> crate::Result<kube::Client> {
        let options = kube::config::KubeConfigOptions {
            context: self.context.clone(),
            ..Default::default()
        };
        let config = match &self.kubeconfig {
            Some(path) => {
                let file =
                    kube::config::Kubeconfig::read_from(path).map_err(|e| crate::Error::KubeConfig(e.to_string()))?;
                kube::Config::from_custom_kubeconfig(file, &options).await
            }
            None if self.context.is_some() => kube::Config::from_kubeconfig(&options).await,
            None => return kube::Client::try_default().await.map_err(crate::Error::Kube),
        }
        .map_err(|e| crate::Error::KubeConfig(e.to_string()))?;
        kube::Client::try_from(config).map_err(crate::Error::Kube)
    }
}

// === impl SecretArgs ===

impl SecretArgs {
    /// A policy with these secrets and the defaults of `serve` for everything else.
    pub fn policy(&self) -> rules::worker::Settings {
        rules::worker::Settings {
            grace_period: Duration::from_secs(600),
            secret_prefixes: self.secret_prefixes.clone(),
            worker_label: self.worker_label.clone(),
            hatchery_label: self.hatchery_label.clone(),
        }
    }
}

// === impl RenewalArgs ===

impl RenewalArgs {
    /// The renewal settings, if renewal is asked for.
    pub fn settings(self) -> Option<crate::certs::renewal::Settings> {
        Some(crate::certs::renewal::Settings {
            secret: self.certificate_secret?,
            namespace: self.certificate_namespace,
            webhook_configuration: self.webhook_configuration,
            hosts: non_empty(self.certificate_hosts),
            ca_validity: self.ca_validity,
            leaf_validity: self.leaf_validity,
        })
    }
}

// === impl LeaseArgs ===

impl LeaseArgs {
    /// The Lease these flags describe, if one is named.
    pub fn config(self) -> Option<LeaseConfig> {
        let name = self.name.filter(|name| !name.is_empty())?;
        Some(LeaseConfig {
            name,
            identity: self.identity.unwrap_or_else(default_identity),
            duration: self.duration,
            renew_deadline: self.renew_deadline,
            retry_period: self.retry_period,
        })
    }
}

/// `hostname_pid`: unique among the replicas of one host, as client-go's users make it.
fn default_identity() -> String {
    let hostname = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|name| name.trim().to_owned())
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "cds-secret-guard".to_owned());
    format!("{hostname}_{}", std::process::id())
}

// === impl ServeArgs ===

impl ServeArgs {
    /// The server configuration these flags describe.
    pub fn into_config(self) -> Config {
        Config {
            listen: self.listen,
            probe_listen: self.probe_listen,
            tls_cert: self.tls_cert,
            tls_key: self.tls_key,
            tls_reload_interval: self.tls_reload_interval,
            renewal: self.renewal.settings(),
            request_timeout: self.request_timeout,
            mutation_timeout: self.mutation_timeout,
            audit_window: self.audit_summary_window,
            shutdown_timeout: self.shutdown_timeout,
            limits: Limits {
                max_connections: self.max_connections,
                max_requests: self.max_requests,
                idle_timeout: self.idle_timeout,
                drain_delay: self.drain_delay,
                ..Limits::default()
            },
            rules: rules::Settings {
                lookup_timeout: self.lookup_timeout,
                exempt_users: non_empty(self.scope.exempt_users),
                exempt_groups: non_empty(self.scope.exempt_groups),
                namespaces: non_empty(self.scope.namespaces),
                mode: self.mode,
            },
            worker: rules::worker::Settings {
                grace_period: self.grace_period,
                secret_prefixes: self.secrets.secret_prefixes,
                worker_label: self.secrets.worker_label,
                hatchery_label: self.secrets.hatchery_label,
            },
            lease: self.lease.config(),
            in_use_protection: self.in_use_protection,
            in_use_mode: self.in_use_mode,
        }
    }
}

#[cfg(test)]
mod tests;
