//! The client's book of group requests on a `Rounds` stream: unanswered requests (kept for replay,
//! in send order) and answers that arrived before they were asked for (streamed rounds overlap and
//! answers come in any order).

use std::collections::HashMap;

use bytes::Bytes;

use crate::error::{Result, ServiceError};
use crate::group_call::GroupCall;

/// Identifies one group request: (round, layer, group).
pub(crate) type CallKey = (u64, u32, u32);

/// An answer received: the delta ciphertexts and the server's compute time.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Answer {
    /// The delta ciphertexts.
    pub ciphertexts: Vec<Bytes>,
    /// Server compute time, microseconds.
    pub server_micros: u64,
}

/// Requests sent and not yet answered, and answers not yet taken.
#[derive(Debug, Default)]
pub(crate) struct InFlight {
    /// Unanswered requests in the order they were sent.
    unanswered: Vec<(u64, GroupCall)>,
    /// Answers that arrived before the caller asked for them.
    arrived: HashMap<CallKey, Answer>,
}

impl InFlight {
    /// Books `call` of `round` as sent. Errors: [`ServiceError::Config`] when it is already in
    /// flight or answered and not taken.
    pub fn send(&mut self, round: u64, call: GroupCall) -> Result<()> {
        let key = (round, call.layer, call.group);
        if self.arrived.contains_key(&key)
            || self.unanswered.iter().any(|(r, c)| key_of(*r, c) == key)
        {
            return Err(ServiceError::Config {
                reason: format!(
                    "(layer {}, group {}) twice in round {round}",
                    call.layer, call.group
                ),
            });
        }
        self.unanswered.push((round, call));
        Ok(())
    }

    /// Files an answer from the server. Errors: [`ServiceError::Protocol`] for an answer to nothing
    /// or a second answer.
    pub fn answer(&mut self, key: CallKey, answer: Answer) -> Result<()> {
        let Some(i) = self
            .unanswered
            .iter()
            .position(|(r, c)| key_of(*r, c) == key)
        else {
            return Err(ServiceError::Protocol {
                what: format!(
                    "unexpected response for round {} layer {} group {}",
                    key.0, key.1, key.2
                ),
            });
        };
        self.unanswered.remove(i);
        self.arrived.insert(key, answer);
        Ok(())
    }

    /// Takes the answer to `key`, if it arrived.
    pub fn take(&mut self, key: CallKey) -> Option<Answer> {
        self.arrived.remove(&key)
    }

    /// Whether `key` was sent and is still unanswered.
    pub fn is_unanswered(&self, key: CallKey) -> bool {
        self.unanswered.iter().any(|(r, c)| key_of(*r, c) == key)
    }

    /// Unanswered requests, in the order they were first sent (to replay).
    pub fn unanswered(&self) -> impl Iterator<Item = (u64, &GroupCall)> {
        self.unanswered.iter().map(|(r, c)| (*r, c))
    }

    /// How many requests are unanswered.
    pub fn pending(&self) -> usize {
        self.unanswered.len()
    }

    /// Forgets everything (the session is gone for good).
    pub fn clear(&mut self) {
        self.unanswered.clear();
        self.arrived.clear();
    }
}

fn key_of(round: u64, c: &GroupCall) -> CallKey {
    (round, c.layer, c.group)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(layer: u32, group: u32) -> GroupCall {
        GroupCall {
            layer,
            group,
            ciphertexts: vec![Bytes::from_static(b"ct")],
            response_bits: 0,
        }
    }

    fn answer(tag: &'static [u8]) -> Answer {
        Answer {
            ciphertexts: vec![Bytes::from_static(tag)],
            server_micros: 7,
        }
    }

    #[test]
    fn answers_out_of_order_are_kept_until_taken() {
        let mut f = InFlight::default();
        f.send(1, call(0, 0)).unwrap();
        f.send(1, call(1, 0)).unwrap();
        f.send(2, call(0, 0)).unwrap();
        f.answer((2, 0, 0), answer(b"c")).unwrap();
        f.answer((1, 1, 0), answer(b"b")).unwrap();
        assert_eq!(f.pending(), 1);
        assert!(f.is_unanswered((1, 0, 0)));
        assert_eq!(f.take((1, 1, 0)), Some(answer(b"b")));
        assert_eq!(f.take((1, 1, 0)), None);
        assert_eq!(f.take((2, 0, 0)), Some(answer(b"c")));
        let replay: Vec<_> = f.unanswered().map(|(r, c)| (r, c.layer)).collect();
        assert_eq!(replay, [(1, 0)]);
    }

    #[test]
    fn a_request_twice_and_an_answer_to_nothing_are_refused() {
        let mut f = InFlight::default();
        f.send(1, call(3, 1)).unwrap();
        assert!(matches!(
            f.send(1, call(3, 1)),
            Err(ServiceError::Config { .. })
        ));
        // Another round may ask for the same group.
        f.send(2, call(3, 1)).unwrap();
        f.answer((1, 3, 1), answer(b"x")).unwrap();
        // Answered but not taken: still refused.
        assert!(f.send(1, call(3, 1)).is_err());
        assert!(matches!(
            f.answer((1, 3, 1), answer(b"x")),
            Err(ServiceError::Protocol { .. })
        ));
        assert!(matches!(
            f.answer((9, 0, 0), answer(b"x")),
            Err(ServiceError::Protocol { .. })
        ));
    }
}
