//! Fault injection into the expert-I/O threads, for the reliability tests.
//!
//! A [`FaultPlan`] travels in [`FetchHooks`](super::FetchHooks) (so it is only ever set through
//! that explicit test API; the default is `None`, and the only cost when off is one `Option`
//! comparison per expert read or prefetch command). Each plan fires once: at the read with the
//! given 0-based submission number of one fetcher (reads are numbered in submission order, which
//! is deterministic for a given model and prompt), or at the prefetch command with that number.

use std::any::Any;

/// What goes wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultKind {
    /// The read fails with `EIO`, as a failing disk reports it.
    Eio,
    /// The file ends early: the read gets fewer bytes than asked for (at most half of them)
    /// and then end-of-file.
    ShortRead,
    /// The reader thread panics while serving the read.
    ReaderPanic,
    /// The thread that waits for the read (the engine thread) panics in `wait`: stands for a
    /// bug anywhere in the engine.
    WaiterPanic,
    /// The prefetch thread panics while walking the command.
    PrefetchPanic,
}

/// One fault at one numbered operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FaultPlan {
    pub kind: FaultKind,
    /// 0-based number of the expert read (or, for `PrefetchPanic`, of the prefetch command).
    pub at: u64,
}

impl FaultPlan {
    /// The fault of expert read number `n`, if this plan targets it.
    pub fn for_read(plan: Option<FaultPlan>, n: u64) -> Option<FaultKind> {
        plan.filter(|p| p.at == n && p.kind != FaultKind::PrefetchPanic)
            .map(|p| p.kind)
    }
}

/// The message of a caught panic payload (`panic!` with a literal or a formatted string).
pub fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_targets_one_read_and_messages_are_recovered() {
        let p = Some(FaultPlan {
            kind: FaultKind::Eio,
            at: 3,
        });
        assert_eq!(FaultPlan::for_read(p, 2), None);
        assert_eq!(FaultPlan::for_read(p, 3), Some(FaultKind::Eio));
        let pf = Some(FaultPlan {
            kind: FaultKind::PrefetchPanic,
            at: 3,
        });
        assert_eq!(FaultPlan::for_read(pf, 3), None);
        let a = std::panic::catch_unwind(|| panic!("plain")).unwrap_err();
        assert_eq!(panic_message(&*a), "plain");
        let n = 7;
        let b = std::panic::catch_unwind(|| panic!("formatted {n}")).unwrap_err();
        assert_eq!(panic_message(&*b), "formatted 7");
    }
}
