//! The held-out prompts the examples decode: prose for the general adapters, HumanEval for the
//! code ones (`adapters/eval/`).

use std::path::Path;

/// The `"prompt"` of every line of `adapter`'s evaluation file under `root`. Errors: an
/// unreadable file, a line that is not JSON or has no prompt.
pub fn prompts(root: &Path, adapter: &str) -> Result<Vec<String>, Box<dyn std::error::Error>> {
    let file = if adapter.starts_with("general") {
        "adapters/eval/general_prompts.jsonl"
    } else {
        "adapters/eval/humaneval_0_19.jsonl"
    };
    let text = std::fs::read_to_string(root.join(file))?;
    let mut out = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let v: serde_json::Value = serde_json::from_str(line)?;
        out.push(
            v["prompt"]
                .as_str()
                .ok_or("a line without a prompt")?
                .to_string(),
        );
    }
    Ok(out)
}
