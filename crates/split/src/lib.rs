//! Split inference: the client keeps the embedding, the first `a` and last `b` decoder layers and
//! the head; an untrusted server runs layers `[a, L − b)` on the client's hidden states, which
//! travel in plaintext (privacy is empirical; HE-LoRA is the mode with cryptographic privacy). This
//! crate owns the server backend ([`backend`]), where the middle runs ([`middle`]), drafters
//! ([`draft`], [`lookahead`]), the replaying client ([`replay`]) and the decoding loop
//! ([`decode`]). Start at [`decode::generate`].

mod accept;
pub mod backend;
mod batch;
pub mod decode;
pub mod draft;
mod error;
pub mod lookahead;
pub mod middle;
pub mod replay;

pub use backend::ModelBackend;
pub use decode::{SplitConfig, SplitOutput, SplitStep, generate};
pub use draft::DraftMethod;
pub use error::SplitError;
pub use lookahead::Lookahead;
pub use middle::{Forwarded, LocalMiddle, MiddleLayers, MiddlePass};
pub use replay::ReplayingClient;
