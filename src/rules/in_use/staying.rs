//! Which pods that use an object stay: not terminal, not being deleted, and not about to
//! be deleted by the garbage collector, judged as it judges, up the owner chains by
//! quorum reads.

use futures::future::BoxFuture;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

use super::{Dependent, InUseLookup, ObjectDelete, WORKLOAD_KINDS};

/// How many owners up a chain is followed; past it, the pod stays.
pub(super) const CHAIN_DEPTH: usize = 4;
/// An object with more owners than this stays, unread: real ones have one, and each
/// owner may cost reads.
pub(super) const MAX_OWNERS: usize = 8;
/// How many pods that stay a denial finds and names; the other users are counted, not
/// followed to their owners.
pub(super) const NAMED_PODS: usize = 3;
/// The finalizer of an owner whose dependents the garbage collector is deleting.
pub(super) const FOREGROUND_DELETION: &str = "foregroundDeletion";

/// The pods that use the object and stay, as far as a decision looks.
#[derive(Debug, Default)]
pub(super) struct Staying {
    /// The first [`NAMED_PODS`] by name.
    pub(super) names: Vec<String>,
    /// The users after them, not followed.
    pub(super) more: usize,
}

/// The pods that use the object and stay: those a watch shows if any stays (no LIST),
/// else those of one quorum LIST.
pub(super) async fn staying_users(request: &ObjectDelete<'_>, lookup: &dyn InUseLookup) -> crate::Result<Staying> {
    let (kind, namespace, name) = (request.kind, request.namespace, request.name);
    let cached = staying(lookup, namespace, lookup.cached_users(namespace, kind, name)).await;
    if let Ok(found) = cached
        && !found.names.is_empty()
    {
        return Ok(found);
    }
    let users = lookup.users(namespace, kind, name).await?;
    staying(lookup, namespace, users).await
}

/// The first [`NAMED_PODS`] of `pods`, by name, that are not terminal and not leaving,
/// and how many users follow them.
async fn staying(lookup: &dyn InUseLookup, namespace: &str, mut pods: Vec<Dependent>) -> crate::Result<Staying> {
    pods.retain(|pod| !pod.terminal);
    pods.sort_unstable_by(|a, b| a.name.cmp(&b.name));
    pods.dedup_by(|a, b| a.name == b.name);
    let mut found = Staying::default();
    for (i, pod) in pods.iter().enumerate() {
        if !leaving(lookup, namespace, pod, CHAIN_DEPTH).await? {
            found.names.push(pod.name.clone());
            if found.names.len() == NAMED_PODS {
                found.more = pods.len() - i - 1;
                break;
            }
        }
    }
    Ok(found)
}

/// Whether `object` is being deleted, or the garbage collector will delete it: it has
/// owners and each of them takes it along.
fn leaving<'a>(
    lookup: &'a dyn InUseLookup,
    namespace: &'a str,
    object: &'a Dependent,
    depth: usize,
) -> BoxFuture<'a, crate::Result<bool>> {
    Box::pin(async move {
        if object.deleting {
            return Ok(true);
        }
        if object.owners.is_empty() || object.owners.len() > MAX_OWNERS || depth == 0 {
            return Ok(false);
        }
        for owner in &object.owners {
            if !takes_along(lookup, namespace, object, owner, depth).await? {
                return Ok(false);
            }
        }
        Ok(true)
    })
}

/// Whether the garbage collector will delete `dependent` for `owner`'s sake: the owner is
/// gone and `dependent`, read after it, still names it (dangling); or it waits for its
/// dependents' deletion; or nothing holds it and it is deleted or leaving itself. An
/// owner of another kind keeps it.
async fn takes_along(
    lookup: &dyn InUseLookup,
    namespace: &str,
    dependent: &Dependent,
    owner: &OwnerReference,
    depth: usize,
) -> crate::Result<bool> {
    let followed = WORKLOAD_KINDS
        .iter()
        .any(|&(api_version, kind)| owner.api_version == api_version && owner.kind == kind);
    if !followed {
        return Ok(false);
    }
    let found = lookup
        .object(namespace, &owner.api_version, &owner.kind, &owner.name)
        .await?;
    match found {
        Some(found) if found.uid == owner.uid => {
            if found
                .finalizers
                .iter()
                .any(|finalizer| finalizer == FOREGROUND_DELETION)
            {
                Ok(true)
            } else if !found.finalizers.is_empty() {
                Ok(false)
            } else {
                leaving(lookup, namespace, &found, depth - 1).await
            }
        }
        // The owner is gone (or another object took its name). Orphaning happens before an
        // owner goes, so a dependent that still names it once it is gone is dangling.
        _ => {
            let again = lookup
                .object(namespace, &dependent.api_version, &dependent.kind, &dependent.name)
                .await?;
            Ok(again.is_none_or(|again| {
                again.uid != dependent.uid || again.owners.iter().any(|named| named.uid == owner.uid)
            }))
        }
    }
}
