//! Wire codes shared by the protocol's messages: CKKS preset names, projection and group codes,
//! counts, and the error every decoder reports.

use cipherlora_ckks::{CkksParameters, Preset};
use cipherlora_helora::HeloraError;
use cipherlora_model::{Proj, ProjGroup};
use cipherlora_proto::v1;

use super::offer::{LoraKind, group_index};
use crate::PrivateError;

/// A [`HeloraError::Malformed`] about `what`.
pub(crate) fn malformed(what: &'static str, reason: &'static str) -> PrivateError {
    PrivateError::Helora(HeloraError::Malformed { what, reason })
}

/// A wire count as a `usize` (saturating on 16-bit targets).
pub(crate) fn to_usize(v: u32) -> usize {
    usize::try_from(v).unwrap_or(usize::MAX)
}

/// A count as a wire `u32` (saturating; decoders refuse such a count).
pub(crate) fn to_u32(v: usize) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

/// Stable wire name of a CKKS preset.
#[must_use]
pub fn preset_name(p: Preset) -> &'static str {
    match p {
        Preset::N8192Depth1 => "n8192-depth1",
        Preset::N8192Depth2 => "n8192-depth2",
        Preset::N16384Depth1 => "n16384-depth1",
        Preset::N16384Depth2 => "n16384-depth2",
        Preset::N8192Depth2Fast => "n8192-depth2-fast",
        Preset::N16384Depth2Fast => "n16384-depth2-fast",
        _ => "unknown",
    }
}

/// The preset called `name` by [`preset_name`].
#[must_use]
pub fn preset_from_name(name: &str) -> Option<Preset> {
    CkksParameters::all_presets()
        .iter()
        .copied()
        .find(|&p| preset_name(p) == name)
}

/// The wire form of a projection.
pub(crate) fn proj_code(p: Proj) -> v1::Projection {
    match p {
        Proj::Q => v1::Projection::Q,
        Proj::K => v1::Projection::K,
        Proj::V => v1::Projection::V,
        Proj::O => v1::Projection::O,
        Proj::Gate => v1::Projection::Gate,
        Proj::Up => v1::Projection::Up,
        Proj::Down => v1::Projection::Down,
    }
}

/// The projection `code` names. Errors: `Malformed` about `what`.
pub(crate) fn proj_of(code: i32, what: &'static str) -> Result<Proj, PrivateError> {
    usize::try_from(code)
        .ok()
        .and_then(|i| Proj::ALL.get(i).copied())
        .ok_or_else(|| malformed(what, "unknown projection"))
}

/// The wire form of a LoRA kind.
pub(crate) fn kind_code(kind: LoraKind) -> v1::LoraKind {
    match kind {
        LoraKind::Standard => v1::LoraKind::Standard,
        LoraKind::Ffa => v1::LoraKind::Ffa,
    }
}

/// The LoRA kind `code` names. Errors: `Malformed` about `what`.
pub(crate) fn kind_of(code: i32, what: &'static str) -> Result<LoraKind, PrivateError> {
    match v1::LoraKind::try_from(code) {
        Ok(v1::LoraKind::Ffa) => Ok(LoraKind::Ffa),
        Ok(v1::LoraKind::Standard) => Ok(LoraKind::Standard),
        _ => Err(malformed(what, "unknown LoRA kind")),
    }
}

/// The group kind `code` names ([`group_index`]). Errors: `Malformed` about `what`.
pub(crate) fn group_of(code: u32, what: &'static str) -> Result<ProjGroup, PrivateError> {
    ProjGroup::ALL
        .into_iter()
        .find(|&g| group_index(g) == code)
        .ok_or_else(|| malformed(what, "unknown group"))
}
