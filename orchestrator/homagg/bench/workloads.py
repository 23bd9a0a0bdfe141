"""Seeded gradient workloads for the benchmarks.

Every generator returns one float32 array of ``elements`` values for one
worker; the same (name, workers, elements, density, seed, worker) always
gives the same array, so a benchmark can regenerate a worker's gradient
inside its own process (the Gloo baseline does) instead of shipping it.

- ``shared``: the same non-zero positions on every worker (a fraction
  ``density`` of the elements), different values.
- ``random``: independent positions per worker; the union of the W
  patterns grows with W (1 - (1 - density)^W of the elements).
- ``zipf``: embedding-like.  The tensor is a table of rows of ROW_DIM
  elements; each worker touches density * rows distinct rows drawn with
  Zipf-distributed popularity (exponent ZIPF_S), and every element of a
  touched row is non-zero.  Popular rows are shared between workers, the
  tail is not.
- ``dense``: every element non-zero (density is ignored, reported as 1).

Values are normal with a per-row/element magnitude spread over several
decades, like real gradients.
"""

import numpy as np

WORKLOADS = ("shared", "random", "zipf", "dense")
# Other names accepted for a workload (``homagg demo`` used to say independent).
ALIASES = {"independent": "random"}
ROW_DIM = 64
ZIPF_S = 1.1


def _values(rng, count):
    """count non-zero float32 values with magnitudes over several decades."""
    v = rng.standard_normal(count) * np.exp2(rng.integers(-16, 4, count))
    v = v.astype(np.float32)
    v[v == 0] = np.float32(1e-3)  # keep the pattern: non-zero means non-zero
    return v


def _stable(name):
    """A seed component from a name that does not depend on PYTHONHASHSEED."""
    return int.from_bytes(name.encode()[:8].ljust(8, b"\0"), "little")


def effective_density(name, density):
    return 1.0 if name == "dense" else float(density)


def generate(name, workers, elements, density, seed, worker):
    """The gradient of one worker (float32 array of ``elements``)."""
    name = ALIASES.get(name, name)
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; one of {', '.join(WORKLOADS)}")
    if not 0 <= worker < workers:
        raise ValueError(f"worker {worker} outside 0..{workers - 1}")
    n = int(elements)
    density = effective_density(name, density)
    if not 0.0 <= density <= 1.0:
        raise ValueError(f"density {density} outside [0, 1]")
    tag = _stable(name)
    x = np.zeros(n, dtype=np.float32)
    vals = np.random.default_rng([seed, tag, 1, worker])
    if name == "dense":
        x[:] = _values(vals, n)
        return x
    if name == "shared":
        pos_rng = np.random.default_rng([seed, tag, 0])  # same for every worker
        k = int(round(density * n))
        pos = pos_rng.choice(n, size=k, replace=False)
    elif name == "random":
        pos_rng = np.random.default_rng([seed, tag, 2, worker])
        k = int(round(density * n))
        pos = pos_rng.choice(n, size=k, replace=False)
    else:  # zipf
        rows = max(1, n // ROW_DIM)
        want = min(rows, int(round(density * rows)))
        pos_rng = np.random.default_rng([seed, tag, 3, worker])
        # Row popularity ~ 1 / rank^s over a fixed (seeded) permutation of
        # the rows, identical on every worker.
        perm = np.random.default_rng([seed, tag, 4]).permutation(rows)
        p = 1.0 / np.arange(1, rows + 1, dtype=np.float64) ** ZIPF_S
        p /= p.sum()
        chosen = perm[pos_rng.choice(rows, size=want, replace=False, p=p)] if want else []
        chosen = np.asarray(chosen, dtype=np.int64)
        pos = (chosen[:, None] * ROW_DIM + np.arange(ROW_DIM)[None, :]).reshape(-1)
        pos = pos[pos < n]
    x[pos] = _values(vals, pos.size)
    return x


def generate_all(name, workers, elements, density, seed):
    return [generate(name, workers, elements, density, seed, w) for w in range(workers)]
