//! Chat prompts: a model's own Jinja chat template (`tokenizer.chat_template` or
//! `tokenizer_config.json`), rendered with minijinja as transformers' `apply_chat_template` does,
//! so conversations get the prompt the model was trained on.

use minijinja::{Environment, ErrorKind, context};
use serde::{Deserialize, Serialize};

use crate::ModelError;

/// One turn of a conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user` or `assistant` (templates may accept others).
    pub role: String,
    /// The turn's text.
    pub content: String,
}

impl ChatMessage {
    /// A turn of `role` with `content`.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// A model's chat template (Jinja source).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatTemplate {
    source: String,
}

fn template_error(e: impl std::fmt::Display) -> ModelError {
    ModelError::ChatTemplate {
        reason: e.to_string(),
    }
}

impl ChatTemplate {
    /// Checks that `jinja` compiles and keeps it. Errors: [`ModelError::ChatTemplate`].
    pub fn new(jinja: impl Into<String>) -> Result<Self, ModelError> {
        let source = jinja.into();
        environment()
            .template_from_str(&source)
            .map_err(template_error)?;
        Ok(Self { source })
    }

    /// The Jinja source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Whether turns are delimited ChatML-style (`<|im_start|>` … `<|im_end|>`), so that
    /// `<|im_end|>` also ends generation.
    pub fn is_chatml(&self) -> bool {
        self.source.contains("<|im_start|>")
    }

    /// The prompt for `messages` (assistant header when `add_generation_prompt`); `bos`/`eos` are
    /// the special tokens' strings. Errors: [`ModelError::ChatTemplate`] when rendering fails or
    /// the template raises.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        bos: &str,
        eos: &str,
    ) -> Result<String, ModelError> {
        let env = environment();
        let template = env
            .template_from_str(&self.source)
            .map_err(template_error)?;
        template
            .render(context! {
                messages => messages,
                add_generation_prompt => add_generation_prompt,
                bos_token => bos,
                eos_token => eos,
            })
            .map_err(template_error)
    }
}

/// A minijinja environment configured as transformers configures Jinja2.
fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function(
        "raise_exception",
        |msg: String| -> Result<String, minijinja::Error> {
            Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
        },
    );
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SmolLM2-Instruct's template, as its tokenizer_config.json has it.
    const SMOLLM2: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    #[test]
    fn smollm2_template_inserts_its_default_system_prompt() {
        let t = ChatTemplate::new(SMOLLM2).unwrap();
        assert!(t.is_chatml());
        let got = t
            .render(&[ChatMessage::new("user", "Hi")], true, "", "")
            .unwrap();
        // Known vector: transformers' apply_chat_template output.
        assert_eq!(
            got,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn multi_turn_keeps_every_turn_in_order_and_an_explicit_system_prompt() {
        let t = ChatTemplate::new(SMOLLM2).unwrap();
        let msgs = [
            ChatMessage::new("system", "Be brief."),
            ChatMessage::new("user", "Hi"),
            ChatMessage::new("assistant", "Hello!"),
            ChatMessage::new("user", "Bye"),
        ];
        let got = t.render(&msgs, false, "", "").unwrap();
        assert_eq!(
            got,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"
        );
    }

    #[test]
    fn raise_exception_in_a_template_is_a_typed_error() {
        let t = ChatTemplate::new(
            "{% if messages[0]['role'] == 'assistant' %}{{ raise_exception('must start with user') }}{% endif %}{{ bos_token }}",
        )
        .unwrap();
        let err = t
            .render(&[ChatMessage::new("assistant", "x")], true, "<s>", "</s>")
            .unwrap_err();
        assert!(
            matches!(err, ModelError::ChatTemplate { ref reason } if reason.contains("must start with user"))
        );
        assert_eq!(
            t.render(&[ChatMessage::new("user", "x")], true, "<s>", "</s>")
                .unwrap(),
            "<s>"
        );
    }

    #[test]
    fn python_string_methods_work_as_in_transformers() {
        // Llama-3-style templates call .strip() on content.
        let t = ChatTemplate::new(
            "{% for m in messages %}[{{ m['content'] | trim }}|{{ m['content'].strip() }}]{% endfor %}",
        )
        .unwrap();
        assert_eq!(
            t.render(&[ChatMessage::new("user", "  a b ")], false, "", "")
                .unwrap(),
            "[a b|a b]"
        );
    }

    #[test]
    fn a_template_that_does_not_compile_is_refused() {
        assert!(matches!(
            ChatTemplate::new("{% for m in messages %}"),
            Err(ModelError::ChatTemplate { .. })
        ));
    }
}
