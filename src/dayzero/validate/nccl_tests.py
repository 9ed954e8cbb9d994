"""Import nccl-tests output (``all_reduce_perf``, ``all_gather_perf``, ``reduce_scatter_perf``,
``alltoall_perf``, ``sendrecv_perf``) into a hardware profile.

The tests print one row per message size: ``size count type redop root time algbw busbw
#wrong`` out-of-place, then the same in-place (releases before 2.10 have no ``root`` column).
``size`` is the whole buffer for all-gather, reduce-scatter and all-to-all and the message for
send/recv (nccl-tests doc/PERFORMANCE.md), the same convention as the planner's collectives, so
rows feed :func:`dayzero.validate.profile.fit_link` directly. The out-of-place time is used.

The collective is read from the banner (``# Collective test starting: all_reduce_perf``) or the
file name; the group size is the number of ``#  Rank`` lines; their host names tell a
single-node run (it calibrates the scale-up tier) from a multi-node one (the scale-out tier,
with the scale-up tier taken from the catalog or a previous profile).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from dayzero.errors import ConfigError
from dayzero.inputs import load_yaml, read_text

BINARIES = {"all_reduce": "all_reduce", "all_gather": "all_gather", "reduce_scatter": "reduce_scatter",
            "alltoall": "all_to_all", "sendrecv": "send_recv"}
RANK_LINE = re.compile(r"^#\s*Rank\s+(\d+)\s+Group\s+\d+\s+Pid\s+\d+\s+on\s+(\S+)\s+device\s+\d+\s+\[[^\]]*\]\s+(.*)$")


@dataclass
class NcclTestsRun:
    collective: str
    ranks: int
    hosts: tuple[str, ...]
    device: str
    rows: list[dict] = field(default_factory=list)  # {"collective", "group", "bytes", "seconds"}

    @property
    def per_host(self) -> int:
        return self.ranks // max(1, len(self.hosts))


def _collective(text: str, name: str) -> str | None:
    m = re.search(r"Collective test starting:\s*(\w+)", text)
    for source in ((m.group(1) if m else ""), name):
        for key, kind in BINARIES.items():
            if key in source.lower():
                return kind
    return None


def parse(text: str, name: str = "", collective: str | None = None) -> NcclTestsRun:
    """One nccl-tests output (``name``: its file name, used to find the collective)."""
    kind = collective or _collective(text, name)
    if kind is None:
        raise ConfigError(name or "nccl-tests output", None, "cannot tell which test this is; name the file after "
                          "the binary (all_reduce_perf.txt, ...) or pass the collective explicitly")
    ranks, hosts, device = 0, [], ""
    rows = []
    for line in text.splitlines():
        m = RANK_LINE.match(line.strip())
        if m:
            ranks += 1
            if m.group(2) not in hosts:
                hosts.append(m.group(2))
            device = device or m.group(3).strip()
            continue
        tok = line.split()
        if len(tok) < 9 or line.lstrip().startswith("#") or not tok[0].isdigit() or not tok[1].isdigit():
            continue
        rest = tok[3:]
        # new format: redop root time algbw busbw #wrong ...; old: redop time algbw busbw error ...
        time_index = 2 if len(rest) >= 10 else 1
        try:
            seconds = float(rest[time_index]) * 1e-6
        except ValueError:
            continue
        size = int(tok[0])
        if size > 0 and seconds > 0:
            rows.append({"collective": kind, "bytes": size, "seconds": seconds})
    if not ranks:
        raise ConfigError(name or "nccl-tests output", None, "no '#  Rank N Group G Pid P on HOST device D' lines; "
                          "pass the complete output of the test")
    if not rows:
        raise ConfigError(name or "nccl-tests output", None, "no result rows (size count type ... time algbw busbw)")
    group = 2 if kind == "send_recv" else ranks
    for r in rows:
        r["group"] = group
    return NcclTestsRun(kind, ranks, tuple(hosts), device, rows)


def import_runs(paths: list[str | Path], accelerator: str | None = None, base: str | None = None,
                name: str | None = None) -> dict:
    """A profile (cluster YAML mapping) from nccl-tests outputs of one machine.

    ``accelerator``: catalog name (default: from the device name the tests print);
    ``base``: a cluster YAML or preset whose other fields the profile keeps (e.g. a previous
    ``dayzero calibrate`` profile; multi-node runs take its scale-up tier)."""

    from dayzero.planner.perf.calibration import constants_for, rates
    from dayzero.specs.cluster import get_cluster
    from dayzero.specs.hardware import get_accelerator, resolve_accelerator
    from dayzero.validate.profile import fit_link

    runs = []
    for p in paths:
        p = Path(p)
        runs.append(parse(read_text(p, "nccl-tests output"), p.name))
    hosts = {h for r in runs for h in r.hosts}
    per_host = {r.per_host for r in runs if r.collective != "send_recv"} or {runs[0].per_host}
    if len(per_host) > 1:
        raise ConfigError("nccl-tests", None, f"runs use different ranks per host ({sorted(per_host)}); import one "
                          "layout at a time")
    dpn = per_host.pop()
    acc = get_accelerator(accelerator) if accelerator else resolve_accelerator(runs[0].device)
    if acc is None:
        raise ConfigError("nccl-tests", None, f"cannot map device {runs[0].device!r} to the catalog; pass "
                                              "--accelerator")
    rows = [row for r in runs for row in r.rows]
    if base:
        cluster = get_cluster(base)
        prof = load_yaml(base) if Path(base).exists() else {"accelerator": acc.id}
    else:
        cluster, prof = None, {"accelerator": acc.id}
    prof = dict(prof)
    prof["name"] = name or prof.get("name") or f"{acc.id}-nccl-tests"
    prof["nodes"] = max(1, len(hosts))
    prof["devices_per_node"] = dpn
    eff = dict(prof.get("efficiency") or {})
    if len(hosts) <= 1:
        fit = fit_link(rows)
        prof.update(intra_node_gbytes_per_s=round(fit.bw / 1e9, 3), intra_node_p2p_gbytes_per_s=round(fit.p2p_bw / 1e9,
                                                                                                      3),
                    intra_latency_us=round(fit.alpha * 1e6, 3))
        eff["intra"] = 1.0
        tier = "scale-up"
    else:
        from dayzero.specs.cluster import build_cluster

        ref = cluster or build_cluster(acc, len(hosts) * dpn, dpn,
                                       inter_node_gbytes_per_s=acc.inter_node_bw and acc.inter_node_bw / 1e9)
        intra = rates(ref, constants_for(ref)).intra
        fit = fit_link(rows, per_domain=dpn, intra=intra)
        prof.update(inter_node_gbytes_per_s=round(fit.bw / 1e9, 3), inter_latency_us=round(fit.alpha * 1e6, 3))
        eff["inter"] = 1.0
        tier = "scale-out"
    prof["efficiency"] = eff
    meas = dict(prof.get("measurements") or {})
    meas["nccl_tests"] = {"tier": tier, "hosts": sorted(hosts), "device": runs[0].device,
                          "fit": {"bw_gbytes_per_s": fit.bw / 1e9, "p2p_gbytes_per_s": fit.p2p_bw / 1e9,
                                  "alpha_us": fit.alpha * 1e6, "mape": fit.mape},
                          "rows": rows}
    prof["measurements"] = meas
    return prof
