//! A bounded queue of requests per model (429 beyond it), so a burst cannot
//! pile up behind a slow private generation.

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::ApiError;

/// Requests waiting or running for one model.
#[derive(Debug)]
pub struct Queue {
    model: String,
    max: usize,
    count: AtomicUsize,
}

/// A place in a [`Queue`]; dropping it frees the place.
#[derive(Debug)]
pub struct Ticket<'a> {
    queue: &'a Queue,
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        self.queue.count.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Queue {
    /// A queue for `model` holding at most `max` requests.
    pub fn new(model: impl Into<String>, max: usize) -> Self {
        Self {
            model: model.into(),
            max,
            count: AtomicUsize::new(0),
        }
    }

    /// Whether no request waits or runs.
    pub fn is_idle(&self) -> bool {
        self.count.load(Ordering::SeqCst) == 0
    }

    /// Takes a place.
    /// Errors: [`ApiError::QueueFull`] when `max` requests already wait or run.
    pub fn enter(&self) -> Result<Ticket<'_>, ApiError> {
        let before = self.count.fetch_add(1, Ordering::SeqCst);
        let ticket = Ticket { queue: self };
        if before >= self.max {
            return Err(ApiError::QueueFull {
                model: self.model.clone(),
                queued: before,
            });
        }
        Ok(ticket)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_queue_refuses_past_its_limit_and_frees_places_on_drop() {
        let q = Queue::new("m", 2);
        let a = q.enter().unwrap();
        let b = q.enter().unwrap();
        assert!(matches!(
            q.enter(),
            Err(ApiError::QueueFull { queued: 2, .. })
        ));
        drop(a);
        let c = q.enter().unwrap();
        assert!(q.enter().is_err());
        drop((b, c));
        assert!(q.enter().is_ok());
    }
}
