//! The real default model (SmolLM2-135M-Instruct Q4_1, fetched once) and
//! its tokenizer, shared by this crate's real-model tests.

use std::sync::{Arc, OnceLock};

use cipherlora_model::{Model, Tokenizer, fetch};

/// The default model and its tokenizer, loaded once per test binary.
pub fn model() -> &'static (Arc<Model>, Tokenizer) {
    static M: OnceLock<(Arc<Model>, Tokenizer)> = OnceLock::new();
    M.get_or_init(|| {
        let path = fetch::ensure_default_model().expect("default model");
        (
            Arc::new(Model::load(&path).expect("load")),
            Tokenizer::for_model(&path).expect("tokenizer"),
        )
    })
}
