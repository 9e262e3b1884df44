//! A small pool of `u64` buffers for public temporaries and ciphertexts (64 KiB–1 MiB, above
//! glibc's mmap threshold, so reuse avoids page faults, as SEAL's pools do). Secret-key and
//! plaintext buffers never go through it.

use std::sync::Mutex;

/// At most this many idle buffers are kept (a batch of 16 extended baby-step rotations alone holds
/// 32 buffers plus temporaries).
const MAX_IDLE: usize = 96;

/// Reusable buffers, shared through the [`crate::Context`].
#[derive(Debug, Default)]
pub(crate) struct BufferPool {
    idle: Mutex<Vec<Vec<u64>>>,
}

impl BufferPool {
    /// A buffer of `len` words with unspecified (stale, public) contents.
    pub(crate) fn take(&self, len: usize) -> Vec<u64> {
        let found = {
            let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
            // Best fit: the smallest idle buffer that is large enough, so small requests do not use
            // up the large buffers (which would then be allocated afresh, page faults included).
            idle.iter()
                .enumerate()
                .filter(|(_, b)| b.capacity() >= len)
                .min_by_key(|(_, b)| b.capacity())
                .map(|(i, _)| i)
                .map(|i| idle.swap_remove(i))
        };
        match found {
            Some(mut v) => {
                v.resize(len, 0);
                v
            }
            None => vec![0; len],
        }
    }

    /// A zero-filled buffer of `len` words.
    pub(crate) fn take_zeroed(&self, len: usize) -> Vec<u64> {
        let mut v = self.take(len);
        v.fill(0);
        v
    }

    /// A copy of `src` in a pooled buffer.
    pub(crate) fn copy_of(&self, src: &[u64]) -> Vec<u64> {
        let mut v = self.take(src.len());
        v.copy_from_slice(src);
        v
    }

    /// Returns a buffer for reuse.
    pub(crate) fn give(&self, v: Vec<u64>) {
        if v.capacity() < 1024 {
            return;
        }
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < MAX_IDLE {
            idle.push(v);
        }
    }
}
