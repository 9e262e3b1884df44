"""Merge per-adapter acceptance.py outputs (one process per adapter) into one JSON.

    python3 tools/train_adapter/merge_acceptance.py OUT IN1 IN2 ...

The inputs must share the same "setting" and base model; adapters are merged by name.
"""

import json
import sys

out, ins = sys.argv[1], sys.argv[2:]
docs = [json.load(open(p)) for p in ins]
merged = {k: v for k, v in docs[0].items() if k not in ("adapters", "wall_seconds")}
merged["adapters"] = {}
merged["wall_seconds_per_run"] = {}
for d in docs:
    assert d["setting"] == docs[0]["setting"] and d["base_model"] == docs[0]["base_model"], "settings differ"
    merged["adapters"].update(d["adapters"])
    for name in d["adapters"]:
        merged["wall_seconds_per_run"][name] = d["wall_seconds"]
with open(out, "w") as f:
    f.write(json.dumps(merged, indent=2) + "\n")
print(f"wrote {out}: {', '.join(merged['adapters'])}")
