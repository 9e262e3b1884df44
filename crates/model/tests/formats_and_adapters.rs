//! Tiny-fixture tests: GGUF vs HF layout, PEFT adapters vs merged weights, bad inputs.

mod common;

use candle_core::quantized::GgmlDType;
use cipherlora_model::{
    AttentionMask, DeltaHook, LoraAdapter, Model, ModelError, NoAdapter, PlainLora, Proj, RopeStyle,
};
use common::{LLAMA, QWEN2, Tiny, adapter, weights, write_gguf, write_hf};

const TOKENS: [u32; 7] = [3, 17, 42, 8, 8, 23, 49];

fn logits(m: &Model, hook: &mut dyn DeltaHook) -> Vec<Vec<f32>> {
    let mut c = m.new_cache(16).unwrap();
    m.forward(&TOKENS, &mut c, &AttentionMask::Causal, hook)
        .unwrap()
        .to_vec2()
        .unwrap()
}

fn max_rel_err(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    let (mut err, mut scale) = (0f32, 0f32);
    for (ra, rb) in a.iter().zip(b) {
        for (x, y) in ra.iter().zip(rb) {
            err = err.max((x - y).abs());
            scale = scale.max(x.abs());
        }
    }
    err / scale
}

struct Fixture {
    _dir: tempfile::TempDir,
    hf: Model,
    gguf: Model,
    tiny: Tiny,
    root: std::path::PathBuf,
}

fn fixture(t: Tiny) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let w = weights(&t, 11);
    write_hf(&dir.path().join("hf"), &t, &w);
    write_gguf(&dir.path().join("m.gguf"), &t, &w, GgmlDType::F32);
    Fixture {
        hf: Model::load(&dir.path().join("hf")).unwrap(),
        gguf: Model::load(&dir.path().join("m.gguf")).unwrap(),
        tiny: t,
        root: dir.path().to_path_buf(),
        _dir: dir,
    }
}

#[test]
fn gguf_with_permuted_qk_equals_hf_layout_llama() {
    let f = fixture(LLAMA);
    assert_eq!(f.gguf.config().rope_style, RopeStyle::Interleaved);
    assert_eq!(f.hf.config().rope_style, RopeStyle::Half);
    let err = max_rel_err(
        &logits(&f.hf, &mut NoAdapter),
        &logits(&f.gguf, &mut NoAdapter),
    );
    assert!(err < 1e-5, "{err}");
}

#[test]
fn gguf_equals_hf_layout_qwen2_with_biases() {
    let f = fixture(QWEN2);
    assert_eq!(f.gguf.config().rope_style, RopeStyle::Half);
    let err = max_rel_err(
        &logits(&f.hf, &mut NoAdapter),
        &logits(&f.gguf, &mut NoAdapter),
    );
    assert!(err < 1e-5, "{err}");
}

/// The reference: the HF model with W + s·B·A merged into its weights.
fn merged_reference(f: &Fixture, a: &common::Adapter) -> Vec<Vec<f32>> {
    let dir = f.root.join("merged");
    let w = weights(&f.tiny, 11);
    write_hf(&dir, &f.tiny, &a.merge(&f.tiny, &w));
    logits(&Model::load(&dir).unwrap(), &mut NoAdapter)
}

const ALL: [&str; 7] = common::ALL_MODULES;

#[test]
fn plain_lora_matches_merged_weights_on_hf_model() {
    let f = fixture(LLAMA);
    let a = adapter(&f.tiny, 4, 8.0, false, &ALL, 5);
    a.write(&f.root.join("lora"));
    let lora = LoraAdapter::load(&f.root.join("lora"), f.hf.config()).unwrap();
    assert_eq!((lora.rank(), lora.alpha()), (4, 8.0));
    assert_eq!(lora.target_modules(), &Proj::ALL);
    let with = logits(&f.hf, &mut PlainLora::new(&lora));
    let reference = merged_reference(&f, &a);
    let err = max_rel_err(&reference, &with);
    assert!(err < 1e-4, "{err}");
    // The adapter changes the output.
    let base = logits(&f.hf, &mut NoAdapter);
    assert!(max_rel_err(&base, &with) > 1e-2);
}

/// Regression: lora_B rows of q/k must follow llama.cpp's GGUF row permutation,
/// or a PEFT adapter applied to a GGUF model computes a scrambled q/k delta.
#[test]
fn regression_lora_b_rows_permuted_for_gguf_qk() {
    let f = fixture(LLAMA);
    let a = adapter(&f.tiny, 8, 16.0, true, &["q_proj", "k_proj", "v_proj"], 9);
    a.write(&f.root.join("lora"));
    let lora = LoraAdapter::load(&f.root.join("lora"), f.gguf.config()).unwrap();
    let with = logits(&f.gguf, &mut PlainLora::new(&lora));
    let err = max_rel_err(&merged_reference(&f, &a), &with);
    assert!(err < 1e-4, "{err}");
    // Unpermuted (HF-layout) lora_B on the GGUF model does not match.
    let wrong = LoraAdapter::load(&f.root.join("lora"), f.hf.config()).unwrap();
    let bad = logits(&f.gguf, &mut PlainLora::new(&wrong));
    assert!(max_rel_err(&merged_reference(&f, &a), &bad) > 1e-3);
}

#[test]
fn plain_lora_on_qwen2_gguf_matches_merged_weights() {
    let f = fixture(QWEN2);
    let a = adapter(
        &f.tiny,
        2,
        4.0,
        false,
        &["q_proj", "k_proj", "o_proj", "down_proj"],
        3,
    );
    a.write(&f.root.join("lora"));
    let lora = LoraAdapter::load(&f.root.join("lora"), f.gguf.config()).unwrap();
    let with = logits(&f.gguf, &mut PlainLora::new(&lora));
    let err = max_rel_err(&merged_reference(&f, &a), &with);
    assert!(err < 1e-4, "{err}");
}

// ---- bad input ----

#[test]
fn truncated_gguf_names_file_and_tensor() {
    let f = fixture(LLAMA);
    let src = f.root.join("m.gguf");
    let bytes = std::fs::read(&src).unwrap();
    let cut = f.root.join("cut.gguf");
    std::fs::write(&cut, &bytes[..bytes.len() - 100]).unwrap();
    let err = Model::load(&cut).unwrap_err();
    match &err {
        ModelError::Truncated { path, tensor, .. } => {
            assert_eq!(path, &cut);
            assert!(!tensor.is_empty());
        }
        other => panic!("unexpected {other:?}"),
    }
    let msg = err.to_string();
    assert!(
        msg.contains("cut.gguf") && msg.contains("truncated"),
        "{msg}"
    );
    // Cut inside the header: a format error naming the file.
    std::fs::write(&cut, &bytes[..40]).unwrap();
    let err = Model::load(&cut).unwrap_err();
    assert!(matches!(err, ModelError::Format { .. }), "{err:?}");
    assert!(err.to_string().contains("cut.gguf"));
}

#[test]
fn truncated_real_gguf_names_file_and_tensor() {
    let src = cipherlora_model::fetch::ensure_default_model().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cut = dir.path().join("half.gguf");
    let mut bytes = std::fs::read(&src).unwrap();
    bytes.truncate(bytes.len() / 2);
    std::fs::write(&cut, &bytes).unwrap();
    let err = Model::load(&cut).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, ModelError::Truncated { .. }), "{msg}");
    assert!(msg.contains("half.gguf") && msg.contains("blk."), "{msg}");
}

#[test]
fn safetensors_with_wrong_shape_names_file_and_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = weights(&LLAMA, 1);
    let name = "model.layers.1.self_attn.k_proj.weight";
    w.insert(
        name.into(),
        common::rand_tensor(1, &[LLAMA.d, LLAMA.d], 0.1, 0.0),
    );
    write_hf(dir.path(), &LLAMA, &w);
    let err = Model::load(dir.path()).unwrap_err();
    match &err {
        ModelError::ShapeMismatch {
            path,
            tensor,
            expected,
            actual,
        } => {
            assert!(path.ends_with("model.safetensors"));
            assert_eq!(tensor, name);
            assert_eq!(
                (expected.as_slice(), actual.as_slice()),
                (&[32, 64][..], &[64, 64][..])
            );
        }
        other => panic!("unexpected {other:?}"),
    }
    assert!(err.to_string().contains(name));
}

#[test]
fn corrupt_safetensors_names_file() {
    let dir = tempfile::tempdir().unwrap();
    write_hf(dir.path(), &LLAMA, &weights(&LLAMA, 1));
    let p = dir.path().join("model.safetensors");
    let bytes = std::fs::read(&p).unwrap();
    std::fs::write(&p, &bytes[..bytes.len() / 2]).unwrap();
    let err = Model::load(dir.path()).unwrap_err();
    assert!(matches!(err, ModelError::Format { .. }), "{err:?}");
    assert!(err.to_string().contains("model.safetensors"));
}

#[test]
fn adapter_with_unknown_target_module_names_tensor() {
    let f = fixture(LLAMA);
    let mut a = adapter(&f.tiny, 4, 8.0, false, &["q_proj"], 5);
    let bad = "base_model.model.model.layers.0.self_attn.c_attn.lora_A.weight";
    a.tensors
        .insert(bad.into(), common::rand_tensor(2, &[4, 64], 0.1, 0.0));
    a.write(&f.root.join("lora"));
    let err = LoraAdapter::load(&f.root.join("lora"), f.hf.config()).unwrap_err();
    match &err {
        ModelError::Adapter {
            path,
            tensor,
            reason,
        } => {
            assert!(path.ends_with("adapter_model.safetensors"));
            assert_eq!(tensor, bad);
            assert!(reason.contains("c_attn"), "{reason}");
        }
        other => panic!("unexpected {other:?}"),
    }
    // target_modules naming a module the base model lacks.
    let mut a = adapter(&f.tiny, 4, 8.0, false, &["q_proj"], 5);
    a.targets.push("c_proj");
    a.write(&f.root.join("lora2"));
    let err = LoraAdapter::load(&f.root.join("lora2"), f.hf.config()).unwrap_err();
    assert!(err.to_string().contains("c_proj") && err.to_string().contains("adapter_config.json"));
}

#[test]
fn adapter_with_wrong_rank_or_width_names_tensor() {
    let f = fixture(LLAMA);
    let mut a = adapter(&f.tiny, 4, 8.0, false, &["v_proj"], 5);
    a.r = 8; // config says 8, tensors are rank 4
    a.write(&f.root.join("lora"));
    let err = LoraAdapter::load(&f.root.join("lora"), f.hf.config()).unwrap_err();
    match &err {
        ModelError::Adapter { tensor, reason, .. } => {
            assert!(tensor.ends_with("v_proj.lora_A.weight"), "{tensor}");
            assert!(reason.contains("rank"), "{reason}");
        }
        other => panic!("unexpected {other:?}"),
    }
    // An adapter for a wider model (d_in 128 ≠ 64).
    let wide = Tiny { d: 128, ..LLAMA };
    adapter(&wide, 4, 8.0, false, &["q_proj"], 5).write(&f.root.join("wide"));
    let err = LoraAdapter::load(&f.root.join("wide"), f.hf.config()).unwrap_err();
    assert!(err.to_string().contains("q_proj.lora_A.weight"), "{err}");
    // An adapter for a deeper model.
    let deep = Tiny { layers: 3, ..LLAMA };
    adapter(&deep, 4, 8.0, false, &["q_proj"], 5).write(&f.root.join("deep"));
    let err = LoraAdapter::load(&f.root.join("deep"), f.hf.config()).unwrap_err();
    assert!(err.to_string().contains("layers.2"), "{err}");
}

#[test]
fn bad_forward_inputs_are_errors_and_keep_the_cache() {
    let f = fixture(LLAMA);
    let mut c = f.hf.new_cache(8).unwrap();
    let m = &f.hf;
    assert!(matches!(
        m.forward(&[], &mut c, &AttentionMask::Causal, &mut NoAdapter),
        Err(ModelError::Input(_))
    ));
    assert!(matches!(
        m.forward(&[50], &mut c, &AttentionMask::Causal, &mut NoAdapter),
        Err(ModelError::Input(_))
    ));
    assert!(matches!(
        m.forward(&[1; 9], &mut c, &AttentionMask::Causal, &mut NoAdapter),
        Err(ModelError::Input(_))
    ));
    let tree = AttentionMask::tree(vec![None, Some(5)]);
    assert!(matches!(
        m.forward(&[1, 2], &mut c, &tree, &mut NoAdapter),
        Err(ModelError::Input(_))
    ));
    assert_eq!(c.len(), 0);
}

#[test]
fn f16_weights_stay_within_f16_rounding_of_f32_and_load_option_agrees() {
    let f = fixture(QWEN2);
    let f32_logits = logits(&f.hf, &mut NoAdapter);
    let half = f.hf.to_f16_weights().unwrap();
    let f16_logits = logits(&half, &mut NoAdapter);
    let err = max_rel_err(&f32_logits, &f16_logits);
    // f16 has an 11-bit significand: the weights (and inputs) are rounded,
    // so the logits move, but only by about that much.
    assert!(err > 0.0, "f16 weights gave bit-identical logits");
    assert!(err < 1e-2, "{err}");
    let loaded = Model::load_with(
        &f.root.join("hf"),
        &cipherlora_model::LoadOptions {
            weights: cipherlora_model::WeightMode::F16,
        },
    )
    .unwrap();
    assert_eq!(logits(&loaded, &mut NoAdapter), f16_logits);
}
