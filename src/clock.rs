//! The meter's clock: the system's in production, one a test sets by hand.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use rush_meter_core::time::Secs;

#[derive(Clone, Debug, Default)]
pub enum Clock {
    #[default]
    System,
    Manual(Arc<AtomicI64>),
}

impl Clock {
    pub fn manual(start: Secs) -> Clock {
        Clock::Manual(Arc::new(AtomicI64::new(start)))
    }

    /// Whole Unix seconds: every stored time is whole seconds (DESIGN.md rule 7).
    pub fn now(&self) -> Secs {
        match self {
            Clock::System => chrono::Utc::now().timestamp(),
            Clock::Manual(t) => t.load(Ordering::SeqCst),
        }
    }

    /// Move a manual clock; the system clock cannot be moved.
    pub fn set(&self, t: Secs) {
        match self {
            Clock::System => panic!("the system clock cannot be set"),
            Clock::Manual(c) => c.store(t, Ordering::SeqCst),
        }
    }

    pub fn advance(&self, secs: Secs) {
        self.set(self.now() + secs);
    }
}
