use super::*;

#[test]
fn flags_are_consistent() {
    use clap::CommandFactory;
    Cli::command().debug_assert();
}

#[test]
fn the_version_names_the_commit_built() {
    use clap::CommandFactory;
    let head = std::process::Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .unwrap();
    let head = String::from_utf8(head.stdout).unwrap();
    assert_eq!(
        Cli::command().render_version(),
        format!(
            "cds-secret-guard {} (commit {})\n",
            env!("CARGO_PKG_VERSION"),
            head.trim()
        )
    );
}

/// The arguments of `serve` with `flags`.
fn serve(flags: &[&str]) -> Box<ServeArgs> {
    let args = ["cds-secret-guard", "serve"].iter().chain(flags);
    let Command::Serve(args) = Cli::try_parse_from(args).unwrap().command else {
        panic!("not serve")
    };
    args
}

#[test]
fn defaults_protect_cds_worker_secrets() {
    let args = serve(&[]);
    let config = args.into_config();
    assert_eq!(config.worker.grace_period, Duration::from_secs(600));
    assert_eq!(
        config.worker.secret_prefixes,
        ["cds-worker-config-", "cds-worker-registry-"]
    );
    assert_eq!(config.worker.worker_label, "CDS_WORKER_NAME");
    assert_eq!(config.rules.mode, Mode::Enforce);
    assert!(config.request_timeout < Duration::from_secs(5));
}

#[test]
fn durations_are_humane_and_lists_repeat() {
    let args = serve(&[
        "--grace-period",
        "90s",
        "--mode",
        "warn",
        "--secret-prefix",
        "a-",
        "--secret-prefix",
        "b-",
        "--exempt-group",
        "ops",
    ]);
    let config = args.into_config();
    assert_eq!(config.worker.grace_period, Duration::from_secs(90));
    assert_eq!(config.worker.secret_prefixes, ["a-", "b-"]);
    assert_eq!(config.rules.exempt_groups, ["ops"]);
    assert_eq!(config.rules.mode, Mode::Warn);
}

#[test]
fn an_empty_list_means_nobody() {
    let args = serve(&["--exempt-user", ""]);
    assert!(args.into_config().rules.exempt_users.is_empty());
}

#[test]
fn without_a_lease_every_replica_adopts() {
    let args = serve(&[]);
    assert!(args.into_config().lease.is_none());
}

#[test]
fn the_lease_keeps_kube_controller_managers_timing() {
    let args = serve(&["--lease", "guard", "--lease-identity", "pod-a"]);
    let config = args.into_config();
    config.validate().unwrap();
    let lease = config.lease.unwrap();
    assert_eq!((lease.name.as_str(), lease.identity.as_str()), ("guard", "pod-a"));
    assert_eq!(
        (lease.duration, lease.renew_deadline, lease.retry_period),
        (Duration::from_secs(15), Duration::from_secs(10), Duration::from_secs(2))
    );
}

#[rstest::rstest]
#[case::renew_deadline_past_the_duration(&["--lease-renew-deadline", "20s"])]
#[case::retry_past_the_renew_deadline(&["--lease-retry-period", "10s"])]
#[case::duration_in_fractions(&["--lease-duration", "15500ms"])]
#[case::no_retry_period(&["--lease-retry-period", "0s"])]
fn a_lease_that_cannot_work_is_refused(#[case] flags: &[&str]) {
    let args = serve(&[["--lease", "guard"].as_slice(), flags].concat());
    let error = args.into_config().validate().unwrap_err();
    assert!(error.to_string().contains("--lease"), "{error}");
}

#[test]
fn bad_duration_is_a_clear_error() {
    let err = Cli::try_parse_from(["cds-secret-guard", "serve", "--grace-period", "ten"]).unwrap_err();
    assert!(err.to_string().contains("--grace-period"), "{err}");
}
