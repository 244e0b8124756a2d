use super::*;

#[test]
fn a_used_object_opted_in_to_defer_is_held_and_nothing_else() {
    assert_eq!(plan(false, false, Some(Mode::Defer), true), Step::Hold);
    for (deleting, mode, used) in [
        (false, Some(Mode::Defer), false),
        (false, Some(Mode::Refuse), true),
        (false, None, true),
        // No finalizer can be added to an object being deleted; and without it, the
        // webhook refused the delete of a used object: this one was unused.
        (true, Some(Mode::Defer), true),
    ] {
        assert_eq!(
            plan(false, deleting, mode, used),
            Step::Keep,
            "{deleting} {mode:?} {used}"
        );
    }
}

#[test]
fn a_held_object_being_deleted_waits_for_its_pods_unless_opted_out() {
    for mode in [Mode::Defer, Mode::Refuse] {
        for used in [false, true] {
            assert_eq!(plan(true, true, Some(mode), used), Step::ReleaseWhenUnused);
        }
    }
    assert_eq!(plan(true, true, None, true), Step::Release);
}

#[test]
fn a_held_object_not_being_deleted_keeps_it_while_in_defer() {
    assert_eq!(plan(true, false, Some(Mode::Defer), false), Step::Keep);
    assert_eq!(plan(true, false, Some(Mode::Refuse), true), Step::Release);
    assert_eq!(plan(true, false, None, true), Step::Release);
}
