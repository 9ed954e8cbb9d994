"""What one device's MoE token dispatch puts on the wire: copies per token, bytes per element, and
the busiest device's share.

**Copies per token.** A plain all-to-all (Megatron-Core's ``alltoall`` dispatcher) sends one row
per (token, routed expert): ``top_k`` rows per token. A deduplicating dispatcher (DeepEP's normal
kernels, Megatron-Core ``--moe-token-dispatcher-type flex`` with the DeepEP or HybridEP backend)
sends one row per destination *rank* that holds at least one of the token's experts over the
scale-up fabric, and one row per destination *scale-up domain* over the scale-out network, where
the domain's entry GPU fans it out over NVLink (DeepEP README, "normal kernels": "forwarding from
NVLink domain to RDMA domain"; DeepSeek-V3 tech report, arXiv:2412.19437, sec. 3.2.2: "each token
... is first transmitted via IB to the GPUs with the same in-node index on its target nodes ...
then forwarded via NVLink"). The combine is the mirror image (partial outputs reduced per rank
and per domain before they travel back).

Expected number of units (ranks or domains) a token hits, under **uniform routing** (the token's
experts are a uniform random ``top_k``-subset; the assumption of a force-balanced benchmark) and
the contiguous expert layout (unit u of U holds experts [u E/U, (u+1) E/U)):

    no group limit:  P(unit hit) = 1 - C(E - E/U, k) / C(E, k)

With group-limited routing (DeepSeek-V3 sec. 2.1.2, "node-limited routing": a token first picks
``topk_group`` = M of ``n_group`` = G expert groups, then its k experts among those groups'
M E/G experts; HF ``n_group``/``topk_group``), taking the M groups as a uniform M-subset:

    G a multiple of U (a unit holds g = G/U whole groups; j of them selected, hypergeometric):
        P(unit hit) = sum_j P(j) (1 - C((M - j) E/G, k) / C(M E/G, k))
    U a multiple of G (a group spans U/G units):
        P(unit hit) = M/G (1 - C(M E/G - E/U, k) / C(M E/G, k))

(the two agree at U = G; e.g. DeepSeek-V3, E 256, k 8, G = U = 8 nodes, M 4: P = 0.4526, so a
token reaches 3.6 nodes on average and never more than 4). Groups that do not tile the units
either way fall back to the ungrouped formula.

**Bytes per element.** BF16: 2. An FP8 dispatch (DeepSeek-V3 sec. 3.3.2/3.3.3: activations
quantised to FP8 before the dispatch, the combine kept in BF16) sends 1 byte per element plus one
FP32 scale per 1 x 128 tile (DeepEP's FP8 dispatch takes ``(x_fp8, scales[T, H/128] float32)``;
sec. 3.3.2 fine-grained 1 x 128 activation tiles): 1 + 4/128 bytes.

**Busiest device.** With a per-expert load coefficient of variation ``c`` (std over mean of the
tokens each expert receives), a device holding ``m = E/ep`` experts carries the sum of m expert
loads; taking them independent, its load's CV is ``c / sqrt(m)``, and the busiest of ``n = ep``
devices sits about ``z_n`` standard deviations above the mean, ``z_n`` the expected maximum of n
standard normals (Blom's approximation ``Phi^-1((n - 0.375) / (n + 0.25))``; G. Blom,
"Statistical Estimates and Transformed Beta-Variables", 1958). So the imbalance is
``1 + z_n c / sqrt(m)``: one expert per device (m = 1) is the worst case, and it shrinks as more
experts share a device.
"""

from __future__ import annotations

from math import comb
from statistics import NormalDist

import numpy as np

from dayzero.errors import ConfigError

FP8_TILE = 128  # activation elements per FP32 scale (DeepSeek-V3 sec. 3.3.2: 1 x 128 tiles)
FP8_DISPATCH_BYTES = 1 + 4 / FP8_TILE  # per element: the FP8 value and its tile's FP32 scale
BF16_BYTES = 2
DISPATCHERS = ("dedup", "all_to_all")  # DeepEP/HybridEP-style (one row per rank/domain) | plain all-to-all


def check_dispatcher(name: str) -> str:
    if name not in DISPATCHERS:
        raise ConfigError("ep dispatcher", None, f"{name!r} is not a dispatcher; one of: {', '.join(DISPATCHERS)}")
    return name


def _miss(pool: int, excluded: int, k: int) -> float:
    """P(a uniform k-subset of ``pool`` items avoids ``excluded`` given items)."""
    return comb(pool - excluded, k) / comb(pool, k) if k <= pool else 0.0


def unit_hit_probability(experts: int, top_k: int, units: int, n_group: int = 1, topk_group: int = 1) -> float:
    """P(one given unit of ``units`` equal contiguous slices of the experts holds at least one
    of a token's ``top_k`` experts), uniform routing, group-limited when ``topk_group < n_group``
    (see the module docstring)."""
    E, k, U = int(experts), int(top_k), max(1, int(units))
    if U <= 1:
        return 1.0
    if E % U:
        raise ValueError(f"{E} experts do not split evenly over {U} units")
    G, M = int(n_group), int(topk_group)
    grouped = 1 < G and M < G and E % G == 0
    if grouped and G % U == 0:  # each unit holds g whole groups
        g, per_group = G // U, E // G
        pool = M * per_group
        total = 0.0
        for j in range(0, min(g, M) + 1):
            p_j = comb(g, j) * comb(G - g, M - j) / comb(G, M)
            total += p_j * (1.0 - _miss(pool, j * per_group, k)) if j else 0.0
        return total
    if grouped and U % G == 0:  # each group spans U/G units
        pool = M * (E // G)
        return M / G * (1.0 - _miss(pool, E // U, k))
    return 1.0 - _miss(E, E // U, k)


def expected_units_hit(experts: int, top_k: int, units: int, n_group: int = 1, topk_group: int = 1) -> float:
    """Expected number of distinct units (ranks or domains) a token's experts land on."""
    return max(1, int(units)) * unit_hit_probability(experts, top_k, units, n_group, topk_group)


def dedup_rows(experts: int, top_k: int, size, per_domain, domains, n_group: int = 1,
               topk_group: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Rows per token a deduplicating dispatcher moves, for EP groups of ``size`` members,
    ``per_domain`` of them in each of ``domains`` scale-up domains (arrays, one per candidate):
    (over the scale-up fabric: one per rank hit, the forwarding included; over the scale-out
    network: one per remote domain hit). The scale-up figure counts every rank hit; the
    collective's (n-1)/n then leaves out the rows that stay on their arrival GPU. Groups whose
    experts or domains do not split evenly get the plain all-to-all's rows."""
    size, per, doms = np.broadcast_arrays(*(np.asarray(x, dtype=np.int64) for x in (size, per_domain, domains)))
    code = (size.ravel() << 42) | (per.ravel() << 21) | doms.ravel()  # one int per placement (each < 2^21)
    keys, inverse = np.unique(code, return_inverse=True)
    k = float(min(top_k, experts))
    up_u, out_u = np.zeros(len(keys)), np.zeros(len(keys))
    for i, c in enumerate(keys.tolist()):  # a few distinct EP placements, however many candidates
        n, u, d = c >> 42, (c >> 21) & (2**21 - 1), c & (2**21 - 1)
        if n <= 1 or experts % n or u * d != n:  # uneven slices: no dedup credit (the plain all-to-all)
            up_u[i], out_u[i] = k * u / max(n, 1), k * (n - u) / max(n, 1) if d > 1 else 0.0
        else:
            up_u[i] = expected_units_hit(experts, top_k, n, n_group, topk_group)
            out_u[i] = (d - 1) * unit_hit_probability(experts, top_k, d, n_group, topk_group) if d > 1 else 0.0
    inverse = np.ravel(inverse)
    return up_u[inverse].reshape(size.shape), out_u[inverse].reshape(size.shape)


def expected_max_normal(n) -> np.ndarray:
    """Expected maximum of ``n`` independent standard normals (Blom 1958; 0 for n = 1)."""
    n = np.maximum(np.asarray(n, dtype=float), 1.0)
    inv = NormalDist().inv_cdf
    values, inverse = np.unique(n, return_inverse=True)
    z = np.array([inv((x - 0.375) / (x + 0.25)) if x > 1 else 0.0 for x in values.tolist()])
    return z[np.ravel(inverse)].reshape(n.shape)


def device_imbalance(expert_cv: float, experts: int, ep) -> np.ndarray:
    """Busiest device's routed tokens over the mean, ``1 + z_ep c / sqrt(E / ep)``, from the
    per-expert load CV ``c`` (see the module docstring); 1 for ep = 1."""
    ep = np.asarray(ep, dtype=float)
    per_device = np.maximum(experts / np.maximum(ep, 1.0), 1.0)
    return 1.0 + expected_max_normal(ep) * float(expert_cv) / np.sqrt(per_device)
