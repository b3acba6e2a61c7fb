#!/usr/bin/python3
"""The expected values of tests/orchestrator/stats/stats_cases.json, recomputed with SciPy.

stats_test.cc checks ablate's statistics (orchestrator/stats/stats.h) against that file; this
checks the file against SciPy, so both sides agree with an implementation ablate does not share.
Two cases are also published worked examples: R's `t.test(extra ~ group, data = sleep)`, paired
and Welch (Student's sleep data), whose printed t, df, p and interval this checks too.

  stats_scipy_test.py --cases FILE            check (exit 1 on a mismatch)
  stats_scipy_test.py --cases FILE --write    recompute the expected values into FILE
"""
import argparse
import json
import math
import sys
import warnings

from scipy import stats

# A sample without spread (one case has one) makes SciPy warn of cancellation; its answer stands.
warnings.filterwarnings("ignore", message="Precision loss")

# R 4.x, ?sleep: t.test(extra ~ group, data = sleep, paired = TRUE) and the default (Welch).
R_SLEEP = {
    "sleep paired (R)": {"t": -4.0621, "df": 9, "p": 0.002833, "ci": (-2.4598858, -0.7001142)},
    "sleep Welch (R)": {"t": -1.8608, "df": 17.776, "p": 0.07939, "ci": (-3.3654832, 0.2054832)},
}


def difference_test(kind, variant, reference, alpha):
    if kind == "paired":
        d = [v - r for v, r in zip(variant, reference)]
        n = len(d)
        mean = sum(d) / n
        se = stats.tstd(d) / math.sqrt(n)
        df = n - 1
        p = stats.ttest_rel(variant, reference).pvalue
    else:
        nv, nr = len(variant), len(reference)
        qv, qr = stats.tvar(variant) / nv, stats.tvar(reference) / nr
        se = math.sqrt(qv + qr)
        df = (qv + qr) ** 2 / (qv ** 2 / (nv - 1) + qr ** 2 / (nr - 1))
        mean = sum(variant) / nv - sum(reference) / nr
        p = stats.ttest_ind(variant, reference, equal_var=False).pvalue
    critical = stats.t.ppf(1 - alpha / 2, df)
    return {
        "delta": mean,
        "df": df,
        "ci_low": mean - critical * se,
        "ci_high": mean + critical * se,
        "p_value": p,
        "min_detectable": (critical + stats.t.ppf(0.8, df)) * se,
    }


def holm(p_values):
    """Holm (1979), written out: the k-th smallest of m times (m - k), running maximum, capped."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    adjusted = [0.0] * len(p_values)
    running = 0.0
    for k, i in enumerate(order):
        running = max(running, min(1.0, (len(p_values) - k) * p_values[i]))
        adjusted[i] = running
    return adjusted


def expected(cases):
    out = {"tests": [], "holm": [], "t": []}
    for case in cases["tests"]:
        c = dict(case)
        c["expected"] = difference_test(c["kind"], c["variant"], c["reference"], c["alpha"])
        out["tests"].append(c)
    for case in cases["holm"]:
        c = dict(case)
        c["expected"] = holm(c["p"])
        out["holm"].append(c)
    for case in cases["t"]:
        c = dict(case)
        c["cdf"] = stats.t.cdf(c["x"], c["df"])
        c["quantile"] = stats.t.ppf(c["p"], c["df"])
        out["t"].append(c)
    return out


def close(a, b, rel=1e-9, abs_=1e-12):
    return math.isclose(a, b, rel_tol=rel, abs_tol=abs_)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", required=True)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    with open(args.cases) as f:
        cases = json.load(f)
    computed = expected(cases)
    if args.write:
        with open(args.cases, "w") as f:
            json.dump(computed, f, indent=2)
            f.write("\n")
        return 0
    failures = []
    for have, want in zip(cases["tests"], computed["tests"]):
        for key, value in want["expected"].items():
            if not close(have["expected"][key], value):
                failures.append(f"{have['name']}: {key} is {have['expected'][key]}, SciPy {value}")
        published = R_SLEEP.get(have["name"])
        if published:
            e = have["expected"]
            t = e["delta"] / ((e["ci_high"] - e["delta"]) / stats.t.ppf(1 - have["alpha"] / 2, e["df"]))
            checks = [("t", t, published["t"], 1e-4), ("df", e["df"], published["df"], 1e-3),
                      ("p", e["p_value"], published["p"], 1e-3),
                      ("ci_low", e["ci_low"], published["ci"][0], 1e-6),
                      ("ci_high", e["ci_high"], published["ci"][1], 1e-6)]
            for key, value, printed, tol in checks:
                if not math.isclose(value, printed, rel_tol=tol):
                    failures.append(f"{have['name']}: {key} {value} is not R's {printed}")
    for have, want in zip(cases["holm"], computed["holm"]):
        for i, (a, b) in enumerate(zip(have["expected"], want["expected"])):
            if not close(a, b):
                failures.append(f"holm {have['p']}: [{i}] is {a}, expected {b}")
    for have, want in zip(cases["t"], computed["t"]):
        for key in ("cdf", "quantile"):
            if not close(have[key], want[key]):
                failures.append(f"t df={have['df']}: {key} is {have[key]}, SciPy {want[key]}")
    for f in failures:
        print("FAIL", f)
    print(f"{len(cases['tests'])} tests, {len(cases['holm'])} Holm families, "
          f"{len(cases['t'])} t points: {len(failures)} mismatches")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
