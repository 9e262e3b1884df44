//! Which cached rows a stalled round settles, nearest first.
//!
//! A stall means the cached rows' inherited residual blocks the round's first
//! row (docs/design/schedules.md, "The inherited residual"). Settling reruns
//! rows in ordinary verify rounds, so its cost grows with the rows it covers.
//! A generation that reuses a conversation's rows has its own answer rows
//! after the reused ones; the ladder settles those first, then every row
//! since the last settling, then (once, when the prompt was not prefilled
//! group by group) the prompt's. Each step runs only when the one before
//! left the row blocked.

/// What has been settled, and the ladder of a round's settlings.
#[derive(Debug, Clone)]
pub(super) struct Settling {
    /// Rows below this have been settled (or carry no residual of their own).
    pub(super) settled: usize,
    /// Whether the prompt's rows carry no residual (prefilled group by group, or settled).
    pub(super) prompt_settled: bool,
    /// This generation's rows from here on have not been settled by a nearest-first step.
    answer_settled: usize,
    /// The current round's settling starts, nearest first.
    ladder: Vec<usize>,
}

impl Settling {
    /// `settled` and `prompt_settled` as the caches start; this generation decodes from row
    /// `answer_from` on.
    pub(super) fn new(settled: usize, prompt_settled: bool, answer_from: usize) -> Self {
        Settling {
            settled,
            prompt_settled,
            answer_settled: answer_from,
            ladder: Vec::new(),
        }
    }

    /// A fresh round over `before` cached rows: its ladder of settling starts.
    pub(super) fn new_round(&mut self, before: usize) {
        self.ladder.clear();
        let nearest = self.answer_settled.max(self.settled);
        if nearest > self.settled && nearest < before {
            self.ladder.push(nearest);
        }
        self.ladder.push(self.settled);
        if !self.prompt_settled && self.settled > 0 {
            self.ladder.push(0);
        }
    }

    /// The start of the round's settling number `step` (0-based), if the ladder has one.
    pub(super) fn start(&self, step: usize) -> Option<usize> {
        self.ladder.get(step).copied()
    }

    /// Rows `from..before` were settled.
    pub(super) fn done(&mut self, from: usize, before: usize) {
        if from <= self.settled {
            self.settled = before;
        }
        if from == 0 {
            self.prompt_settled = true;
        }
        self.answer_settled = self.answer_settled.max(before);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fresh caches: the rows since the last settling, then nothing.
    #[test]
    fn a_fresh_generation_settles_since_the_last_settling_once() {
        let mut s = Settling::new(40, true, 40);
        s.new_round(60);
        assert_eq!((s.start(0), s.start(1)), (Some(40), None));
        s.done(40, 60);
        s.new_round(70);
        assert_eq!((s.start(0), s.start(1)), (Some(60), None));
    }

    /// Reused rows: this generation's answer first, then everything since the last settling.
    #[test]
    fn a_reused_conversation_settles_its_own_answer_first() {
        let mut s = Settling::new(40, true, 400);
        s.new_round(430);
        assert_eq!(
            (s.start(0), s.start(1), s.start(2)),
            (Some(400), Some(40), None)
        );
        s.done(400, 430);
        assert_eq!(
            s.settled, 40,
            "the rows before the answer are not settled yet"
        );
        // The next stall starts past the settled answer rows.
        s.new_round(450);
        assert_eq!((s.start(0), s.start(1)), (Some(430), Some(40)));
        s.done(430, 450);
        s.done(40, 450);
        assert_eq!(s.settled, 450);
        s.new_round(460);
        assert_eq!((s.start(0), s.start(1)), (Some(450), None));
    }

    /// A stall in the answer's first round has no answer rows to settle.
    #[test]
    fn no_nearest_step_without_answer_rows() {
        let mut s = Settling::new(40, true, 400);
        s.new_round(400);
        assert_eq!((s.start(0), s.start(1)), (Some(40), None));
    }

    /// A prompt passed through the fixed point is settled once, last.
    #[test]
    fn an_unsettled_prompt_comes_last_and_once() {
        let mut s = Settling::new(30, false, 30);
        s.new_round(50);
        assert_eq!(
            (s.start(0), s.start(1), s.start(2)),
            (Some(30), Some(0), None)
        );
        s.done(30, 50);
        s.done(0, 50);
        assert!(s.prompt_settled);
        s.new_round(60);
        assert_eq!((s.start(0), s.start(1)), (Some(50), None));
    }
}
