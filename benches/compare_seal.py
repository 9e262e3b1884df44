#!/usr/bin/env python3
"""Side-by-side CKKS timings: cipherlora-ckks vs Microsoft SEAL (through
TenSEAL's low-level `tenseal.sealapi`), same parameters, one run.

Dev-only. Setup and use (see BENCHMARKS.md, "CKKS engine"):

    python3 -m venv /work/venv-ckks && /work/venv-ckks/bin/pip install tenseal==0.3.18
    cargo build --release -p cipherlora
    /work/venv-ckks/bin/python benches/compare_seal.py --ours target/release/cipherlora

It runs `OURS bench ckks --json ...` (one thread), then times the same
operations in SEAL (one thread, same N, same chain, scale 2^40), and prints a
Markdown table with both columns and the ratio ours/SEAL. The chain is
50,40,40 + special 50 unless CIPHERLORA_CKKS_CHAIN=60 (60,40,40 + 60); the
environment variable is passed to both sides.

Notes on fairness: SEAL is called through pybind11, so `encode` includes
converting a Python list of N/2 floats and `decrypt_decode` converting the
result back (measured separately as `py_list_overhead` and reported). The
`rotate_hoisted_extra` row compares our marginal hoisted rotation with
SEAL's full rotation (SEAL has no hoisting).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

OPS = [
    "encode",
    "encrypt_sk",
    "encrypt_pk",
    "decrypt_decode",
    "add",
    "ct_pt_mul",
    "rescale",
    "rotate",
    "rotate_hoisted_extra",
]
TARGETS = {op: 0.5 for op in OPS}
TARGETS["rotate_hoisted_extra"] = 0.35  # vs SEAL's full rotate


def chain():
    if os.environ.get("CIPHERLORA_CKKS_CHAIN") == "60":
        return [60, 40, 40], 60
    return [50, 40, 40], 50


def median_ms(reps, fn):
    for _ in range(min(5, reps)):
        fn()
    ts = []
    for _ in range(reps):
        t = time.perf_counter_ns()
        fn()
        ts.append((time.perf_counter_ns() - t) / 1e6)
    return statistics.median(ts)


def seal_measure(n, reps):
    import tenseal.sealapi as s

    bits, special = chain()
    parms = s.EncryptionParameters(s.SCHEME_TYPE.CKKS)
    parms.set_poly_modulus_degree(n)
    parms.set_coeff_modulus(s.CoeffModulus.Create(n, bits + [special]))
    ctx = s.SEALContext(parms, True, s.SEC_LEVEL_TYPE.TC128)
    keygen = s.KeyGenerator(ctx)
    sk = keygen.secret_key()
    pk = s.PublicKey()
    keygen.create_public_key(pk)
    gk = s.GaloisKeys()
    keygen.create_galois_keys(gk)  # all power-of-two steps (includes step 1)
    encoder = s.CKKSEncoder(ctx)
    enc_sk = s.Encryptor(ctx, sk)
    enc_pk = s.Encryptor(ctx, pk)
    dec = s.Decryptor(ctx, sk)
    ev = s.Evaluator(ctx)
    scale = 2.0**40
    values = [((i % 97) - 48) / 50.0 for i in range(n // 2)]
    pt = s.Plaintext()
    encoder.encode(values, scale, pt)
    ct = s.Ciphertext()
    enc_sk.encrypt_symmetric(pt, ct)
    ct2 = s.Ciphertext()
    enc_pk.encrypt(pt, ct2)
    out = {}
    tmp_pt = s.Plaintext()
    out["encode"] = median_ms(reps, lambda: encoder.encode(values, scale, tmp_pt))
    tmp_ct = s.Ciphertext()
    out["encrypt_sk"] = median_ms(reps, lambda: enc_sk.encrypt_symmetric(pt, tmp_ct))
    out["encrypt_pk"] = median_ms(reps, lambda: enc_pk.encrypt(pt, tmp_ct))

    def dd():
        p = s.Plaintext()
        dec.decrypt(ct, p)
        return encoder.decode_double(p)

    out["decrypt_decode"] = median_ms(reps, dd)
    acc = s.Ciphertext()
    enc_sk.encrypt_symmetric(pt, acc)
    out["add"] = median_ms(reps, lambda: ev.add_inplace(acc, ct2))
    prod = s.Ciphertext()
    enc_sk.encrypt_symmetric(pt, prod)
    # SEAL refuses scales beyond the modulus: multiply repeatedly by a plaintext
    # of scale 1 (same work) so that the in-place product stays valid.
    pt_unit = s.Plaintext()
    encoder.encode([1.0] * (n // 2), 1.0, pt_unit)
    out["ct_pt_mul"] = median_ms(reps, lambda: ev.multiply_plain_inplace(prod, pt_unit))
    big = s.Ciphertext()
    ev.multiply_plain(ct, pt, big)
    out["rescale"] = median_ms(reps, lambda: ev.rescale_to_next(big, tmp_ct))
    out["rotate"] = median_ms(reps, lambda: ev.rotate_vector(ct, 1, gk, tmp_ct))
    # SEAL has no hoisting: one more rotation costs a full rotation.
    out["rotate_hoisted_extra"] = out["rotate"]
    out["py_list_overhead"] = median_ms(reps, lambda: [float(x) for x in values])
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ours", default="target/release/cipherlora", help="cipherlora binary")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--json", default="reports/compare-seal-ckks.json")
    ap.add_argument("--markdown", default=None)
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as d:
        ours_json = os.path.join(d, "ours.json")
        subprocess.run(
            [args.ours, "bench", "ckks", "--json", ours_json, "--reps", str(args.reps)],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        with open(ours_json) as f:
            ours = json.load(f)
    seal = {str(n): seal_measure(n, args.reps) for n in (8192, 16384)}

    bits, special = chain()
    lines = [
        f"CKKS, one thread, scale 2^40, chain {bits} + special {special}; medians of {args.reps} (ms)",
        "",
        "| op | ours N=8192 | SEAL N=8192 | ratio | ours N=16384 | SEAL N=16384 | ratio | target |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    report = {"chain": bits, "special": special, "reps": args.reps, "N": {}}
    for n in ("8192", "16384"):
        report["N"][n] = {"ours_ms": ours["N"][n]["ops_ms"], "seal_ms": seal[n], "bytes": ours["N"][n]["bytes"]}
    for op in OPS:
        row = [op]
        for n in ("8192", "16384"):
            o = ours["N"][n]["ops_ms"][op]
            sv = seal[n][op]
            row += [f"{o:.4f}", f"{sv:.4f}", f"{o / sv:.2f}"]
        row.append(f"≤ {TARGETS[op]}" + (" × SEAL rotate" if op == "rotate_hoisted_extra" else ""))
        lines.append("| " + " | ".join(row) + " |")
    lines.append(
        "| (py list↔vector, in SEAL encode/decode) | | "
        + f"{seal['8192']['py_list_overhead']:.4f} | | | {seal['16384']['py_list_overhead']:.4f} | | |"
    )
    md = "\n".join(lines) + "\n"
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(report, f, indent=2)
    with open(args.markdown or os.path.splitext(args.json)[0] + ".md", "w") as f:
        f.write(md)
    print(md)


if __name__ == "__main__":
    sys.exit(main())
