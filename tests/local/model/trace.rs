//! Counterexamples as traces of API calls: one line per step, with the actor, the verb,
//! the object and the result.

use std::fmt::Write;

use stateright::Path;

use crate::{
    actors::{Action, AdoptStep, CleanupRound, Hatchery, State},
    model::GuardModel,
    world::{Pod, PodName, PodShape, SecretId, Set, Slot, Worker},
};

/// The trace of a path, one numbered line per step.
pub fn render(model: &GuardModel, path: &Path<State, Action>) -> String {
    let mut out = String::new();
    let steps = path.clone().into_vec();
    for (i, (state, action)) in steps.iter().enumerate() {
        let Some(action) = action else { continue };
        let (actor, call) = describe(model, state, *action);
        let result = model
            .apply(state, *action)
            .map_or_else(|| "(no change)".to_owned(), |(_, o)| o.0);
        let _ = writeln!(out, "{:>3}. {actor:<20} {call:<58} -> {result}", i + 1);
    }
    out
}

/// Who does what to which object, as seen before the step.
pub fn describe(model: &GuardModel, s: &State, action: Action) -> (String, String) {
    let (actor, call) = match action {
        Action::Hatchery(w) => {
            let call = match s.hatcheries[w as usize] {
                Hatchery::Start => format!("CREATE secret {}", w.secret().name()),
                Hatchery::SecretCreated => format!("CREATE pod {}", w.name()),
                Hatchery::PodCreated { .. } => format!("DELETE pod {}", w.name()),
                Hatchery::PodDeleted => format!("DELETE secret {}", w.secret().name()),
                Hatchery::NameTaken | Hatchery::Done => "-".to_owned(),
            };
            (format!("hatchery {}", w.hatchery()), call)
        }
        Action::PodPhase(name) => (format!("pod {}", name.name()), "next phase".to_owned()),
        Action::AdversaryCreate(i) => (
            "adversary".to_owned(),
            format!("CREATE pod {}", shape(&model.catalogue[usize::from(i)])),
        ),
        Action::AdversaryDelete(name) => ("adversary".to_owned(), format!("DELETE pod {}", name.name())),
        Action::Kubelet(name) => ("kubelet".to_owned(), format!("remove pod {}", name.name())),
        Action::CleanupListPods(answer) => (
            "cleanup h1".to_owned(),
            format!("LIST pods CDS_HATCHERY_NAME=h1 ({})", freshness(answer)),
        ),
        Action::CleanupListSecrets => ("cleanup h1".to_owned(), "LIST secrets CDS_HATCHERY_NAME".to_owned()),
        Action::CleanupDelete => {
            let id = match s.cleanup.round {
                CleanupRound::Deleting(doomed) => doomed.first().map_or("?", SecretId::name),
                _ => "?",
            };
            ("cleanup h1".to_owned(), format!("DELETE secret {id}"))
        }
        Action::GcObserve(id) => (
            "garbage collector".to_owned(),
            format!("GET owners of secret {}", id.name()),
        ),
        Action::GcDelete => (
            "garbage collector".to_owned(),
            format!("DELETE secret {}", s.gc.collecting.map_or("?", SecretId::name)),
        ),
        Action::ReconcileGetPod(r, name) => (format!("reconciler {r}"), format!("GET pod {}", name.name())),
        Action::ReconcileRead(r, answer) => {
            let adopting = s.reconcilers[usize::from(r)].adopting.as_ref();
            let id = adopting.and_then(|a| a.todo.first()).map_or("?", SecretId::name);
            let cache = matches!(adopting.map(|a| &a.next), Some(AdoptStep::Read { attempts: 0 }));
            let call = if cache {
                format!("secret {id}: cache ({}) and PATCH, else GET", freshness(answer))
            } else {
                format!("GET secret {id}")
            };
            (format!("reconciler {r}"), call)
        }
        Action::ReconcilePatch(r) => {
            let adopting = s.reconcilers[usize::from(r)].adopting.as_ref();
            let call = match adopting {
                Some(a) => {
                    let version = match &a.next {
                        AdoptStep::Patch { read, .. } => read.version,
                        AdoptStep::Read { .. } => 0,
                    };
                    format!(
                        "PATCH secret {} ownerReferences += {}/{} (rv {version})",
                        a.todo.first().map_or("?", SecretId::name),
                        a.name.name(),
                        a.pod.uid.text()
                    )
                }
                None => "?".to_owned(),
            };
            (format!("reconciler {r}"), call)
        }
        Action::Tick => (
            "clock".to_owned(),
            format!("+{}", humantime::format_duration(model.clock.tick)),
        ),
        Action::Sync => ("replication".to_owned(), "lagging replica catches up".to_owned()),
        Action::WatchDeliver => {
            let call = s.watch.stream.first().and_then(Option::as_ref).map_or_else(
                || "?".to_owned(),
                |(name, pod)| {
                    let kind = match (pod, &s.watch.shown[name.index()]) {
                        (None, _) => "DELETED".to_owned(),
                        (Some(pod), None) => format!("ADDED ({:?})", pod.phase),
                        (Some(pod), Some(_)) => format!("MODIFIED ({})", state_of(pod)),
                    };
                    format!("event: pod {} {kind}", name.name())
                },
            );
            ("guard's pod watch".to_owned(), call)
        }
        Action::WatchRelist(covered) => {
            let behind = s.watch.stream.len() - usize::from(covered);
            let freshness = match behind {
                0 => "current".to_owned(),
                n => format!("{n} write(s) behind"),
            };
            (
                "guard's pod watch".to_owned(),
                format!("watch fails: relist, LIST pods CDS_WORKER_NAME ({freshness})"),
            )
        }
        Action::WatchInitApply => {
            let name = s
                .watch
                .relist
                .as_ref()
                .and_then(|r| r.listed_names().nth(usize::from(r.handed)))
                .map_or("?", PodName::name);
            ("guard's pod watch".to_owned(), format!("relist: hand over pod {name}"))
        }
        Action::WatchInitDone => ("guard's pod watch".to_owned(), "relist done".to_owned()),
    };
    (actor, call)
}

fn state_of(pod: &Pod) -> String {
    if pod.terminating {
        "terminating".to_owned()
    } else {
        format!("{:?}", pod.phase)
    }
}

fn freshness(answer: u8) -> String {
    match answer {
        0 => "current".to_owned(),
        n => format!("stale: {n} change(s) behind"),
    }
}

fn shape(shape: &PodShape) -> String {
    let mut parts = Vec::new();
    if let Some(w) = shape.worker_label {
        parts.push(format!("CDS_WORKER_NAME={}", w.name()));
    }
    if !shape.annotation.is_empty() {
        parts.push(format!("protected-secrets={}", names(shape.annotation)));
    }
    parts.push(format!("uses [{}]", names(shape.refs)));
    format!("{} {{{}}}", shape.name.name(), parts.join(", "))
}

fn names<T: Slot + Into<Named>>(set: Set<T>) -> String {
    set.iter().map(|v| v.into().0).collect::<Vec<_>>().join(",")
}

/// A name to print.
pub struct Named(&'static str);

impl From<SecretId> for Named {
    fn from(id: SecretId) -> Self {
        Named(id.name())
    }
}

impl From<Worker> for Named {
    fn from(w: Worker) -> Self {
        Named(w.name())
    }
}
