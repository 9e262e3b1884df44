//! Masked ring values end to end on one layer group of the default model: the offline phase on
//! batched BFV (the group's CKKS plan run on encryptions of the client's masks, the server's masks
//! added, the response flooded) and the online exchange of `ring`, checked against the exact
//! integer products of the fixed-point adapter (an independent reference: no slots, no HE).

mod common;

use std::sync::Arc;

use cipherlora_ckks::{Ciphertext, Context, GaloisKeys, PublicKey, SecretKey};
use cipherlora_helora::bfv_backend::{OfflineLevels, offline_parameters};
use cipherlora_helora::masks::{
    GroupKey, LedgerLimits, MaskError, MaskLedger, MaskPool, MaskedClientGroup, MaskedServerGroup,
};
use cipherlora_helora::planner::{best_per_family, choose};
use cipherlora_helora::ring::{
    RING_PRIME, RingGroup, RingInput, RingParams, kept_bits, minus, sample_mask, unmask,
};
use cipherlora_helora::shapes::ModelShape;
use cipherlora_helora::{
    BfvClient, BfvServer, GroupClient, GroupPlan, GroupShape, HeloraError, Link, Mode, OpCosts,
    PreparedGroup,
};
use common::{random_adapter, random_x};
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;

fn offline_ctx() -> Arc<Context> {
    Context::new(offline_parameters().unwrap()).unwrap()
}

/// The planner's plan for `t` positions in the offline context's slots.
fn planner_choice(ctx: &Context, shape: &GroupShape, mode: Mode, t: usize) -> GroupPlan {
    let link = Link::default();
    choose(
        shape,
        mode,
        t,
        ctx.slots(),
        false,
        &OpCosts::default(),
        &link,
    )
    .unwrap()
    .0
}

/// The centred difference `a − b` in `Z_p`.
fn centred(a: u64, b: u64) -> i128 {
    let p = i128::from(RING_PRIME);
    let d = (i128::from(a) - i128::from(b)).rem_euclid(p);
    if d > p / 2 { d - p } else { d }
}

/// One group's client and server for the offline phase, with a random adapter.
struct Parties {
    ring: RingGroup,
    server: BfvServer,
    client: BfvClient,
    group: PreparedGroup<BfvServer>,
    gc: GroupClient,
    /// Input values per position: R (FFA) or d_in (standard).
    width: usize,
}

impl Parties {
    fn new(ctx: &Arc<Context>, plan: &GroupPlan, seed: u64, rng: &mut ChaCha20Rng) -> Self {
        let shape = &plan.shape;
        let ring = RingGroup::new(&random_adapter(shape, seed), RingParams::default()).unwrap();
        let sk = SecretKey::generate(ctx, rng);
        let steps: Vec<i64> = plan.galois_steps().unwrap().into_iter().collect();
        let gks = GaloisKeys::generate(&sk, &steps, rng);
        let pk = PublicKey::generate(&sk, rng);
        let levels = OfflineLevels::for_mode(plan.mode);
        let server = BfvServer::new(ctx, RING_PRIME, gks, pk, levels).unwrap();
        let client = BfvClient::new(&sk, RING_PRIME, levels).unwrap();
        let group = PreparedGroup::new(&server, plan, ring.adapter()).unwrap();
        let gc = ring.group_client(plan).unwrap();
        let width = gc.mask_width();
        Parties {
            ring,
            server,
            client,
            group,
            gc,
            width,
        }
    }

    /// The client's uploads for masks `r` (T × width), parsed as the server sees them.
    fn upload(&self, r: &[u64]) -> Vec<Ciphertext> {
        let level = self.group.plan().input_level();
        self.gc
            .mask_slots(r)
            .unwrap()
            .iter()
            .map(|rows| self.client.encrypt(rows, level).unwrap().expand())
            .collect()
    }

    /// The server's offline response under masks `m`, decrypted and unpacked per projection.
    fn offline(&self, inputs: &[Ciphertext], m: &[Vec<u64>]) -> Vec<Vec<u64>> {
        let out = self
            .server
            .offline_response(&self.group, inputs, m)
            .unwrap();
        let values: Vec<Vec<u64>> = out
            .iter()
            .map(|c| self.client.decrypt(c).unwrap().values)
            .collect();
        self.gc.unpack_ring(&values).unwrap()
    }

    /// Fresh server masks: N values per returned ciphertext.
    fn server_masks(&self, rng: &mut ChaCha20Rng) -> Vec<Vec<u64>> {
        let plan = self.group.plan();
        (0..plan.stage_b.n_out)
            .map(|_| sample_mask(rng, 2 * plan.slots))
            .collect()
    }
}

/// Runs the offline phase for `plan` and checks `M̂·r − m` per delta exactly, and the flooding
/// margin over the response's noise; then the online exchange against `M̂·x̂`.
fn offline_then_online(ctx: &Arc<Context>, plan: &GroupPlan, seed: u64) {
    let shape = &plan.shape;
    let mut rng = ChaCha20Rng::from_seed([seed as u8; 32]);
    let parties = Parties::new(ctx, plan, seed, &mut rng);
    let Parties {
        ring,
        server,
        client,
        group,
        gc,
        width,
    } = &parties;
    let width = *width;

    // Offline: the client's masks r, the server's masks m.
    let r = sample_mask(&mut rng, plan.t * width);
    let inputs = parties.upload(&r);
    let m = parties.server_masks(&mut rng);
    let kept = parties.offline(&inputs, &m);
    // The noise before flooding, at the response level: the flooding must exceed it by 40 bits.
    let levels = OfflineLevels::for_mode(plan.mode);
    let log_q: u32 = ctx.params().moduli_bits()[..=levels.response_level]
        .iter()
        .sum();
    let ev = cipherlora_ckks::Evaluator::new(ctx);
    for c in group.evaluate(server, &inputs).unwrap() {
        let mut c = c;
        while c.level() > levels.response_level {
            ev.rescale_assign(&mut c).unwrap();
        }
        let budget = client.decrypt(&c).unwrap().budget_bits;
        let noise_bits = f64::from(log_q) - 61.0 - budget;
        assert!(
            f64::from(levels.flood_bits) - noise_bits >= 40.0,
            "noise 2^{noise_bits:.1} against flooding 2^{}",
            levels.flood_bits
        );
    }
    let server_masks = gc.unpack_ring(&m).unwrap();
    let label = format!("{:?} T={} {}", plan.mode, plan.t, plan.strategy());
    let mut worst = 0i128;
    for (j, &d) in shape.d_outs.iter().enumerate() {
        for pos in 0..plan.t {
            let mr = ring
                .product(j, &r[pos * width..(pos + 1) * width], plan.mode)
                .unwrap();
            let want = minus(&mr, &server_masks[j][pos * d..(pos + 1) * d]).unwrap();
            for (row, &w) in want.iter().enumerate() {
                worst = worst.max(centred(kept[j][pos * d + row], w).abs());
            }
        }
    }
    assert_eq!(worst, 0, "{label}: offline values differ from M̂·r − m");

    // Online: x̂ − r up, the top bits of M̂·(x̂ − r) + m down, unmasked with the kept bits. FFA's
    // input is U = A·x, which the client computes itself: any R values will do here.
    let x = random_x(plan.t, width, seed + 1);
    let shift = ring.shift();
    for pos in 0..plan.t {
        let encoded = RingInput::encode(&x[pos * width..(pos + 1) * width], 12);
        let masked = encoded.masked(&r[pos * width..(pos + 1) * width]).unwrap();
        for (j, &d) in shape.d_outs.iter().enumerate() {
            let mj = &server_masks[j][pos * d..(pos + 1) * d];
            let response = ring.respond(j, &masked, mj, plan.mode).unwrap();
            let mine = kept_bits(&kept[j][pos * d..(pos + 1) * d], shift);
            let z = unmask(&response, &mine, shift).unwrap();
            let want = ring.product(j, &encoded.values, plan.mode).unwrap();
            for (&zv, &w) in z.iter().zip(&want) {
                let err = centred(zv.rem_euclid(RING_PRIME as i64) as u64, w).abs();
                assert!(err <= 1 << (shift + 1), "{label}: online error {err}");
            }
        }
    }
}

#[test]
fn ffa_offline_and_online_on_every_family_of_the_qkv_group() {
    let ctx = offline_ctx();
    let (_, shape) = &ModelShape::smollm2_135m().groups[0];
    for (plan, _) in best_per_family(
        shape,
        Mode::Ffa,
        8,
        ctx.slots(),
        false,
        &OpCosts::default(),
        &Link::default(),
    )
    .unwrap()
    {
        offline_then_online(&ctx, &plan, 11);
    }
}

#[test]
fn standard_offline_and_online_on_the_planner_choice_for_every_group() {
    let ctx = offline_ctx();
    for (gi, (_, shape)) in ModelShape::smollm2_135m().groups.iter().enumerate() {
        let plan = planner_choice(&ctx, shape, Mode::Standard, 8);
        offline_then_online(&ctx, &plan, 20 + gi as u64);
    }
}

#[test]
fn without_the_server_masks_the_response_is_not_the_product() {
    // The mask is what hides M̂·r: a response decrypted without subtracting m differs.
    let ctx = offline_ctx();
    let (_, shape) = &ModelShape::smollm2_135m().groups[0];
    let plan = planner_choice(&ctx, shape, Mode::Ffa, 4);
    let mut rng = ChaCha20Rng::from_seed([9; 32]);
    let parties = Parties::new(&ctx, &plan, 5, &mut rng);
    let r = sample_mask(&mut rng, plan.t * parties.width);
    let inputs = parties.upload(&r);
    let zeros = vec![vec![0u64; 2 * plan.slots]; plan.stage_b.n_out];
    let open = parties.offline(&inputs, &zeros);
    let hidden = parties.offline(&inputs, &parties.server_masks(&mut rng));
    let d = shape.d_outs[0];
    let mr = parties
        .ring
        .product(0, &r[..parties.width], Mode::Ffa)
        .unwrap();
    assert_eq!(open[0][..d], mr[..]);
    let far = (0..d)
        .filter(|&i| centred(hidden[0][i], mr[i]).abs() > 1 << 40)
        .count();
    assert!(far > d * 9 / 10, "only {far} of {d} values hidden");
}

/// `s·B·A·x` per projection (positions × d_out, position-major), in f64.
fn reference(adapter: &cipherlora_helora::GroupAdapter, x: &[f32]) -> Vec<Vec<f64>> {
    let d_in = adapter.d_in;
    adapter
        .projections
        .iter()
        .map(|p| {
            x.chunks_exact(d_in)
                .flat_map(|row| {
                    let u: Vec<f64> =
                        p.a.chunks_exact(d_in)
                            .map(|a| a.iter().zip(row).map(|(&a, &v)| f64::from(a * v)).sum())
                            .collect();
                    p.b.chunks_exact(p.rank)
                        .map(|b| {
                            f64::from(p.scaling)
                                * b.iter()
                                    .zip(&u)
                                    .map(|(&b, u)| f64::from(b) * u)
                                    .sum::<f64>()
                        })
                        .collect::<Vec<f64>>()
                })
                .collect()
        })
        .collect()
}

#[test]
fn ledger_and_pool_run_two_batches_to_the_plaintext_deltas_each_mask_once() {
    let ctx = offline_ctx();
    let (_, shape) = &ModelShape::smollm2_135m().groups[0];
    let key = GroupKey { layer: 7, group: 0 };
    for (mode, seed) in [(Mode::Ffa, 31u64), (Mode::Standard, 32)] {
        let plan = planner_choice(&ctx, shape, mode, 4);
        let mut rng = ChaCha20Rng::from_seed([seed as u8; 32]);
        let adapter = random_adapter(shape, seed);
        let sk = SecretKey::generate(&ctx, &mut rng);
        let steps: Vec<i64> = plan.galois_steps().unwrap().into_iter().collect();
        let gks = GaloisKeys::generate(&sk, &steps, &mut rng);
        let levels = OfflineLevels::for_mode(mode);
        let pk = PublicKey::generate(&sk, &mut rng);
        let server = BfvServer::new(&ctx, RING_PRIME, gks, pk, levels).unwrap();
        let bfv = BfvClient::new(&sk, RING_PRIME, levels).unwrap();
        let theirs =
            MaskedServerGroup::new(&server, &plan, &adapter, RingParams::default()).unwrap();
        let layout = match mode {
            Mode::Ffa => {
                let a: Vec<Vec<f32>> = adapter.projections.iter().map(|p| p.a.clone()).collect();
                GroupClient::ffa(&plan, &a).unwrap()
            }
            Mode::Standard => GroupClient::standard(&plan).unwrap(),
        };
        let mine = MaskedClientGroup::new(layout, theirs.public());
        let mut ledger = MaskLedger::new(LedgerLimits::default());
        let mut pool = MaskPool::new(1 << 24);

        for _ in 0..2 {
            let (batch, up) = mine.offline_request(&bfv, &mut pool, key).unwrap();
            let up: Vec<Ciphertext> = up.iter().map(|c| c.expand()).collect();
            let down = theirs
                .offline(&server, &mut ledger, key, batch, &up)
                .unwrap();
            mine.absorb(&bfv, &mut pool, key, batch, &down).unwrap();
        }
        assert_eq!(pool.available(key), 8);

        // Six positions: all of the first batch and two of the second.
        let x = random_x(6, shape.d_in, seed);
        let rows = mine.online_request(&mut pool, key, &x).unwrap();
        // Sent as two pipelined requests (4 + 2 rows), each answered and read on its own.
        let parts = rows.clone().into_parts(4);
        assert_eq!(
            parts.iter().map(|p| p.refs.len()).collect::<Vec<_>>(),
            [4, 2]
        );
        let mut deltas = vec![Vec::new(); shape.d_outs.len()];
        for part in &parts {
            let response = theirs
                .online(&mut ledger, key, &part.refs, &part.masked)
                .unwrap();
            for (all, d) in deltas.iter_mut().zip(mine.deltas(part, &response).unwrap()) {
                all.extend(d);
            }
        }
        for (j, (got, want)) in deltas.iter().zip(reference(&adapter, &x)).enumerate() {
            let max = want.iter().fold(0f64, |m, v| m.max(v.abs()));
            let err = got
                .iter()
                .zip(&want)
                .fold(0f64, |m, (&g, w)| m.max((f64::from(g) - w).abs()));
            assert!(
                err <= max / 512.0,
                "{mode:?} projection {j}: error {err:e} against max {max:e}"
            );
        }

        // A replay is refused, and neither side hands a used mask out again.
        let replay = theirs.online(&mut ledger, key, &rows.refs, &rows.masked);
        assert!(
            matches!(
                replay,
                Err(HeloraError::Mask(MaskError::BatchClosed { .. }))
            ),
            "{replay:?}"
        );
        let w = mine.width();
        let second = theirs.online(&mut ledger, key, &rows.refs[4..], &rows.masked[4 * w..]);
        assert!(
            matches!(second, Err(HeloraError::Mask(MaskError::MaskReused { .. }))),
            "{second:?}"
        );
        assert_eq!((ledger.open_batches(), ledger.unused_positions()), (1, 2));
        let more = mine.online_request(&mut pool, key, &x[..3 * shape.d_in]);
        assert!(
            matches!(
                more,
                Err(HeloraError::Mask(MaskError::PoolEmpty {
                    needed: 3,
                    available: 2
                }))
            ),
            "{more:?}"
        );
        let last = mine
            .online_request(&mut pool, key, &x[..2 * shape.d_in])
            .unwrap();
        assert!(last.refs.iter().all(|r| r.batch == rows.refs[5].batch));
        theirs
            .online(&mut ledger, key, &last.refs, &last.masked)
            .unwrap();
        assert_eq!((ledger.open_batches(), pool.available(key)), (0, 0));
    }
}
