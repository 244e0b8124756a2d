//! What the renewer does next, decided from facts alone (pure: no clock, no I/O, no
//! keys), so that the order of a rotation can be tested exhaustively.
//!
//! The order is Kubewarden's, the one that never serves a leaf the apiserver cannot
//! verify: a new CA joins the bundle next to the old one, the bundle is written into the
//! webhooks, leaves are signed by the new CA only once the webhooks have held it for the
//! settle time, and an old CA leaves the bundle only once it has expired, when no leaf
//! can chain to it any more (a leaf never outlives its CA).

/// A certificate as the plan sees it: its DER (its identity) and when it expires.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cert {
    /// The DER encoding.
    pub der: Vec<u8>,
    /// Expiry, Unix seconds.
    pub not_after: i64,
}

/// Adds to `bundle` each of `certs` it does not hold yet, in order.
pub fn add_to_bundle(bundle: &mut Vec<Cert>, certs: impl IntoIterator<Item = Cert>) {
    for cert in certs {
        if !bundle.contains(&cert) {
            bundle.push(cert);
        }
    }
}

/// The serving certificate in the state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leaf {
    /// Expiry, Unix seconds.
    pub not_after: i64,
    /// Its key matches, the signing CA issued it, and it names exactly the hosts wanted.
    pub sound: bool,
}

/// Everything the plan decides from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Facts {
    /// Unix seconds.
    pub now: i64,
    /// The bundle the state says the webhooks should hold.
    pub bundle: Vec<Cert>,
    /// The CA that signs leaves.
    pub signing: Option<Cert>,
    /// The CA that will sign leaves once the webhooks have held it for the settle time.
    pub next: Option<Cert>,
    /// Since when the webhooks have been seen to hold `next` (Unix seconds).
    pub next_published: Option<i64>,
    /// The serving certificate.
    pub leaf: Option<Leaf>,
    /// The CAs each webhook (of both configurations) trusts, as read.
    pub held: Vec<Vec<Cert>>,
}

/// The durations the plan derives its deadlines from (seconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// Validity of a new CA.
    pub ca_validity: i64,
    /// Validity of a new leaf (capped by its CA's expiry).
    pub leaf_validity: i64,
    /// How long the webhooks must hold a new CA before it signs: time for every
    /// apiserver to load the new bundle.
    pub settle: i64,
}

/// The next step. After each one but [`Step::Wait`], the renewer reads again and asks
/// again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Make a CA and add it to the bundle. With `signing`, it signs at once (nothing
    /// else is trusted, so nothing can break); otherwise it becomes the next CA. `keep`
    /// are CAs the webhooks hold that join the bundle too (an earlier install's, a lost
    /// state's).
    NewCa {
        /// Whether it signs at once.
        signing: bool,
        /// CAs added to the bundle with it.
        keep: Vec<Cert>,
    },
    /// Remove expired CAs from the bundle.
    Prune(Vec<Cert>),
    /// Sign a new leaf with the signing CA, expiring at `not_after`.
    SignLeaf {
        /// Expiry, Unix seconds.
        not_after: i64,
    },
    /// Write the state's bundle into every webhook.
    Publish,
    /// Record when the webhooks were seen holding the next CA (`None`: they no longer do).
    MarkPublished(Option<i64>),
    /// The next CA becomes the signing CA, and signs a new leaf expiring at `not_after`.
    Activate {
        /// The new leaf's expiry, Unix seconds.
        not_after: i64,
    },
    /// Nothing to do before this time (Unix seconds).
    Wait(i64),
}

// === impl Timing ===

impl Timing {
    /// The timing for these validities: a CA is replaced with a third of its life left,
    /// a leaf renewed with a third of its life left; the settle time is a hundredth of
    /// the CA's life, between 5 s and 2 min.
    pub fn new(ca_validity: i64, leaf_validity: i64) -> Self {
        Self {
            ca_validity,
            leaf_validity,
            settle: (ca_validity / 100).clamp(5, 120),
        }
    }

    /// When a CA expiring at `not_after` gets a successor.
    fn ca_renewal(&self, not_after: i64) -> i64 {
        not_after - self.ca_validity / 3
    }

    /// When a leaf expiring at `not_after` is renewed.
    fn leaf_renewal(&self, not_after: i64) -> i64 {
        not_after - self.leaf_validity / 3
    }
}

/// The next step from `facts`.
pub fn plan(facts: &Facts, timing: &Timing) -> Step {
    let now = facts.now;
    let (signing, next) = (facts.signing.as_ref(), facts.next.as_ref());

    // Nothing signs and nothing is on its way: a first start, or a lost state.
    if signing.is_none() && next.is_none() {
        let mut keep: Vec<Cert> = Vec::new();
        for cert in facts.held.iter().flatten().chain(&facts.bundle) {
            if cert.not_after > now && !keep.contains(cert) {
                keep.push(cert.clone());
            }
        }
        // A CA the webhooks trust may have signed the leaves being served: it stays, and
        // the new CA waits its turn like any successor.
        let signing = facts.held.iter().flatten().all(|cert| cert.not_after <= now);
        return Step::NewCa { signing, keep };
    }

    let expired: Vec<Cert> = facts
        .bundle
        .iter()
        .filter(|cert| cert.not_after <= now && Some(*cert) != signing && Some(*cert) != next)
        .cloned()
        .collect();
    if !expired.is_empty() {
        return Step::Prune(expired);
    }

    if let Some(signing) = signing {
        let renewed = leaf_expiry(now, signing, timing);
        let due = match &facts.leaf {
            None => true,
            Some(leaf) if !leaf.sound => true,
            // Valid for clearly longer than a new one would be: the validity was
            // shortened. (The margin keeps replicas with clocks apart from taking turns.)
            Some(leaf) if leaf.not_after > renewed + timing.leaf_validity / 10 => true,
            Some(leaf) => now >= timing.leaf_renewal(leaf.not_after) && renewed > leaf.not_after,
        };
        if due && renewed > now {
            return Step::SignLeaf { not_after: renewed };
        }
        let shortened = signing.not_after > now + timing.ca_validity + timing.ca_validity / 10;
        if next.is_none() && (now >= timing.ca_renewal(signing.not_after) || shortened) {
            return Step::NewCa {
                signing: false,
                keep: Vec::new(),
            };
        }
    }

    if facts.held.iter().any(|held| !same_set(held, &facts.bundle)) {
        // A webhook lost the next CA (someone wrote an older bundle back): its settle
        // time starts over once it holds it again.
        let withdrawn = next.is_some_and(|next| facts.held.iter().any(|held| !held.contains(next)));
        if withdrawn && facts.next_published.is_some() {
            return Step::MarkPublished(None);
        }
        return Step::Publish;
    }

    // Every webhook holds the bundle, the next CA with it.
    if let Some(next) = next {
        match facts.next_published {
            None => return Step::MarkPublished(Some(now)),
            Some(since) if now >= since + timing.settle => {
                return Step::Activate {
                    not_after: leaf_expiry(now, next, timing),
                };
            }
            Some(_) => {}
        }
    }

    Step::Wait(deadline(facts, timing))
}

/// A new leaf's expiry: its validity, but never past its CA's.
fn leaf_expiry(now: i64, ca: &Cert, timing: &Timing) -> i64 {
    (now + timing.leaf_validity).min(ca.not_after)
}

/// The earliest time something will be due.
fn deadline(facts: &Facts, timing: &Timing) -> i64 {
    let mut times = Vec::new();
    if let Some(signing) = &facts.signing {
        times.push(timing.ca_renewal(signing.not_after));
        if let Some(leaf) = &facts.leaf {
            times.push(timing.leaf_renewal(leaf.not_after));
        }
    }
    if let Some(since) = facts.next_published {
        times.push(since + timing.settle);
    }
    times.extend(facts.bundle.iter().map(|cert| cert.not_after));
    times
        .into_iter()
        .filter(|time| *time > facts.now)
        .min()
        .unwrap_or(facts.now + timing.settle)
}

/// Whether two bundles hold the same certificates, in any order.
fn same_set(a: &[Cert], b: &[Cert]) -> bool {
    a.iter().all(|cert| b.contains(cert)) && b.iter().all(|cert| a.contains(cert))
}

#[cfg(test)]
mod tests;
