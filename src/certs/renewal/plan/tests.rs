use super::*;

/// A CA or leaf of the simulated world: an id standing for its DER.
fn cert(id: u8, not_after: i64) -> Cert {
    Cert {
        der: vec![id],
        not_after,
    }
}

/// Five years of CA and ninety days of leaf, in seconds.
const YEAR: i64 = 365 * 24 * 3600;
const TIMING: Timing = Timing {
    ca_validity: 5 * YEAR,
    leaf_validity: 90 * 24 * 3600,
    settle: 120,
};

fn empty(now: i64) -> Facts {
    Facts {
        now,
        bundle: Vec::new(),
        signing: None,
        next: None,
        next_published: None,
        leaf: None,
        held: vec![Vec::new(), Vec::new()],
    }
}

#[test]
fn the_settle_time_is_a_hundredth_of_the_ca_life_within_bounds() {
    assert_eq!(Timing::new(5 * YEAR, 1).settle, 120);
    assert_eq!(Timing::new(360, 1).settle, 5);
    assert_eq!(Timing::new(6000, 1).settle, 60);
}

#[test]
fn a_first_start_signs_at_once() {
    assert_eq!(plan(&empty(1000), &TIMING), a_new_ca(true));
}

#[test]
fn a_ca_the_webhooks_trust_stays_and_the_new_one_waits_its_turn() {
    let earlier = cert(9, 10_000);
    let expired = cert(8, 500);
    let mut facts = empty(1000);
    facts.held = vec![vec![earlier.clone(), expired.clone()], vec![earlier.clone()]];
    assert_eq!(
        plan(&facts, &TIMING),
        Step::NewCa {
            signing: false,
            keep: vec![earlier]
        }
    );

    // Only expired CAs: nothing can chain to them, so the new CA signs at once.
    facts.held = vec![vec![expired]];
    assert_eq!(plan(&facts, &TIMING), a_new_ca(true));
}

#[test]
fn a_missing_or_unsound_leaf_is_signed_never_past_its_ca() {
    let ca = cert(1, 1000 + 10 * 24 * 3600);
    let mut facts = empty(1000);
    facts.bundle = vec![ca.clone()];
    facts.signing = Some(ca.clone());
    facts.held = vec![vec![ca.clone()]];
    assert_eq!(
        plan(&facts, &TIMING),
        Step::SignLeaf {
            not_after: ca.not_after
        }
    );
    facts.leaf = Some(Leaf {
        not_after: ca.not_after,
        sound: false,
    });
    assert!(matches!(plan(&facts, &TIMING), Step::SignLeaf { .. }));
}

#[test]
fn a_leaf_capped_by_its_ca_is_not_signed_again_and_again() {
    let ca = cert(1, 5000);
    let mut facts = empty(4900);
    facts.bundle = vec![ca.clone()];
    facts.signing = Some(ca.clone());
    facts.next = Some(cert(2, 5 * YEAR));
    facts.bundle.push(cert(2, 5 * YEAR));
    facts.held = vec![facts.bundle.clone()];
    facts.leaf = Some(Leaf {
        not_after: 5000,
        sound: true,
    });
    assert!(!matches!(plan(&facts, &TIMING), Step::SignLeaf { .. }));
}

#[test]
fn a_shortened_validity_takes_effect_at_once() {
    // A CA and a leaf made under longer validities than the ones now configured.
    let ca = cert(1, 1000 + 2 * TIMING.ca_validity);
    let mut facts = empty(1000);
    facts.bundle = vec![ca.clone()];
    facts.signing = Some(ca.clone());
    facts.held = vec![vec![ca.clone()]];
    facts.leaf = Some(Leaf {
        not_after: 1000 + 2 * TIMING.leaf_validity,
        sound: true,
    });
    assert_eq!(
        plan(&facts, &TIMING),
        Step::SignLeaf {
            not_after: 1000 + TIMING.leaf_validity
        }
    );
    facts.leaf = Some(Leaf {
        not_after: 1000 + TIMING.leaf_validity,
        sound: true,
    });
    assert_eq!(plan(&facts, &TIMING), a_new_ca(false));
}

#[test]
fn the_bundle_is_published_when_a_webhook_holds_another() {
    let ca = cert(1, 5 * YEAR);
    let mut facts = empty(1000);
    facts.bundle = vec![ca.clone()];
    facts.signing = Some(ca.clone());
    facts.leaf = Some(Leaf {
        not_after: 1000 + TIMING.leaf_validity,
        sound: true,
    });
    facts.held = vec![vec![ca.clone()], Vec::new()];
    assert_eq!(plan(&facts, &TIMING), Step::Publish);
    facts.held = vec![vec![ca.clone()], vec![ca.clone(), cert(7, 5 * YEAR)]];
    assert_eq!(plan(&facts, &TIMING), Step::Publish);
    facts.held = vec![vec![ca.clone()], vec![ca]];
    assert!(matches!(plan(&facts, &TIMING), Step::Wait(_)));
}

#[test]
fn a_next_ca_signs_only_after_the_settle_time_and_waits_again_when_withdrawn() {
    let (old, new) = (cert(1, 5 * YEAR), cert(2, 9 * YEAR));
    let mut facts = empty(1000);
    facts.bundle = vec![old.clone(), new.clone()];
    facts.signing = Some(old.clone());
    facts.next = Some(new.clone());
    facts.leaf = Some(Leaf {
        not_after: 1000 + TIMING.leaf_validity,
        sound: true,
    });
    facts.held = vec![vec![old.clone()], vec![old.clone()]];
    assert_eq!(plan(&facts, &TIMING), Step::Publish);
    facts.held = vec![facts.bundle.clone(), facts.bundle.clone()];
    assert_eq!(plan(&facts, &TIMING), Step::MarkPublished(Some(1000)));

    facts.next_published = Some(1000);
    facts.now = 1000 + TIMING.settle - 1;
    assert_eq!(plan(&facts, &TIMING), Step::Wait(1000 + TIMING.settle));
    facts.now = 1000 + TIMING.settle;
    assert_eq!(
        plan(&facts, &TIMING),
        Step::Activate {
            not_after: facts.now + TIMING.leaf_validity
        }
    );

    // Someone wrote the old bundle back into one webhook: the settle time is forgotten
    // before the bundle is published again.
    facts.held[1] = vec![old];
    assert_eq!(plan(&facts, &TIMING), Step::MarkPublished(None));
    facts.next_published = None;
    assert_eq!(plan(&facts, &TIMING), Step::Publish);
}

#[test]
fn an_old_ca_leaves_the_bundle_only_once_expired() {
    let (old, new) = (cert(1, 2000), cert(2, 5 * YEAR));
    let mut facts = empty(1999);
    facts.bundle = vec![old.clone(), new.clone()];
    facts.signing = Some(new.clone());
    facts.leaf = Some(Leaf {
        not_after: 1999 + TIMING.leaf_validity,
        sound: true,
    });
    facts.held = vec![facts.bundle.clone()];
    assert_eq!(plan(&facts, &TIMING), Step::Wait(2000));
    facts.now = 2000;
    assert_eq!(plan(&facts, &TIMING), Step::Prune(vec![old]));
}

/// The world the plan acts on, simulated: the renewer's state, the webhooks it writes,
/// and an apiserver that sees the webhooks `lag` seconds late and verifies the leaf a
/// replica serves (the newest one that chains to what the webhooks hold, as read by the
/// replica). Steps are applied as the renewer applies them.
struct World {
    timing: Timing,
    now: i64,
    lag: i64,
    ids: u8,
    bundle: Vec<Cert>,
    signing: Option<Cert>,
    next: Option<Cert>,
    next_published: Option<i64>,
    /// The leaf in the renewer's state: (issuer, not_after).
    leaf: Option<(Cert, i64)>,
    /// Every leaf signed so far, which a replica may still serve: (issuer, not_after).
    leaves: Vec<(Cert, i64)>,
    /// What the webhooks held, from when.
    history: Vec<(i64, Vec<Cert>)>,
    rotations: usize,
    /// Seconds during which the apiserver could not verify the served leaf.
    broken: i64,
}

impl World {
    fn new(timing: Timing, lag: i64) -> Self {
        Self {
            timing,
            now: 0,
            lag,
            ids: 0,
            bundle: Vec::new(),
            signing: None,
            next: None,
            next_published: None,
            leaf: None,
            leaves: Vec::new(),
            history: vec![(i64::MIN, Vec::new())],
            rotations: 0,
            broken: 0,
        }
    }

    fn held_at(&self, time: i64) -> &[Cert] {
        let (_, held) = self.history.iter().rev().find(|(since, _)| *since <= time).unwrap();
        held
    }

    fn facts(&self) -> Facts {
        let leaf = self.leaf.as_ref().map(|(issuer, not_after)| Leaf {
            not_after: *not_after,
            sound: Some(issuer) == self.signing.as_ref(),
        });
        Facts {
            now: self.now,
            bundle: self.bundle.clone(),
            signing: self.signing.clone(),
            next: self.next.clone(),
            next_published: self.next_published,
            leaf,
            held: vec![self.held_at(self.now).to_vec(); 2],
        }
    }

    fn new_ca(&mut self) -> Cert {
        self.ids += 1;
        cert(self.ids, self.now + self.timing.ca_validity)
    }

    fn sign(&mut self, issuer: Cert, not_after: i64) {
        assert!(not_after <= issuer.not_after, "a leaf outlives its CA");
        self.leaf = Some((issuer.clone(), not_after));
        self.leaves.push((issuer, not_after));
    }

    fn apply(&mut self, step: Step) {
        match step {
            Step::NewCa { signing, keep } => {
                let ca = self.new_ca();
                add_to_bundle(&mut self.bundle, keep.into_iter().chain([ca.clone()]));
                if signing {
                    self.signing = Some(ca);
                } else {
                    self.next = Some(ca);
                }
            }
            Step::Prune(expired) => self.bundle.retain(|cert| !expired.contains(cert)),
            Step::SignLeaf { not_after } => {
                let issuer = self.signing.clone().unwrap();
                self.sign(issuer, not_after);
            }
            Step::Publish => self.history.push((self.now, self.bundle.clone())),
            Step::MarkPublished(since) => self.next_published = since,
            Step::Activate { not_after } => {
                let next = self.next.take().unwrap();
                self.signing = Some(next.clone());
                self.next_published = None;
                self.rotations += 1;
                self.sign(next, not_after);
            }
            Step::Wait(_) => unreachable!(),
        }
    }

    /// Runs until `end`, checking every second what the apiserver would verify.
    fn run(&mut self, end: i64) {
        while self.now < end {
            for _ in 0..20 {
                match plan(&self.facts(), &self.timing) {
                    Step::Wait(until) => {
                        assert!(until > self.now, "a wait that is already over");
                        break;
                    }
                    step => self.apply(step),
                }
            }
            self.check();
            self.now += 1;
        }
    }

    /// The served leaf is the newest one, signed by now, that chains to the webhooks'
    /// bundle as the replica reads it now; the apiserver verifies it against the bundle
    /// as it saw it `lag` seconds ago.
    fn check(&mut self) {
        let replica = self.held_at(self.now).to_vec();
        let apiserver = self.held_at(self.now - self.lag).to_vec();
        let served = self
            .leaves
            .iter()
            .rev()
            .find(|(issuer, not_after)| replica.contains(issuer) && *not_after > self.now);
        let verified = served.is_some_and(|(issuer, _)| apiserver.contains(issuer) && issuer.not_after > self.now);
        // Before the first leaf is signed and published there is nothing to break.
        if !verified && self.now > self.lag + 1 {
            self.broken += 1;
        }
    }
}

#[test]
fn three_ca_lifetimes_rotate_with_no_second_unverifiable() {
    // Compressed: a CA of 10 min, leaves of 2 min, settle 5 s, apiservers 3 s late.
    let timing = Timing::new(600, 120);
    let mut world = World::new(timing, 3);
    world.run(3 * 600);
    assert!(world.rotations >= 3, "{} CA rotations", world.rotations);
    assert!(world.leaves.len() >= 12, "{} leaves", world.leaves.len());
    assert_eq!(
        world.broken, 0,
        "seconds the apiserver could not verify the served leaf"
    );
    // Old CAs are pruned: the bundle never grows past the signing, next and one old CA.
    assert!(world.bundle.len() <= 3);
}

#[test]
fn the_same_world_breaks_when_the_settle_time_is_shorter_than_the_apiserver_lag() {
    // The check bites: a renewer that signs with the new CA before every apiserver
    // holds it (Gatekeeper's order, in effect) leaves the apiserver unable to verify.
    let mut timing = Timing::new(600, 120);
    timing.settle = 0;
    let mut world = World::new(timing, 3);
    world.run(3 * 600);
    assert!(world.broken > 0);
}

#[test]
fn a_lost_state_keeps_the_ca_the_webhooks_trust() {
    let timing = Timing::new(600, 120);
    let mut world = World::new(timing, 3);
    world.run(700);
    // The state secret is emptied; the webhooks still hold the bundle, and the replicas
    // the leaves they were serving.
    world.bundle.clear();
    world.signing = None;
    world.next = None;
    world.next_published = None;
    world.leaf = None;
    world.run(2000);
    assert_eq!(world.broken, 0);
}

/// A new CA with nothing else kept, signing at once or not.
fn a_new_ca(signing: bool) -> Step {
    Step::NewCa {
        signing,
        keep: Vec::new(),
    }
}
