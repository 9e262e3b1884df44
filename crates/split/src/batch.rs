//! What one split pass carries after the pending tokens: the drafted nodes
//! as a token tree, with lookahead's rows.

use cipherlora_speculative::tree::DraftTree;

/// What one pass carries after the pending tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Batch {
    /// Every node (verification first, then lookahead); a `None` parent is the pending token I.
    pub(crate) tree: DraftTree,
    /// The first `verify` nodes are the verification tree (their parents are among them).
    pub(crate) verify: usize,
    /// Rows whose argmax is the next Jacobi level (row 0: I, row r: node r − 1).
    pub(crate) level_rows: Vec<usize>,
}

impl Batch {
    /// The verification tree alone.
    pub(crate) fn verify_tree(&self) -> DraftTree {
        DraftTree {
            tokens: self.tree.tokens[..self.verify].to_vec(),
            parents: self.tree.parents[..self.verify].to_vec(),
        }
    }
}
