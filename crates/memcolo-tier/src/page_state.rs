//! The life of one page of a managed region, as an explicit transition table: the
//! states of [`crate::manager`] (MaxMem §3.3 on far memory, with the sampler's and
//! probation's stashes of [`crate::sampler`]) and the events that move a page between
//! them. [`transition`] is the single source of the legal moves; the tier manager
//! changes a page's state only through it, so a move the table does not list is a
//! visible error (a failed `debug_assert`, an error log in release builds) instead
//! of a silent corruption of the page table.
//!
//! Pure: no userfaultfd, no memory, no locks. The table also says which pages each
//! state counts in the manager's gauges ([`PageState::held_locally`],
//! [`PageState::in_slow_tier`], [`PageState::on_probation`]), so that the gauges
//! follow the transitions instead of being kept by hand beside them.
//!
//! | state | mapped | content |
//! |---|---|---|
//! | untouched | no | never written: zeros |
//! | resident | yes | the page |
//! | evicting | yes, write-protected | being stored |
//! | dropping | being dropped, write-protected | stored, confirmed |
//! | stored | no | the slow tier (with a CRC-32 kept too) |
//! | loading | no | the slow tier, being brought in |
//! | sample-drop | yes, write-protected | being copied aside for sampling |
//! | sample-dropping | being dropped, write-protected | copied aside |
//! | sampled | no | a copy in the stash (the sampler's) |
//! | probe-drop | yes, write-protected | being copied aside for probation |
//! | probe-dropping | being dropped, write-protected | copied aside |
//! | probation | no | a copy in the stash (a next victim under test) |
//! | expiring | no | being stored from its probation copy |
//! | freeing | no | freed by the application mid-move: faults wait for the mover |
//! | lost | no | gone: the slow tier failed; the process must be stopped |

use std::fmt;

/// The state of one page of a managed region (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PageState {
    /// Never written since management began (or freed): reads as zeros.
    Untouched,
    /// Mapped, in local memory.
    Resident,
    /// Mapped and write-protected, being stored in the slow tier.
    Evicting,
    /// Stored (confirmed), being dropped from memory; still write-protected.
    Dropping,
    /// In the slow tier only.
    Stored,
    /// Being brought in from the slow tier (a fault or a prefetch).
    Loading,
    /// Mapped and write-protected, being copied aside for a sampling window.
    SampleDrop,
    /// Copied aside for sampling, being dropped from memory.
    SampleDropping,
    /// Unmapped, its copy in the sampler's stash: a touch is a sample hit.
    Sampled,
    /// Mapped and write-protected, being copied aside for probation.
    ProbeDrop,
    /// Copied aside for probation, being dropped from memory.
    ProbeDropping,
    /// Unmapped, its copy in the stash: a next victim under test.
    Probation,
    /// Being stored in the slow tier from its stash copy (evicted from probation, or
    /// sampled when named as a victim).
    Expiring,
    /// Freed by the application while a worker was moving it (storing, stashing,
    /// dropping, prefetching): faults on it wait until that worker has dropped
    /// whatever copy it made; only then is it untouched.
    Freeing,
    /// Could not be brought back from the slow tier: the process must be stopped.
    Lost,
}

/// What happens to a page; each moves it from some states to one other
/// ([`transition`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PageEvent {
    /// Found holding data in the region's backing when management began (a region
    /// handed over again, or recovered): taken as resident.
    Adopt,
    /// Found only in the dead manager's shadow when the region was recovered: back on
    /// probation, from the shadow's copy.
    RecoverStash,
    /// Found only in the slow tier when the region was recovered: stored.
    RecoverStored,
    /// A missing fault on an untouched page was served with a zero page.
    ZeroFill,
    /// A fault or a prefetch starts loading the page from the slow tier.
    LoadBegin,
    /// The load or its mapping failed without losing the page: it stays stored.
    LoadAborted,
    /// The loaded page was mapped and its slow-tier copy dropped.
    LoadDone,
    /// The load failed for good: the page is lost.
    LoadLost,
    /// A stashed page (sampled, or on probation) was mapped back from its copy.
    MapCopy,
    /// Named as a victim and claimed by an eviction worker: a mapped page is
    /// write-protected for storing; a stashed one is stored from its copy.
    Evict,
    /// The slow tier confirmed the store: a mapped page is then dropped, a page
    /// stored from its copy is done.
    StoreConfirmed,
    /// A sampling window chose the resident page: it is write-protected to be copied
    /// aside.
    Sample,
    /// The resident page is one of the placement's next victims: it is
    /// write-protected to be copied aside for probation.
    Probe,
    /// The page's contents were copied aside (to the stash); it is dropped next.
    Copied,
    /// The page was dropped from memory: it is stored, sampled or on probation.
    Dropped,
    /// A move (eviction, stash) failed: the page is where it was before the move
    /// (resident, or on probation for a failed store from probation).
    MoveFailed,
    /// The application freed the page (`MADV_DONTNEED`, a remove event): untouched,
    /// or freeing while a worker still moves it.
    Free,
    /// A freed page whose slow-tier copy could not be dropped is held while the drop
    /// is tried again: its faults wait.
    HoldForDrop,
    /// The mover of a freed page dropped the copy it made: the page is untouched.
    CopyGone,
    /// At shutdown (threads stopped), the page was mapped back from the slow tier or
    /// its stash copy.
    Restore,
}

/// A move the transition table does not list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IllegalTransition {
    /// The page's state.
    pub from: PageState,
    /// The event that does not apply to it.
    pub event: PageEvent,
}

impl fmt::Display for IllegalTransition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "illegal page transition: {:?} on {:?}",
            self.event, self.from
        )
    }
}

impl std::error::Error for IllegalTransition {}

impl PageState {
    /// Every state.
    pub const ALL: [PageState; 15] = [
        PageState::Untouched,
        PageState::Resident,
        PageState::Evicting,
        PageState::Dropping,
        PageState::Stored,
        PageState::Loading,
        PageState::SampleDrop,
        PageState::SampleDropping,
        PageState::Sampled,
        PageState::ProbeDrop,
        PageState::ProbeDropping,
        PageState::Probation,
        PageState::Expiring,
        PageState::Freeing,
        PageState::Lost,
    ];

    /// Whether the page is held in local memory (mapped, or its copy in the stash):
    /// the manager's resident gauge.
    pub fn held_locally(self) -> bool {
        use PageState::*;
        matches!(
            self,
            Resident
                | Evicting
                | SampleDrop
                | SampleDropping
                | Sampled
                | ProbeDrop
                | ProbeDropping
                | Probation
                | Expiring
        )
    }

    /// Whether the page is counted in the slow tier (stored, confirmed, or lost
    /// there): the manager's stored gauge.
    pub fn in_slow_tier(self) -> bool {
        use PageState::*;
        matches!(self, Dropping | Stored | Loading | Lost)
    }

    /// Whether the page is on probation (held locally, outside the sampler's frame).
    pub fn on_probation(self) -> bool {
        use PageState::*;
        matches!(self, ProbeDrop | ProbeDropping | Probation | Expiring)
    }

    /// Whether a write-protect fault on the page waits for the worker that protected
    /// it (it unprotects and wakes the thread); on any other page the protection is
    /// stale and is lifted at once.
    pub fn protected_by_worker(self) -> bool {
        use PageState::*;
        matches!(
            self,
            Evicting | Dropping | SampleDrop | SampleDropping | ProbeDrop | ProbeDropping | Freeing
        )
    }

    /// Whether the page is in a transient state (a move under way, or lost), for
    /// diagnosing a stuck region.
    pub fn is_transient(self) -> bool {
        use PageState::*;
        !matches!(self, Untouched | Resident | Stored | Sampled | Probation)
    }
}

impl PageEvent {
    /// Every event.
    pub const ALL: [PageEvent; 20] = [
        PageEvent::Adopt,
        PageEvent::RecoverStash,
        PageEvent::RecoverStored,
        PageEvent::ZeroFill,
        PageEvent::LoadBegin,
        PageEvent::LoadAborted,
        PageEvent::LoadDone,
        PageEvent::LoadLost,
        PageEvent::MapCopy,
        PageEvent::Evict,
        PageEvent::StoreConfirmed,
        PageEvent::Sample,
        PageEvent::Probe,
        PageEvent::Copied,
        PageEvent::Dropped,
        PageEvent::MoveFailed,
        PageEvent::Free,
        PageEvent::HoldForDrop,
        PageEvent::CopyGone,
        PageEvent::Restore,
    ];
}

/// The state a page in `from` goes to on `event`.
///
/// # Errors
/// [`IllegalTransition`] if the table lists no such move.
pub fn transition(from: PageState, event: PageEvent) -> Result<PageState, IllegalTransition> {
    use PageEvent as E;
    use PageState::*;
    let to = match (event, from) {
        (E::Adopt | E::ZeroFill, Untouched) => Resident,
        (E::RecoverStash, Untouched) => Probation,
        (E::RecoverStored, Untouched) => Stored,
        (E::LoadBegin, Stored) => Loading,
        (E::LoadAborted, Loading) => Stored,
        (E::LoadDone, Loading) => Resident,
        (E::LoadLost, Loading) => Lost,
        (E::MapCopy, Sampled | Probation) => Resident,
        (E::Evict, Resident) => Evicting,
        (E::Evict, Sampled | Probation) => Expiring,
        (E::StoreConfirmed, Evicting) => Dropping,
        (E::StoreConfirmed, Expiring) => Stored,
        (E::Sample, Resident) => SampleDrop,
        (E::Probe, Resident) => ProbeDrop,
        (E::Copied, SampleDrop) => SampleDropping,
        (E::Copied, ProbeDrop) => ProbeDropping,
        (E::Dropped, Dropping) => Stored,
        (E::Dropped, SampleDropping) => Sampled,
        (E::Dropped, ProbeDropping) => Probation,
        (
            E::MoveFailed,
            Evicting | Dropping | SampleDrop | SampleDropping | ProbeDrop | ProbeDropping,
        ) => Resident,
        (E::MoveFailed, Expiring) => Probation,
        // A page a worker is moving keeps faults waiting until the worker has
        // dropped the copy it made: a page faulted in and written meanwhile would
        // otherwise be punched by its drop, or its new copy dropped.
        (
            E::Free,
            Evicting | Dropping | SampleDrop | SampleDropping | ProbeDrop | ProbeDropping
            | Expiring | Loading,
        ) => Freeing,
        (E::Free, Resident | Stored | Sampled | Probation) => Untouched,
        (E::HoldForDrop, Untouched) => Freeing,
        (E::CopyGone, Freeing) => Untouched,
        (E::Restore, Stored | Sampled | Probation) => Resident,
        _ => return Err(IllegalTransition { from, event }),
    };
    Ok(to)
}

#[cfg(test)]
mod tests {
    use super::PageEvent as E;
    use super::PageState::*;
    use super::*;

    /// Every legal move, written out once more by hand: the test of the table.
    const LEGAL: &[(PageState, PageEvent, PageState)] = &[
        (Untouched, E::Adopt, Resident),
        (Untouched, E::ZeroFill, Resident),
        (Untouched, E::RecoverStash, Probation),
        (Untouched, E::RecoverStored, Stored),
        (Untouched, E::HoldForDrop, Freeing),
        (Stored, E::LoadBegin, Loading),
        (Stored, E::Restore, Resident),
        (Loading, E::LoadAborted, Stored),
        (Loading, E::LoadDone, Resident),
        (Loading, E::LoadLost, Lost),
        (Loading, E::Free, Freeing),
        (Sampled, E::MapCopy, Resident),
        (Sampled, E::Evict, Expiring),
        (Sampled, E::Free, Untouched),
        (Sampled, E::Restore, Resident),
        (Probation, E::MapCopy, Resident),
        (Probation, E::Evict, Expiring),
        (Probation, E::Free, Untouched),
        (Probation, E::Restore, Resident),
        (Resident, E::Evict, Evicting),
        (Resident, E::Sample, SampleDrop),
        (Resident, E::Probe, ProbeDrop),
        (Resident, E::Free, Untouched),
        (Stored, E::Free, Untouched),
        (Evicting, E::StoreConfirmed, Dropping),
        (Evicting, E::MoveFailed, Resident),
        (Evicting, E::Free, Freeing),
        (Dropping, E::Dropped, Stored),
        (Dropping, E::MoveFailed, Resident),
        (Dropping, E::Free, Freeing),
        (Expiring, E::StoreConfirmed, Stored),
        (Expiring, E::MoveFailed, Probation),
        (Expiring, E::Free, Freeing),
        (SampleDrop, E::Copied, SampleDropping),
        (SampleDrop, E::MoveFailed, Resident),
        (SampleDrop, E::Free, Freeing),
        (SampleDropping, E::Dropped, Sampled),
        (SampleDropping, E::MoveFailed, Resident),
        (SampleDropping, E::Free, Freeing),
        (ProbeDrop, E::Copied, ProbeDropping),
        (ProbeDrop, E::MoveFailed, Resident),
        (ProbeDrop, E::Free, Freeing),
        (ProbeDropping, E::Dropped, Probation),
        (ProbeDropping, E::MoveFailed, Resident),
        (ProbeDropping, E::Free, Freeing),
        (Freeing, E::CopyGone, Untouched),
    ];

    #[test]
    fn every_pair_of_state_and_event_is_legal_exactly_as_listed() {
        let mut legal = 0;
        for from in PageState::ALL {
            for event in PageEvent::ALL {
                let listed = LEGAL
                    .iter()
                    .find(|&&(f, e, _)| f == from && e == event)
                    .map(|&(_, _, to)| to);
                match (transition(from, event), listed) {
                    (Ok(to), Some(want)) => {
                        assert_eq!(to, want, "{event:?} on {from:?}");
                        legal += 1;
                    }
                    (Err(e), None) => {
                        assert_eq!(e, IllegalTransition { from, event });
                        assert!(e.to_string().contains(&format!("{event:?}")));
                    }
                    (got, want) => panic!("{event:?} on {from:?}: {got:?}, listed {want:?}"),
                }
            }
        }
        assert_eq!(legal, LEGAL.len(), "a move is listed twice");
    }

    #[test]
    fn the_lists_of_states_and_events_are_complete_and_distinct() {
        let states: std::collections::HashSet<_> = PageState::ALL.into_iter().collect();
        let events: std::collections::HashSet<_> = PageEvent::ALL.into_iter().collect();
        assert_eq!(states.len(), PageState::ALL.len());
        assert_eq!(events.len(), PageEvent::ALL.len());
        // (A state or event added without its entry fails to compile here.)
        for s in PageState::ALL {
            match s {
                Untouched | Resident | Evicting | Dropping | Stored | Loading | SampleDrop
                | SampleDropping | Sampled | ProbeDrop | ProbeDropping | Probation | Expiring
                | Freeing | Lost => {}
            }
        }
        for e in PageEvent::ALL {
            match e {
                E::Adopt
                | E::RecoverStash
                | E::RecoverStored
                | E::ZeroFill
                | E::LoadBegin
                | E::LoadAborted
                | E::LoadDone
                | E::LoadLost
                | E::MapCopy
                | E::Evict
                | E::StoreConfirmed
                | E::Sample
                | E::Probe
                | E::Copied
                | E::Dropped
                | E::MoveFailed
                | E::Free
                | E::HoldForDrop
                | E::CopyGone
                | E::Restore => {}
            }
        }
    }

    #[test]
    fn lost_and_freeing_pages_move_only_as_listed() {
        // A lost page never comes back: the process must be stopped.
        for event in PageEvent::ALL {
            assert!(transition(Lost, event).is_err(), "{event:?}");
        }
        // A page freed mid-move becomes untouched only when its mover is done.
        for event in PageEvent::ALL {
            assert_eq!(transition(Freeing, event).is_ok(), event == E::CopyGone);
        }
    }

    #[test]
    fn a_free_waits_for_the_mover_exactly_when_a_worker_holds_the_page() {
        for from in PageState::ALL {
            if let Ok(to) = transition(from, E::Free) {
                let moving = from.protected_by_worker() || matches!(from, Expiring | Loading);
                assert_eq!(to == Freeing, moving, "{from:?}");
            }
        }
    }

    #[test]
    fn gauges_are_disjoint_where_they_must_be() {
        for s in PageState::ALL {
            assert!(!(s.held_locally() && s.in_slow_tier()), "{s:?}");
            if s.on_probation() {
                assert!(s.held_locally(), "{s:?}");
            }
        }
    }
}
