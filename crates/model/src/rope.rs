//! Rotary position embedding (Su et al., "RoFormer", 2021, eq. 34) at explicit
//! positions, in the two dimension pairings of [`RopeStyle`].

use candle_core::{Device, Tensor};

use crate::{ModelError, RopeStyle};

/// cos and sin tables, each (T, head_dim/2), for the given positions:
/// angle(p, i) = p · theta^(−2i/head_dim), computed in f64.
pub(crate) fn tables(
    positions: &[usize],
    head_dim: usize,
    theta: f64,
    device: &Device,
) -> Result<(Tensor, Tensor), ModelError> {
    let half = head_dim / 2;
    let mut cos = Vec::with_capacity(positions.len() * half);
    let mut sin = Vec::with_capacity(positions.len() * half);
    for &p in positions {
        for i in 0..half {
            let inv_freq = 1.0 / theta.powf((2 * i) as f64 / head_dim as f64);
            let a = p as f64 * inv_freq;
            cos.push(a.cos() as f32);
            sin.push(a.sin() as f32);
        }
    }
    let t = positions.len();
    Ok((
        Tensor::from_vec(cos, (t, half), device)?,
        Tensor::from_vec(sin, (t, half), device)?,
    ))
}

/// Applies RoPE to x: (1, heads, T, head_dim), contiguous.
pub(crate) fn apply(
    x: &Tensor,
    cos: &Tensor,
    sin: &Tensor,
    style: RopeStyle,
) -> Result<Tensor, ModelError> {
    Ok(match style {
        RopeStyle::Interleaved => candle_nn::rotary_emb::rope_i(x, cos, sin)?,
        RopeStyle::Half => candle_nn::rotary_emb::rope(x, cos, sin)?,
    })
}
