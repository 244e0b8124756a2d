//! Which guard, which lookup, which adoption and which cleanup run in the model. The real
//! guard and the real adoption are the product's functions (see `guard`), the real lookup
//! answers as the server's `KubeLookup` does (see `guard` and `watch`); everything else
//! here is a deliberately broken copy kept only to show that the model finds what they
//! break.

use cds_secret_guard::{
    rules::worker::mutation::PROTECTED_SECRETS_ANNOTATION,
    rules::worker::pod::{PodState, WorkerPod},
    rules::worker::{Reason, Verdict},
};

use crate::{
    guard::{self, Decision, Memo, Requester, View},
    world::{Secret, SecretId},
};

/// The validating webhook on secret DELETEs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Guard {
    /// `worker::decide`, the product's rules.
    Real,
    /// No webhook registered: every delete goes through.
    Off,
    /// The old rule 3, checked before rule 5: "all Pod owners gone → allow".
    OldRule3,
    /// `worker::decide` with every read failing (the apiserver unreachable for good): it
    /// fails closed, so nothing protected is ever deleted and secrets leak. Not a bug but
    /// the price of failing closed; here to show that the liveness properties bite.
    Unreachable,
}

/// How the guard's lookup answers (`ClusterLookup`, in `guard`), and how its pod watch
/// claims revisions (`watch`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lookup {
    /// `KubeLookup` over the pod watch of `src/rules/worker/watch.rs`: the watch's store as the
    /// deny hint, the namespace cache, and the label index once the watch has caught up
    /// with a revision read by quorum; every other read by quorum.
    Server,
    /// The label index answers, absence included, without the revision gate.
    Ungated,
    /// The gate waits for the watch's own revision instead of one read by quorum: it
    /// never waits.
    OwnRevision,
    /// A relist claims its list's revision when it starts, and its index fills as the
    /// listed pods are handed over: a read during the relist passes the gate on an
    /// incomplete index.
    EarlyRelistClaim,
}

/// How the reconciler picks and vets the secrets a pod may own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Adoption {
    /// The secrets the pod's spec references, vetted by `owners::may_adopt`.
    Real,
    /// Before the fix: every secret listed in the pod's protected-secrets annotation, for
    /// any live pod carrying the worker label.
    PreFixAnnotation,
}

/// Which version of CDS's `deleteSecrets` the hatchery `h1` runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cleanup {
    /// Deletes every hatchery-labelled secret whose worker is in no listed pod.
    BeforeFix,
    /// The same, skipping secrets younger than its own grace period (upstream's fix).
    AfterFix,
}

/// The decision of the configured guard on one secret DELETE.
pub fn admit(
    variant: Guard,
    memo: &Memo,
    view: &View<'_>,
    id: SecretId,
    secret: &Secret,
    requester: Requester,
) -> Decision {
    let verdict = match variant {
        Guard::Real => return memo.decide(view, id, secret, requester),
        Guard::Off => Verdict::allow(Reason::NotProtected, None, None, "no guard".to_owned()),
        Guard::Unreachable => guard::decide_unreachable(view, id, secret, requester),
        Guard::OldRule3 => {
            let protected = view.policy.worker_of_secret(&view.meta(id, secret)).is_some();
            let owners_gone =
                !secret.owners.is_empty() && secret.owners.iter().all(|&owner| !view.snapshot.has_pod(owner));
            if protected && owners_gone {
                // The old rule: the owners are gone, so the garbage collector may go ahead,
                // whatever else uses the secret now.
                Verdict::allow(Reason::OwnerGone, None, None, "all Pod owners gone".to_owned())
            } else {
                return memo.decide(view, id, secret, requester);
            }
        }
    };
    Decision {
        verdict,
        from_index: false,
    }
}

/// The pre-fix adoption predicate: trusts the pod's labels and annotation.
pub fn pre_fix_may_adopt(policy: &cds_secret_guard::rules::worker::Settings, secret: &str, pod: &WorkerPod) -> bool {
    let labelled = pod
        .metadata
        .labels
        .as_ref()
        .is_some_and(|labels| labels.contains_key(&policy.worker_label));
    let listed = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(PROTECTED_SECRETS_ANNOTATION))
        .is_some_and(|list| list.split(',').any(|name| name == secret));
    labelled && listed && PodState::from(pod).is_live()
}
