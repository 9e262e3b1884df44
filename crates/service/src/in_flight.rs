//! The client's book of group requests on a `Rounds` stream: unanswered requests (kept for replay,
//! in send order) and answers that arrived before they were asked for (streamed rounds overlap and
//! answers come in any order).

use std::collections::HashMap;

use cipherlora_proto::v1::{GroupRequest, GroupResponse};

use crate::error::{Result, ServerFault, ServiceError};

/// Identifies one group request: (round, layer, group).
pub(crate) type CallKey = (u64, u32, u32);

/// Requests sent and not yet answered, and answers not yet taken.
#[derive(Debug, Default)]
pub(crate) struct InFlight {
    /// Unanswered requests in the order they were sent.
    unanswered: Vec<(u64, GroupRequest)>,
    /// Answers that arrived before the caller asked for them.
    arrived: HashMap<CallKey, GroupResponse>,
}

impl InFlight {
    /// Books `call` of `round` as sent. Errors: [`ServiceError::Config`] when it is already in
    /// flight or answered and not taken.
    pub fn send(&mut self, round: u64, call: GroupRequest) -> Result<()> {
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
    pub fn answer(&mut self, answer: GroupResponse) -> Result<()> {
        let key = (answer.round, answer.layer, answer.group);
        let Some(i) = self
            .unanswered
            .iter()
            .position(|(r, c)| key_of(*r, c) == key)
        else {
            return Err(ServiceError::Protocol {
                fault: ServerFault::UnexpectedResponse {
                    round: key.0,
                    layer: key.1,
                    group: key.2,
                },
            });
        };
        self.unanswered.remove(i);
        self.arrived.insert(key, answer);
        Ok(())
    }

    /// Takes the answer to `key`, if it arrived.
    pub fn take(&mut self, key: CallKey) -> Option<GroupResponse> {
        self.arrived.remove(&key)
    }

    /// Whether `key` was sent and is still unanswered.
    pub fn is_unanswered(&self, key: CallKey) -> bool {
        self.unanswered.iter().any(|(r, c)| key_of(*r, c) == key)
    }

    /// Unanswered requests, in the order they were first sent (to replay).
    pub fn unanswered(&self) -> impl Iterator<Item = (u64, &GroupRequest)> {
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

fn key_of(round: u64, c: &GroupRequest) -> CallKey {
    (round, c.layer, c.group)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn call(layer: u32, group: u32) -> GroupRequest {
        GroupRequest {
            layer,
            group,
            ciphertexts: vec![Bytes::from_static(b"ct")],
            ..GroupRequest::default()
        }
    }

    fn answer((round, layer, group): CallKey, tag: &'static [u8]) -> GroupResponse {
        GroupResponse {
            masked_values: Default::default(),
            round,
            layer,
            group,
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
        f.answer(answer((2, 0, 0), b"c")).unwrap();
        f.answer(answer((1, 1, 0), b"b")).unwrap();
        assert_eq!(f.pending(), 1);
        assert!(f.is_unanswered((1, 0, 0)));
        assert_eq!(f.take((1, 1, 0)), Some(answer((1, 1, 0), b"b")));
        assert_eq!(f.take((1, 1, 0)), None);
        assert_eq!(f.take((2, 0, 0)), Some(answer((2, 0, 0), b"c")));
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
        f.answer(answer((1, 3, 1), b"x")).unwrap();
        // Answered but not taken: still refused.
        assert!(f.send(1, call(3, 1)).is_err());
        assert!(matches!(
            f.answer(answer((1, 3, 1), b"x")),
            Err(ServiceError::Protocol {
                fault: ServerFault::UnexpectedResponse {
                    round: 1,
                    layer: 3,
                    group: 1
                }
            })
        ));
        assert!(matches!(
            f.answer(answer((9, 0, 0), b"x")),
            Err(ServiceError::Protocol {
                fault: ServerFault::UnexpectedResponse { round: 9, .. }
            })
        ));
    }
}
