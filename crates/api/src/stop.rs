//! Stop sequences over streamed text: text is released as soon as it cannot
//! start a stop sequence, so a stream never shows one or part of one.

/// Finds the first stop sequence in a stream of text pieces.
#[derive(Debug, Clone)]
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
    stopped: bool,
}

impl StopMatcher {
    /// A matcher for `stops` (empty strings are ignored).
    pub fn new(stops: Vec<String>) -> Self {
        Self {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            held: String::new(),
            stopped: false,
        }
    }

    /// Whether a stop sequence has been seen.
    pub fn stopped(&self) -> bool {
        self.stopped
    }

    /// Adds `piece`; returns the text releasable now (none after a stop).
    pub fn push(&mut self, piece: &str) -> String {
        if self.stopped {
            return String::new();
        }
        self.held.push_str(piece);
        let first = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()))
            .min();
        if let Some(at) = first {
            self.stopped = true;
            let out = self.held[..at].to_string();
            self.held.clear();
            return out;
        }
        // Hold back the longest tail that some stop sequence starts with.
        let keep = self
            .held
            .char_indices()
            .map(|(i, _)| i)
            .find(|&i| {
                let tail = &self.held[i..];
                self.stops.iter().any(|s| s.starts_with(tail))
            })
            .unwrap_or(self.held.len());
        let out = self.held[..keep].to_string();
        self.held.drain(..keep);
        out
    }

    /// The held-back text at the end of the stream.
    pub fn finish(&mut self) -> String {
        if self.stopped {
            return String::new();
        }
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = String::new();
        for p in pieces {
            out.push_str(&m.push(p));
        }
        out.push_str(&m.finish());
        (out, m.stopped())
    }

    #[test]
    fn a_stop_sequence_split_across_pieces_is_found_and_cut() {
        assert_eq!(
            run(&["\n\n"], &["Hello", " world\n", "\nmore"]),
            ("Hello world".into(), true)
        );
    }

    #[test]
    fn a_partial_match_that_does_not_complete_is_released() {
        assert_eq!(run(&["END"], &["the E", "ND", "x"]), ("the ".into(), true));
        assert_eq!(run(&["END"], &["the E", "nd"]), ("the End".into(), false));
    }

    #[test]
    fn the_earliest_of_several_stop_sequences_wins() {
        assert_eq!(run(&["b", "a"], &["xxab"]), ("xx".into(), true));
    }

    proptest! {
        /// Whatever the piece boundaries, the output is the text before the first stop.
        #[test]
        fn output_is_the_prefix_before_the_first_stop(
            text in "[ab\\n]{0,40}",
            cuts in proptest::collection::vec(0usize..40, 0..6),
            stop in "[ab\\n]{1,3}",
        ) {
            let mut bounds: Vec<usize> = cuts.into_iter().map(|c| c.min(text.len())).collect();
            bounds.push(0);
            bounds.push(text.len());
            bounds.sort_unstable();
            let pieces: Vec<&str> = bounds.windows(2).map(|w| &text[w[0]..w[1]]).collect();
            let want = match text.find(&stop) {
                Some(i) => (text[..i].to_string(), true),
                None => (text.clone(), false),
            };
            prop_assert_eq!(run(&[stop.as_str()], &pieces), want);
        }
    }
}
