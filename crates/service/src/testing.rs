//! A plaintext test backend (**not private**): exact, checkable answers for testing the transport,
//! rejecting malformed input with the HE backend's [`BackendError`] variants. Outputs are `y_j =
//! group_factor(layer, group) · x_j
//! + session_tag(pk)` at `level − 1`; byte formats are documented on the decoders.

use bytes::{BufMut, Bytes, BytesMut};
use cipherlora_proto::v1::{GroupPlan, GroupRequest, OfferedGroup, SessionOffer};

use crate::backend::{
    AdapterBackend, AdapterInfo, BackendError, CiphertextFault, GroupRequestShape,
    OpenSessionPayload, OpenedSession, ParameterFault, SessionCompute,
};

/// Values must have `|v|` below this ("coefficient below its modulus").
pub const MODULUS: f64 = 1_099_511_627_776.0; // 2^40
/// Level the test backend expects input ciphertexts at.
pub const INPUT_LEVEL: u8 = 2;
/// Ciphertext header length in bytes.
pub const CT_HEADER: usize = 12;
/// CKKS presets of the test backend and their `log2 N`.
pub const PRESETS: [(&str, u8); 3] = [("test-n4096", 12), ("test-n8192", 13), ("test-n16384", 14)];

/// A decoded test ciphertext.
#[derive(Debug, Clone, PartialEq)]
pub struct TestCiphertext {
    /// log2 of the ring degree N.
    pub log2_n: u8,
    /// Level.
    pub level: u8,
    /// The N/2 slot values.
    pub values: Vec<f64>,
}

/// Serialises a test ciphertext (no validation: tests use it to build bad input too).
pub fn encode_ct(log2_n: u8, level: u8, values: &[f64]) -> Bytes {
    let mut b = BytesMut::with_capacity(CT_HEADER + 8 * values.len());
    b.put_slice(b"TCT");
    b.put_u8(1);
    b.put_u8(log2_n);
    b.put_u8(level);
    b.put_u16_le(0);
    b.put_u32_le(u32::try_from(values.len()).unwrap_or(u32::MAX));
    for v in values {
        b.put_f64_le(*v);
    }
    b.freeze()
}

/// Parses and validates a test ciphertext (`"TCT"`, v1, log2 N, level, count, N/2 finite f64 below
/// [`MODULUS`]). Errors: the first [`CiphertextFault`].
pub fn decode_ct(b: &[u8]) -> Result<TestCiphertext, CiphertextFault> {
    if b.len() < CT_HEADER {
        return Err(CiphertextFault::Truncated {
            expected: CT_HEADER,
            got: b.len(),
        });
    }
    if &b[..3] != b"TCT" {
        return Err(CiphertextFault::BadMagic);
    }
    if b[3] != 1 {
        return Err(CiphertextFault::UnsupportedVersion { version: b[3] });
    }
    let (log2_n, level) = (b[4], b[5]);
    if b[6] != 0 || b[7] != 0 {
        return Err(CiphertextFault::Malformed {
            what: "reserved bytes",
        });
    }
    if !(1..=17).contains(&log2_n) {
        return Err(CiphertextFault::Malformed {
            what: "ring degree",
        });
    }
    let count = u32::from_le_bytes([b[8], b[9], b[10], b[11]]) as usize;
    if count != 1usize << (log2_n - 1) {
        return Err(CiphertextFault::Malformed { what: "slot count" });
    }
    let expected = CT_HEADER + 8 * count;
    if b.len() < expected {
        return Err(CiphertextFault::Truncated {
            expected,
            got: b.len(),
        });
    }
    if b.len() > expected {
        return Err(CiphertextFault::TrailingBytes {
            expected,
            got: b.len(),
        });
    }
    let mut values = Vec::with_capacity(count);
    for (index, chunk) in b[CT_HEADER..].chunks_exact(8).enumerate() {
        let mut a = [0u8; 8];
        a.copy_from_slice(chunk);
        let v = f64::from_le_bytes(a);
        if !v.is_finite() || v.abs() >= MODULUS {
            return Err(CiphertextFault::CoefficientOutOfRange { limb: 0, index });
        }
        values.push(v);
    }
    Ok(TestCiphertext {
        log2_n,
        level,
        values,
    })
}

/// A test public key for ring degree `2^log2_n` with key material `seed`.
pub fn test_public_key(log2_n: u8, seed: [u8; 32]) -> Bytes {
    let mut b = BytesMut::with_capacity(37);
    b.put_slice(b"TPK");
    b.put_u8(1);
    b.put_u8(log2_n);
    b.put_slice(&seed);
    b.freeze()
}

/// Test Galois keys for rotation `steps`.
pub fn test_galois_keys(steps: &[i64]) -> Bytes {
    let mut b = BytesMut::new();
    b.put_slice(b"TGK");
    b.put_u8(1);
    b.put_u32_le(u32::try_from(steps.len()).unwrap_or(u32::MAX));
    for s in steps {
        b.put_i64_le(*s);
    }
    b.freeze()
}

/// The per-session constant added to every output slot: key material bytes 0..4 (u32) modulo 1024.
/// Zero for a malformed key.
pub fn session_tag(public_key: &[u8]) -> f64 {
    match public_key.get(5..9) {
        Some(s) => f64::from(u32::from_le_bytes([s[0], s[1], s[2], s[3]]) % 1024),
        None => 0.0,
    }
}

/// The per-(layer, group) factor: `(layer + 1)/2 + group/4` (exact in f64).
pub fn group_factor(layer: u32, group: u32) -> f64 {
    f64::from(layer + 1) * 0.5 + f64::from(group) * 0.25
}

/// A plaintext stand-in for an HE adapter backend.
#[derive(Debug, Clone)]
pub struct TestBackend {
    info: AdapterInfo,
    cts_per_group: Vec<usize>,
    /// How long opening a session takes (a large adapter's encoding).
    open_delay: std::time::Duration,
}

impl TestBackend {
    /// An adapter `adapter_id` with `num_layers` layers and groups `[q,k,v]` and `[o]`, one
    /// ciphertext per group request.
    pub fn new(adapter_id: &str, num_layers: u32) -> Self {
        Self::with_groups(adapter_id, num_layers, &[1, 1])
    }

    /// As [`TestBackend::new`] with `cts_per_group[g]` ciphertexts per request of group `g`.
    pub fn with_groups(adapter_id: &str, num_layers: u32, cts_per_group: &[usize]) -> Self {
        let names = [vec!["q_proj", "k_proj", "v_proj"], vec!["o_proj"]];
        let groups: Vec<Vec<String>> = (0..cts_per_group.len())
            .map(|g| match names.get(g) {
                Some(n) => n.iter().map(|s| s.to_string()).collect(),
                None => vec![format!("module_{g}")],
            })
            .collect();
        Self {
            info: AdapterInfo {
                adapter_id: adapter_id.into(),
                base_model: "test/base-model".into(),
                base_model_revision: "0".into(),
                base_model_sha256: [0x5a; 32],
                target_modules: groups.concat(),
                rank: 8,
                rank_pattern: Default::default(),
                lora_alpha: 16.0,
                num_layers,
                groups,
                ffa_lora_a: None,
                ckks_presets: PRESETS.iter().map(|(p, _)| p.to_string()).collect(),
            },
            cts_per_group: cts_per_group.to_vec(),
            open_delay: std::time::Duration::ZERO,
        }
    }

    /// As `self`, each `OpenSession` taking `delay` (as encoding a large adapter does).
    #[must_use]
    pub fn with_open_delay(mut self, delay: std::time::Duration) -> Self {
        self.open_delay = delay;
        self
    }
}

/// What the test backend refuses in an opening.
#[derive(Debug, thiserror::Error)]
enum TestFault {
    /// A key's header, length or ring degree is wrong.
    #[error("{0}")]
    Key(&'static str),
    /// More positions than the test backend serves.
    #[error("T = {0} positions above 64")]
    Positions(u32),
}

fn parse_key(b: &[u8], log2_n: u8) -> Result<(), BackendError> {
    let bad = |what| BackendError::invalid_key(TestFault::Key(what));
    if b.len() != 37 {
        return Err(bad("public key length"));
    }
    if &b[..4] != b"TPK\x01" {
        return Err(bad("public key header"));
    }
    if b[4] != log2_n {
        return Err(bad("public key ring degree differs from the preset"));
    }
    Ok(())
}

fn parse_galois(b: &[u8]) -> Result<(), BackendError> {
    let bad = |what| BackendError::invalid_key(TestFault::Key(what));
    if b.len() < 8 || &b[..4] != b"TGK\x01" {
        return Err(bad("Galois key header"));
    }
    let n = u32::from_le_bytes([b[4], b[5], b[6], b[7]]) as usize;
    if n.checked_mul(8).and_then(|x| x.checked_add(8)) != Some(b.len()) {
        return Err(bad("Galois key length"));
    }
    Ok(())
}

impl AdapterBackend for TestBackend {
    fn info(&self) -> AdapterInfo {
        self.info.clone()
    }

    fn open_session(&self, p: OpenSessionPayload) -> Result<OpenedSession, BackendError> {
        std::thread::sleep(self.open_delay);
        let log2_n = PRESETS
            .iter()
            .find(|(name, _)| *name == p.ckks_preset)
            .map(|(_, l)| *l)
            .ok_or_else(|| BackendError::UnknownPreset {
                preset: p.ckks_preset.clone(),
            })?;
        parse_key(&p.public_key, log2_n)?;
        parse_galois(&p.galois_keys)?;
        let t = p.plan_request.positions;
        if t > 64 {
            return Err(BackendError::invalid_plan(TestFault::Positions(t)));
        }
        Ok(OpenedSession {
            // A stand-in offer: one group per group kind, its ciphertexts per request as the
            // plan's `d_in`, so a backend with another layout offers something else.
            offer: SessionOffer {
                ckks_preset: p.ckks_preset.clone(),
                positions: t,
                groups: (0u32..)
                    .zip(&self.cts_per_group)
                    .map(|(group, &n)| OfferedGroup {
                        group,
                        plan: Some(GroupPlan {
                            d_in: u32::try_from(n).unwrap_or(u32::MAX),
                            ..GroupPlan::default()
                        }),
                        ..OfferedGroup::default()
                    })
                    .collect(),
                ..SessionOffer::default()
            },
            compute: Box::new(TestSession {
                t,
                log2_n,
                tag: session_tag(&p.public_key),
                num_layers: self.info.num_layers,
                cts_per_group: self.cts_per_group.clone(),
            }),
        })
    }
}

struct TestSession {
    /// Positions per request; 0: offer-only.
    t: u32,
    log2_n: u8,
    tag: f64,
    num_layers: u32,
    cts_per_group: Vec<usize>,
}

impl SessionCompute for TestSession {
    fn offer_only(&self) -> bool {
        self.t == 0
    }

    fn group_shape(&self, layer: u32, group: u32) -> Result<GroupRequestShape, BackendError> {
        match self.cts_per_group.get(group as usize) {
            Some(&n) if layer < self.num_layers && self.t > 0 => Ok(GroupRequestShape {
                masked: false,
                input_ciphertexts: n,
                positions: self.t,
            }),
            _ => Err(BackendError::UnknownLayer { layer, group }),
        }
    }

    fn compute(&self, request: &GroupRequest) -> Result<Vec<Bytes>, BackendError> {
        let ciphertexts = &request.ciphertexts;
        self.group_shape(request.layer, request.group)?;
        // Validate everything before any arithmetic.
        let mut parsed = Vec::with_capacity(ciphertexts.len());
        for (index, b) in ciphertexts.iter().enumerate() {
            let ct =
                decode_ct(b).map_err(|fault| BackendError::InvalidCiphertext { index, fault })?;
            if ct.log2_n != self.log2_n {
                return Err(BackendError::ParameterMismatch {
                    index,
                    fault: ParameterFault::RingDegree {
                        expected: 1u64 << self.log2_n,
                        got: 1u64 << ct.log2_n,
                    },
                });
            }
            if ct.level != INPUT_LEVEL {
                return Err(BackendError::ParameterMismatch {
                    index,
                    fault: ParameterFault::Level {
                        expected: INPUT_LEVEL.into(),
                        got: ct.level.into(),
                    },
                });
            }
            parsed.push(ct);
        }
        let f = group_factor(request.layer, request.group);
        Ok(parsed
            .iter()
            .map(|ct| {
                let y: Vec<f64> = ct.values.iter().map(|x| f * x + self.tag).collect();
                encode_ct(ct.log2_n, ct.level - 1, &y)
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cipherlora_proto::v1::PlanRequest;
    use proptest::prelude::*;

    fn session() -> Box<dyn SessionCompute> {
        let b = TestBackend::new("t", 2);
        b.open_session(OpenSessionPayload {
            ckks_preset: "test-n4096".into(),
            public_key: test_public_key(12, [3; 32]),
            galois_keys: test_galois_keys(&[1, 2]),
            plan_request: PlanRequest {
                positions: 4,
                ..PlanRequest::default()
            },
        })
        .unwrap()
        .compute
    }

    #[test]
    fn test_backend_computes_the_documented_function() {
        let s = session();
        let x: Vec<f64> = (0..2048).map(|i| i as f64 - 1000.5).collect();
        let out = s
            .compute(&GroupRequest::for_group(
                1,
                1,
                vec![encode_ct(12, 2, &x)],
                0,
            ))
            .unwrap();
        let y = decode_ct(&out[0]).unwrap();
        assert_eq!(y.level, 1);
        let tag = f64::from(u32::from_le_bytes([3; 4]) % 1024);
        for (xi, yi) in x.iter().zip(&y.values) {
            assert_eq!(*yi, 1.25 * xi + tag);
        }
    }

    #[test]
    fn test_backend_rejects_malformed_ciphertexts_with_typed_errors() {
        let s = session();
        let good = encode_ct(12, 2, &vec![1.0; 2048]);
        let run = |b: Bytes| {
            s.compute(&GroupRequest::for_group(0, 0, vec![b], 0))
                .unwrap_err()
        };
        let truncated = CiphertextFault::Truncated {
            expected: good.len(),
            got: good.len() - 1,
        };
        assert!(matches!(
            run(good.slice(..good.len() - 1)),
            BackendError::InvalidCiphertext { index: 0, fault } if fault == truncated
        ));
        let mut big = vec![1.0; 2048];
        big[7] = MODULUS;
        assert!(matches!(
            run(encode_ct(12, 2, &big)),
            BackendError::InvalidCiphertext {
                index: 0,
                fault: CiphertextFault::CoefficientOutOfRange { limb: 0, index: 7 }
            }
        ));
        assert!(matches!(
            run(encode_ct(13, 2, &vec![1.0; 4096])),
            BackendError::ParameterMismatch {
                index: 0,
                fault: ParameterFault::RingDegree {
                    expected: 4096,
                    got: 8192
                }
            }
        ));
        assert!(matches!(
            run(encode_ct(12, 1, &vec![1.0; 2048])),
            BackendError::ParameterMismatch {
                index: 0,
                fault: ParameterFault::Level {
                    expected: 2,
                    got: 1
                }
            }
        ));
        assert!(matches!(
            s.compute(&GroupRequest::for_group(2, 0, vec![good], 0))
                .unwrap_err(),
            BackendError::UnknownLayer { layer: 2, group: 0 }
        ));
    }

    proptest! {
        #[test]
        fn random_bytes_never_panic_the_ciphertext_parser(b in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode_ct(&b);
        }
    }
}
