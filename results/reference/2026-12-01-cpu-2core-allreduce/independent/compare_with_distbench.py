"""distbench's mpi4py times against the median of three runs of independent_mpi4py.py, per size."""

import sys

import pandas as pd

ref = pd.read_csv(sys.argv[1])
runs = [pd.read_csv(p).set_index("size_bytes")["time_mean_s"] for p in sys.argv[2:]]
ind = pd.concat(runs, axis=1)
d = pd.DataFrame(
    {
        "size_bytes": ref.size_bytes,
        "distbench_s": ref.time_mean_s.values,
        "independent_median_s": ind.median(axis=1).reindex(ref.size_bytes).values,
        "independent_min_s": ind.min(axis=1).reindex(ref.size_bytes).values,
        "independent_max_s": ind.max(axis=1).reindex(ref.size_bytes).values,
    }
)
d["diff_pct"] = (d.distbench_s / d.independent_median_s - 1) * 100
d["in_independent_range"] = (d.distbench_s >= d.independent_min_s * 0.95) & (
    d.distbench_s <= d.independent_max_s * 1.05
)
print(d.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
a = d.diff_pct.abs()
print(
    f"\nwithin 5 % of the independent median: {(a <= 5).sum()} of {len(d)} sizes; median |diff| {a.median():.1f} %, "
    f"max |diff| {a.max():.1f} % (at {d.size_bytes[a.idxmax()]} B)"
)
spread = (ind.max(axis=1) / ind.min(axis=1) - 1) * 100
print(
    f"the independent loop's own spread over its 3 runs (max/min - 1): median {spread.median():.1f} %, "
    f"max {spread.max():.1f} %"
)
