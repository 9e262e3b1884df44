//! HE-LoRA: the LoRA delta `s·B·(A·x)` of every projection of a layer, for
//! all K+1 verify positions at once, on CKKS ciphertexts.
//!
//! - [`adapter`]: adapters of a layer group, fused into one block-diagonal
//!   LoRA (scaling folded into B; `A·B` never materialised).
//! - [`plan`]: the slot layout and BSGS parameters of a group (the algorithms
//!   and their sources are documented there); [`counts`]: exact operation
//!   counts of a plan; [`planner`]: picks a plan from measured costs.
//! - [`he_traits`]: the small HE interface; [`sim`]: an exact slot simulator.
//! - [`group_client`] / [`group_server`]: the two halves; they exchange only
//!   [`wire::GroupRequest`] / [`wire::GroupResponse`] bytes (ciphertexts) and
//!   public keys.
//!
//! # Flow of one verify round (per layer group)
//! 1. Both sides agree on a [`GroupPlan`] per group shape and T (the server
//!    picks it with [`planner::choose`] from measured [`OpCosts`]; plans
//!    serialise with [`wire::encode_plan`]). The client sends Galois keys for
//!    exactly [`GroupPlan::galois_steps`] once per session.
//! 2. Client: [`GroupClient::request`] packs (FFA: `U = A·X` in plaintext;
//!    standard: X) and encrypts → [`GroupRequest`]
//!    ([`GroupClient::request_within`]: an upload that may lose a stated
//!    error, for fewer bytes).
//! 3. Server: [`PreparedGroup::handle`] evaluates on ciphertexts →
//!    [`GroupResponse`].
//!    Each position's input (FFA: `U = A·X`; standard: X) is divided by a
//!    power of two `c_p ≥ max |input|` ([`InputScales`]), so that the
//!    server's output bound ([`PreparedGroup::output_bounds`]) holds and the
//!    returned ciphertexts can be compressed ([`ResponseCompression`]).
//! 4. Client: [`GroupClient::deltas`] decrypts (compressed or not), unpacks
//!    per projection and multiplies each position back by its `c_p`.
//!
//! # Strategies and what the planner picks
//! Per group the planner ([`planner::choose`]) enumerates: FFA —
//! `hoisted-bsgs` (server baby steps, hoisted; giant steps rescaled then
//! rotated at level 0), `double-hoisted-bsgs` (the same with the baby steps
//! kept over `Q·P`, products with diagonals encoded over `Q·P` and one fused
//! ModDown + rescale per giant step: Bossuat et al., EUROCRYPT 2021, §4.2),
//! `client-prerotated` (client encrypts the g baby-step
//! copies) and `client-replicated` (g = r: zero server rotations, r
//! encryptions and r× upload); standard — `fused` or `segmented` row blocks ×
//! stage-A baby steps on the server (hoisted or double hoisted) or
//! pre-rotated by the client × stage-B baby steps hoisted or double hoisted,
//! × every stage-A period P and baby-step sizes. Every candidate exists in
//! two position packings ([`PositionPacking`]): one position per slot, or
//! two per complex slot (real and imaginary parts; the layout is then built
//! for ⌈T/2⌉ slot positions, which halves the output ciphertexts, products
//! and giant steps of a round while the baby steps stay; `pairs:` in the
//! strategy label). The planner picks pairs at every T ≥ 2 (≈ 25–30 % less
//! client + server CPU at T = 9; `cipherlora bench helora` reports both
//! side by side). Measured on the project machine
//! (`cipherlora bench helora`, N = 8192, 100 Mbit/s, rotations timed over 16
//! distinct Galois keys as in a real evaluation), it picks server-side BSGS for FFA at
//! every shape and T (g = 4–16 growing with T and the rank; hoisted or
//! double hoisted depending on how the cheaper rotations weigh against the
//! dearer `Q·P` products and the fused ModDown + rescale), and fused
//! server-side BSGS for standard LoRA (stage A often double hoisted) except
//! the default model's QKV at T = 1 (segmented). Client replication only
//! wins when rotations are much dearer than encryptions and bandwidth is
//! nearly free (tested in `tests/planner.rs`).
//!
//! # Security
//! - The server sees only ciphertexts, Galois keys, optionally the public key
//!   (rerandomisation), and message sizes fixed by (shape, T, plan).
//! - Leak-freedom: every returned ciphertext decrypts to the requested deltas
//!   in their slots and zeros (up to CKKS noise) elsewhere; partial sums of
//!   stage A and unsummed products of adapter weights never leave the server
//!   (see [`plan`] for why; the simulator test checks it with exact zeros,
//!   the CKKS test at the noise level), in the real *and* the imaginary part
//!   of every slot: the server's plaintexts are real, so with two positions
//!   per slot nothing crosses between the parts.
//! - The noise of a returned ciphertext depends on the weights; the optional
//!   rerandomisation ([`GroupPlan::rerandomize`], [`Rerandomization`]) adds a
//!   fresh public-key encryption of zero plus slot-domain flooding noise. It
//!   is a heuristic smudging: statistical circuit privacy would need noise
//!   2^λ above the evaluation noise, which N = 8192 cannot afford.
//! - As the threat model says, deltas for d chosen inputs reveal `B·A`.
//! - Response compression ([`ResponseCompression`]) is a public function of
//!   the (rerandomised) ciphertext, so it hides nothing and adds nothing;
//!   its noise (≈ 2^-25 of the output bound) lands in every slot alike, so
//!   the leak test's zeros stay at the noise level. Its parameters travel in
//!   the clear and, being chosen from the output bound, tell the client
//!   `log2` of each returned ciphertext's `max_row Σ_j |W_row,j|` to within
//!   about one bit: a coarse norm of the adapter, far less than the deltas
//!   themselves reveal.

pub mod adapter;
pub mod ckks_backend;
pub mod counts;
pub mod error;
pub mod group_client;
pub mod group_server;
pub mod he_traits;
pub mod measure;
pub mod packing;
pub mod plan;
pub mod planner;
pub mod shapes;
pub mod sim;
pub mod wire;

pub use adapter::{FusedGroup, GroupAdapter, GroupShape, ProjectionAdapter};
pub use ckks_backend::{CkksClient, CkksServer, Rerandomization, ResponseCompression};
pub use counts::OpCounts;
pub use error::{HeloraError, Result};
pub use group_client::{GroupClient, InputScales, SlotDeltas, SlotValues};
pub use group_server::PreparedGroup;
pub use he_traits::{HeClient, HeServer, ProductSum};
pub use plan::{BabySteps, GroupPlan, Mode, PositionPacking, Reach, StageAPlan, StageBPlan};
pub use planner::{Estimate, Link, OpCosts};
pub use sim::SlotSimulator;
pub use wire::{GroupRequest, GroupResponse};
