//! The model as stateright sees it: its bounds, the variant under test, the initial state,
//! the steps and the properties.

use cds_secret_guard::rules::{self, worker};
use k8s_openapi::jiff::Timestamp;
use stateright::{Model, Property};

use crate::{
    actors::{Action, State},
    guard::{self, Caches, Memo, View},
    properties,
    variants::{Adoption, Cleanup, Guard, Lookup},
    world::{Clock, PodName, PodShape, SecretId, Set, Worker},
};

/// How far the model looks.
#[derive(Clone, Copy, Debug)]
pub struct Bounds {
    /// Workers spawned: `w1` by `h1`, then `w2` by `h2`.
    pub workers: u8,
    /// The cleanup's pod list may miss this many of the latest changes (K). It has two
    /// answers here (`w1` listed or not), so K = 1 already lets it be any age.
    pub k: u8,
    /// The reconciler's secret cache may miss this many of the latest changes.
    pub cache_k: u8,
    /// The guard's grace period, in ticks (the tick is the configured grace period divided
    /// by this).
    pub grace_ticks: u8,
    /// The after-fix cleanup's own grace period, in ticks.
    pub client_grace_ticks: u8,
    /// Pods the adversary may create.
    pub adversary_pods: u8,
    /// Reconciler replicas (each with its own watch and queue).
    pub reconcilers: u8,
    /// Writes the guard's pod watch may be behind: the events of the last `watch_lag`
    /// writes may be undelivered (0: each is delivered with its write).
    pub watch_lag: u8,
    /// The guard's pod watch may fail and relist (at any time, any number of times).
    pub relists: bool,
    /// Which pods the adversary may create.
    pub catalogue: Catalogue,
}

/// The adversary's choice of pods.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Catalogue {
    /// Every combination of a name (the modelled workers' and `x`), a worker label (none
    /// or a modelled worker), a protected-secrets annotation (none or one secret) and spec
    /// references (none, one secret, or every worker secret), over the modelled workers'
    /// secrets and `db-password`.
    Full,
    /// One pod per attack class (see [`representative_pods`]).
    Representative,
}

/// The model of the guard, the hatcheries, the cleanup, the garbage collector, the
/// reconciler and the adversary, for one variant.
pub struct GuardModel {
    pub bounds: Bounds,
    pub variant: Variant,
    pub policy: worker::Settings,
    pub shared: rules::Settings,
    pub clock: Clock,
    /// The adversary's pods, as the mutating webhook stores them.
    pub catalogue: Vec<PodShape>,
    /// The hatcheries' pods, as the mutating webhook stores them.
    pub hatchery_pods: [PodShape; 2],
    /// The product's answers so far.
    pub memo: Memo,
}

/// Which guard, lookup, adoption and cleanup run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Variant {
    pub guard: Guard,
    pub lookup: Lookup,
    pub adoption: Adoption,
    pub cleanup: Cleanup,
}

impl Variant {
    /// The product as it is, with CDS's cleanup `cleanup`.
    pub fn real(cleanup: Cleanup) -> Self {
        Self {
            guard: Guard::Real,
            lookup: Lookup::Server,
            adoption: Adoption::Real,
            cleanup,
        }
    }
}

// === impl GuardModel ===

impl GuardModel {
    pub fn new(bounds: Bounds, variant: Variant) -> Self {
        let policy = default_policy();
        guard::check_policy(&policy);
        let clock = Clock {
            now: "2026-01-01T00:00:00Z".parse::<Timestamp>().expect("a valid instant"),
            tick: policy.grace_period / u32::from(bounds.grace_ticks),
        };
        let hatchery_pods = Worker::ALL.map(|w| {
            let shape = PodShape {
                name: w.pod(),
                worker_label: Some(w),
                hatchery_label: Some(w),
                annotation: Set::empty(),
                refs: Set::of(w.secret()),
            };
            guard::admit_pod(&policy, &shape)
        });
        // Pods the webhook stores alike are one choice (it rewrites the annotation of a pod
        // that uses protected secrets).
        let mut catalogue: Vec<PodShape> = Vec::new();
        let workers = &Worker::ALL[..usize::from(bounds.workers)];
        for shape in requested_pods(bounds.catalogue, workers) {
            let stored = guard::admit_pod(&policy, &shape);
            if !catalogue.contains(&stored) {
                catalogue.push(stored);
            }
        }
        Self {
            bounds,
            variant,
            policy,
            shared: default_shared(),
            clock,
            catalogue,
            hatchery_pods,
            memo: Memo::default(),
        }
    }

    /// What the guard sees in state `s`.
    pub fn view<'a>(&'a self, s: &'a State) -> View<'a> {
        View {
            policy: &self.policy,
            shared: &self.shared,
            clock: &self.clock,
            snapshot: s.now(),
            ages: &s.ages,
            caches: Caches {
                hint: s.watch.shown.clone(),
                index: s.watch.index_for_label_read(self.variant.lookup),
            },
        }
    }

    /// The workers the hatcheries spawn.
    pub fn workers(&self) -> &'static [Worker] {
        &Worker::ALL[..usize::from(self.bounds.workers)]
    }

    /// Ages stop counting where no grace period tells them apart any more.
    pub fn age_cap(&self) -> u8 {
        self.bounds.grace_ticks.max(self.bounds.client_grace_ticks)
    }
}

impl Model for GuardModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State::initial(
            usize::from(self.bounds.reconcilers),
            self.variant.lookup,
        )]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        // A state that broke a safety property ends the run: its trace is the
        // counterexample, and nothing after it matters.
        if state.ghost.lost || state.ghost.deputy {
            return;
        }
        self.environment_actions(state, actions);
        self.system_actions(state, actions);
    }

    fn next_state(&self, state: &State, action: Action) -> Option<State> {
        let next = self.apply(state, action).map(|(next, _)| next);
        // Quiescence is "no system step offered": that is only the end of a fair run if
        // every system step offered does something.
        assert!(
            next.is_some() || !action.is_system(),
            "system step {action:?} offered but changes nothing"
        );
        next
    }

    fn properties(&self) -> Vec<Property<Self>> {
        properties::all()
    }
}

/// The guard's configuration exactly as `serve` builds it from its default flags.
fn serve_defaults() -> cds_secret_guard::Config {
    use clap::Parser;
    let cli = cds_secret_guard::cli::Cli::parse_from(["cds-secret-guard", "serve"]);
    let cds_secret_guard::cli::Command::Serve(args) = cli.command else {
        unreachable!("parsed serve")
    };
    args.into_config()
}

/// The worker rules' settings of `serve` by default.
pub fn default_policy() -> worker::Settings {
    serve_defaults().worker
}

/// The settings the rule sets share, as `serve` has them by default.
pub fn default_shared() -> rules::Settings {
    serve_defaults().rules
}

fn requested_pods(kind: Catalogue, workers: &[Worker]) -> Vec<PodShape> {
    match kind {
        Catalogue::Full => every_pod(workers),
        Catalogue::Representative => representative_pods(workers),
    }
}

fn every_pod(workers: &[Worker]) -> Vec<PodShape> {
    let secrets: Vec<SecretId> = workers
        .iter()
        .map(|w| w.secret())
        .chain([SecretId::DbPassword])
        .collect();
    let one_each = || secrets.iter().copied().map(Set::of);
    let annotations: Vec<Set<SecretId>> = std::iter::once(Set::empty()).chain(one_each()).collect();
    let mut refs: Vec<Set<SecretId>> = std::iter::once(Set::empty()).chain(one_each()).collect();
    if workers.len() > 1 {
        refs.push(workers.iter().map(|w| w.secret()).collect());
    }
    let names = workers.iter().map(|w| w.pod()).chain([PodName::Other]);
    let labels: Vec<Option<Worker>> = std::iter::once(None).chain(workers.iter().copied().map(Some)).collect();
    let mut shapes = Vec::new();
    for name in names {
        for &worker_label in &labels {
            for &annotation in &annotations {
                for &refs in &refs {
                    shapes.push(PodShape {
                        name,
                        worker_label,
                        hatchery_label: None,
                        annotation,
                        refs,
                    });
                }
            }
        }
    }
    shapes
}

/// One pod per attack class, against worker `w1` (and `w2` when modelled):
/// - `w1` using `w1`'s secret: the name squat;
/// - `w1` using nothing: the name taken, the worker never runs;
/// - `x` labelled `w1`, using `w1`'s secret: another name claiming the worker by label;
/// - `x` labelled `w1`, annotated with `db-password`, using nothing: the annotation lie;
/// - `w1` using `db-password`: an unprotected secret in the spec, under the worker's name;
/// - with `w2`: `w1` using `w2`'s secret (another worker's secret under a worker's name),
///   and `x` labelled `w1` annotated with `w2`'s secret.
pub fn representative_pods(workers: &[Worker]) -> Vec<PodShape> {
    let pod = |name, worker_label, annotation: &[SecretId], refs: &[SecretId]| PodShape {
        name,
        worker_label,
        hatchery_label: None,
        annotation: annotation.iter().copied().collect(),
        refs: refs.iter().copied().collect(),
    };
    let (w1, s1, db, x) = (Worker::W1, Worker::W1.secret(), SecretId::DbPassword, PodName::Other);
    let mut pods = vec![
        pod(w1.pod(), None, &[], &[s1]),
        pod(w1.pod(), None, &[], &[]),
        pod(x, Some(w1), &[], &[s1]),
        pod(x, Some(w1), &[db], &[]),
        pod(w1.pod(), None, &[], &[db]),
    ];
    if workers.contains(&Worker::W2) {
        let s2 = Worker::W2.secret();
        pods.push(pod(w1.pod(), None, &[], &[s2]));
        pods.push(pod(x, Some(w1), &[s2], &[]));
    }
    pods
}
