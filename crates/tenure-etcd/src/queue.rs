//! The tenure layout's queue, sans-IO: what one look at an election finds and what a
//! waiting candidate does next (see [`SeatKeys`] for the keys).
//!
//! Grant order is priority (highest first), then arrival: the key order of the
//! buckets, then create revision within a bucket. Each waiter waits on the one key
//! just before its own in that order (or on the seat when none is), so a release
//! wakes one waiter; the grant itself is a transaction whose compares say that the
//! seat is free and that no queue key is ahead of the taker's, so a waiter acting on a
//! stale view takes nothing.

use crate::keys::{decode_handover, queue_key_lease, SeatKeys};
use crate::proto::KeyValue;

/// The seat as read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SeatState {
    /// Its create revision: the holder's token.
    pub(crate) create: i64,
    /// The holder's lease.
    pub(crate) lease: i64,
    /// The holder's entry, when read with values.
    pub(crate) value: Vec<u8>,
}

impl SeatState {
    pub(crate) fn from_kv(kv: &KeyValue) -> Self {
        SeatState {
            create: kv.create_revision,
            lease: kv.lease,
            value: kv.value.clone(),
        }
    }
}

/// A pending handover request: the next grant goes to the queue key `key` created at
/// `revision`, if it is still there. `modified` is the request's mod revision, so that
/// a grant uses up exactly the request it read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Handover {
    pub(crate) key: String,
    pub(crate) revision: i64,
    pub(crate) modified: i64,
}

impl Handover {
    /// The request stored in `kv`; a value that is not one names no key (any taker
    /// uses it up).
    pub(crate) fn from_kv(kv: &KeyValue) -> Self {
        let (key, revision) = decode_handover(&kv.value).unwrap_or_default();
        Handover {
            key,
            revision,
            modified: kv.mod_revision,
        }
    }
}

/// One look at an election from a waiter's side.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Look {
    /// Whether the waiter's queue key is still there (with its create revision).
    pub(crate) own: bool,
    /// The key just before the waiter's in grant order, if any.
    pub(crate) ahead: Option<String>,
    pub(crate) seat: Option<SeatState>,
    pub(crate) handover: Option<Handover>,
    /// The store revision the look was read at.
    pub(crate) revision: i64,
}

/// The key just before `own` (created at `revision`) in grant order: the newest older
/// key of its own bucket (`same_bucket`, keys of the bucket read newest first), else
/// the last key of the buckets of higher priority (`higher`).
pub(crate) fn ahead_of(
    own: &str,
    revision: i64,
    same_bucket: &[KeyValue],
    higher: &[KeyValue],
) -> Option<String> {
    same_bucket
        .iter()
        .find(|kv| kv.create_revision < revision && kv.key != own.as_bytes())
        .or_else(|| higher.first())
        .map(|kv| String::from_utf8_lossy(&kv.key).into_owned())
}

/// What a waiter does after a look.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// The seat is this candidacy's (handed to it by another waiter, or taken by a
    /// transaction whose answer was lost): the token is its create revision.
    Held(i64),
    /// The seat is on this session's lease from an older candidacy: delete that seat
    /// (created at this revision), then look again.
    ClearStale(i64),
    /// The queue key is gone (deleted by an operator, or the lease expired): queue
    /// again.
    Requeue,
    /// Take the free seat: in queue order (`in_order`: no key ahead, checked by the
    /// transaction), or as the target of a handover (not in order); `handover` is the
    /// mod revision of the request the grant uses up.
    Take {
        in_order: bool,
        handover: Option<i64>,
    },
    /// First in line with the seat free and a handover asked for another waiter: give
    /// the seat to that waiter if it is still there, else take it in order.
    HandOver(Handover),
    /// Wait until `key` is deleted; `then_take`: it is the seat or the holder's queue
    /// key with nobody else ahead, so try to take the seat at once then.
    Wait { key: String, then_take: bool },
}

/// The next step of the waiter with `keys` (lease `lease`, queue key created at
/// `revision`) after `look`.
pub(crate) fn next_step(look: &Look, keys: &SeatKeys, revision: i64, lease: i64) -> Step {
    let own_seat = look.seat.as_ref().filter(|s| s.lease == lease);
    if let Some(seat) = own_seat {
        if seat.create > revision {
            return Step::Held(seat.create);
        }
        if look.own {
            return Step::ClearStale(seat.create);
        }
    }
    if !look.own {
        return Step::Requeue;
    }
    match (&look.seat, &look.handover, &look.ahead) {
        (Some(seat), _, ahead) => {
            let holder_key = ahead
                .as_deref()
                .filter(|k| queue_key_lease(k.as_bytes()) == Some(seat.lease));
            match ahead {
                None => Step::Wait {
                    key: keys.seat.clone(),
                    then_take: true,
                },
                Some(key) => Step::Wait {
                    key: key.clone(),
                    then_take: holder_key.is_some(),
                },
            }
        }
        (None, Some(h), _) if h.key == keys.queue && h.revision == revision => Step::Take {
            in_order: false,
            handover: Some(h.modified),
        },
        (None, Some(h), None) => Step::HandOver(h.clone()),
        (None, None, None) => Step::Take {
            in_order: true,
            handover: None,
        },
        (None, _, Some(key)) => Step::Wait {
            key: key.clone(),
            then_take: false,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::{EtcdLayout, KeySpace};
    use tenure_core::ElectionName;

    fn keys(lease: i64, priority: i32) -> SeatKeys {
        let e = ElectionName::new("e").unwrap();
        KeySpace::new("t", EtcdLayout::Tenure).seat_keys(&e, lease, priority)
    }

    fn kv(key: &str, create: i64) -> KeyValue {
        KeyValue {
            key: key.as_bytes().to_vec(),
            create_revision: create,
            ..Default::default()
        }
    }

    fn seat(create: i64, lease: i64) -> Option<SeatState> {
        Some(SeatState {
            create,
            lease,
            value: Vec::new(),
        })
    }

    fn look(ahead: Option<&str>, seat: Option<SeatState>, handover: Option<Handover>) -> Look {
        Look {
            own: true,
            ahead: ahead.map(str::to_string),
            seat,
            handover,
            revision: 100,
        }
    }

    /// `step` waits on a key and does not take the seat when it goes.
    fn assert_waits_without_taking(step: &Step) {
        assert!(
            matches!(
                step,
                Step::Wait {
                    then_take: false,
                    ..
                }
            ),
            "{step:?}"
        );
    }

    #[test]
    fn the_key_ahead_is_the_newest_older_one_of_the_bucket_else_a_higher_bucket() {
        let me = keys(1, 0);
        let older = kv(&keys(2, 0).queue, 5);
        let newer = kv(&keys(3, 0).queue, 20);
        let high = kv(&keys(4, 5).queue, 30);
        // Newest first, as the reads return them; our own key and newer ones skipped.
        let bucket = [newer.clone(), kv(&me.queue, 10), older.clone()];
        assert_eq!(
            ahead_of(&me.queue, 10, &bucket, std::slice::from_ref(&high)),
            Some(keys(2, 0).queue)
        );
        // First of its bucket: the higher bucket's key, however new.
        let first = [newer, kv(&me.queue, 10)];
        assert_eq!(
            ahead_of(&me.queue, 10, &first, std::slice::from_ref(&high)),
            Some(keys(4, 5).queue)
        );
        assert_eq!(ahead_of(&me.queue, 10, &first, &[]), None);
    }

    #[test]
    fn a_waiter_waits_on_the_one_key_ahead_and_takes_only_a_free_seat() {
        let me = keys(1, 0);
        let holder = keys(7, 0);
        let other = keys(8, 0);
        // Behind the holder's own queue key: wait on it, take at once when it goes.
        let step = next_step(&look(Some(&holder.queue), seat(50, 7), None), &me, 100, 1);
        assert_eq!(
            step,
            Step::Wait {
                key: holder.queue.clone(),
                then_take: true
            }
        );
        // Behind another waiter: wait on it, look again when it goes.
        let step = next_step(&look(Some(&other.queue), seat(50, 7), None), &me, 100, 1);
        assert_eq!(
            step,
            Step::Wait {
                key: other.queue.clone(),
                then_take: false
            }
        );
        // First in line, seat held by someone behind us (we have the higher priority):
        // wait on the seat.
        let step = next_step(&look(None, seat(50, 7), None), &me, 100, 1);
        assert_eq!(
            step,
            Step::Wait {
                key: me.seat.clone(),
                then_take: true
            }
        );
        // First with the seat free: take in order.
        let step = next_step(&look(None, None, None), &me, 100, 1);
        assert_eq!(
            step,
            Step::Take {
                in_order: true,
                handover: None
            }
        );
        // Not first with the seat free: wait, do not take.
        let step = next_step(&look(Some(&other.queue), None, None), &me, 100, 1);
        assert_waits_without_taking(&step);
    }

    #[test]
    fn a_handover_goes_to_its_target_ahead_of_the_order() {
        let me = keys(1, 0);
        let other = keys(8, 0);
        let to_me = Handover {
            key: me.queue.clone(),
            revision: 100,
            modified: 120,
        };
        // The target takes the free seat even with keys ahead, using the request up.
        let step = next_step(
            &look(Some(&other.queue), None, Some(to_me.clone())),
            &me,
            100,
            1,
        );
        assert_eq!(
            step,
            Step::Take {
                in_order: false,
                handover: Some(120)
            }
        );
        // A request for an older candidacy of ours (another revision) is not ours.
        let step = next_step(&look(None, None, Some(to_me.clone())), &me, 101, 1);
        assert_eq!(step, Step::HandOver(to_me.clone()));
        // The first in line hands the seat to the target.
        let to_other = Handover {
            key: other.queue.clone(),
            ..to_me
        };
        let step = next_step(&look(None, None, Some(to_other.clone())), &me, 100, 1);
        assert_eq!(step, Step::HandOver(to_other.clone()));
        // Others keep waiting.
        let step = next_step(&look(Some(&other.queue), None, Some(to_other)), &me, 100, 1);
        assert_waits_without_taking(&step);
    }

    #[test]
    fn a_seat_on_our_lease_is_ours_only_when_newer_than_our_queue_key() {
        let me = keys(1, 0);
        // Handed to us (our queue key deleted by the hand-over transaction).
        let handed = Look {
            own: false,
            ..look(None, seat(130, 1), None)
        };
        assert_eq!(next_step(&handed, &me, 100, 1), Step::Held(130));
        // Taken by us, the answer lost.
        assert_eq!(
            next_step(&look(None, seat(130, 1), None), &me, 100, 1),
            Step::Held(130)
        );
        // An older seat of ours (a resign that never reached etcd) is cleared.
        assert_eq!(
            next_step(&look(None, seat(90, 1), None), &me, 100, 1),
            Step::ClearStale(90)
        );
        // Our key gone, the seat someone else's: queue again.
        let gone = Look {
            own: false,
            ..look(None, seat(130, 7), None)
        };
        assert_eq!(next_step(&gone, &me, 100, 1), Step::Requeue);
    }
}
