"""Recompute the ε of the DP benchmark runs in docs/results/privacy.md under both neighbouring
relations, from the rounds each run made (no training: only the accounting changed).

The runs were calibrated under add/remove (σ for a target ε over the planned rounds), so the
σ of each is that calibration; its ε under replace-one is the same uploads accounted with
sensitivity 2·clip. UMLS rows are held by all three clients, so under distributed noise a
client's own share is σ/√3 (``epsilon_deviating_server``).

    python scripts/tools/dp_epsilon_table.py
"""

from __future__ import annotations

import json
import math

from lightning_fedkg.measure import repo_root
from lightning_fedkg.privacy.mechanisms import accounting as dplib

DOCS = repo_root(__file__) / "docs" / "results" / "privacy"
DELTA = 1e-5
UMLS = {"fede_dp1024": 1024, "fede_dp256": 256, "fede_dp16": 16, "fede_dp4": 4, "fede_dp1": 1,
        "fede_secure_dp16": 16}


def eps(sigma: float, uploads: int, neighbours: str) -> float:
    return dplib.epsilon([(1.0, sigma)] * uploads, DELTA, "rdp", neighbours)


def umls_rows() -> list[dict]:
    variants = {}
    for name in ("umls_audit.json", "umls_audit_dp_large.json"):
        variants.update(json.loads((DOCS / name).read_text())["variants"])
    out = []
    for variant, target in UMLS.items():
        sigma = dplib.calibrate_noise_multiplier(target, DELTA, 1.0, 100)
        runs = variants[variant]["runs"]
        row = {"variant": variant, "target": target, "sigma": round(sigma, 3),
               "rounds": [r["rounds"] for r in runs],
               "reported": sum(r["epsilon"] for r in runs) / len(runs),
               "add_remove": sum(eps(sigma, r["rounds"], "add_remove") for r in runs) / len(runs),
               "replace": sum(eps(sigma, r["rounds"], "replace") for r in runs) / len(runs)}
        if "secure" in variant:
            row["replace_deviating_server"] = sum(eps(sigma / math.sqrt(3), r["rounds"], "replace")
                                                  for r in runs) / len(runs)
        out.append(row)
    return out


def fb_rows() -> list[dict]:
    out = []
    for target in (16, 4, 1):
        sigma = dplib.calibrate_noise_multiplier(target, DELTA, 1.0, 3)
        out.append({"target": target, "sigma": round(sigma, 3), "add_remove": eps(sigma, 3, "add_remove"),
                    "replace": eps(sigma, 3, "replace")})
    return out


if __name__ == "__main__":
    for row in umls_rows() + fb_rows():
        print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()}))
