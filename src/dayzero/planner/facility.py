"""The power a training run draws at the device, the node and the facility.

Three levels, each a sum of watts per device:

* **device**: the accelerator at ``power_fraction`` of its TDP. No published utilisation-power
  curve is shipped, so the device runs at its TDP (the convention of published training-energy
  reports: Llama 2, Table 2, "peak power capacity per GPU device"), and the output says so.
* **node** = device + the host's share: a documented system's maximum power less its devices'
  TDPs, per device (DGX H100: 10.2 kW max - 8 x 700 W = 4.6 kW for CPUs, memory, NICs, NVSwitches,
  fans and power-supply losses, 575 W per GPU; specs/host.py ``system_power``). A card whose
  system documents no power takes the DGX H100's host share, and the output says so.
* **IT** = node + the scale-out network's switches per device: a non-blocking folded Clos of
  ``k``-port switches over ``N`` endpoints (one NIC per device) has ``L`` levels, the fewest with
  ``2 (k/2)^L >= N``, and ``(2L - 1) N / k`` switches (each level below the top ``2N/k``, the top
  ``N/k``; Al-Fares et al. 2008, "A Scalable, Commodity Data Center Network Architecture", sec.
  3.2, for three levels). A single node has none.
* **facility** = IT x PUE (default: the survey average of ``facility.json``).

Every figure comes from ``presets/data/facility.json`` or ``host_systems.json`` with its source;
:class:`PowerOptions` overrides each.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache

from dayzero.errors import ConfigError
from dayzero.specs.host import system_power
from dayzero.specs.presets import reference_data

FALLBACK_SYSTEM = "nvidia_h100_sxm"  # the host share assumed where a card's system documents no power


@lru_cache(maxsize=1)
def facility_data() -> dict:
    """``presets/data/facility.json``: PUE, switch and failure figures with their sources."""
    return json.loads(reference_data("facility.json").read_text())


def default_pue() -> float:
    return float(facility_data()["pue"]["value"])


@dataclass(frozen=True)
class PowerOptions:
    """Overrides of the facility's figures (None: the shipped default with its source)."""

    power_fraction: float = 1.0  # of TDP
    pue: float | None = None
    host_w_per_device: float | None = None
    host_overhead: float | None = None  # host power as a fraction of device power (replaces the system's share)
    switch_w_per_device: float | None = None

    def __post_init__(self):
        for name in ("power_fraction", "pue", "host_w_per_device", "host_overhead", "switch_w_per_device"):
            v = getattr(self, name)
            if v is None:
                continue
            lo = 1.0 if name == "pue" else 0.0
            if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= lo
                    and (name != "power_fraction" or 0 < v <= 1.5)):
                bound = "in (0, 1.5]" if name == "power_fraction" else f">= {lo:g}"
                raise ConfigError("facility power", name, f"expected a finite number {bound}, got {v!r}")


@dataclass(frozen=True)
class FacilityPower:
    """Watts per device at each level, and where each figure came from."""

    device_w: float
    host_w: float
    network_w: float
    pue: float
    basis: tuple[str, ...]  # one line per figure: its source or what was assumed

    @property
    def node_w(self) -> float:
        return self.device_w + self.host_w

    @property
    def it_w(self) -> float:
        return self.node_w + self.network_w

    @property
    def facility_w(self) -> float:
        return self.it_w * self.pue


def clos_switches(endpoints: int, ports: int) -> int:
    """Switches of a non-blocking folded Clos (fat tree) of ``ports``-port switches over
    ``endpoints`` NICs: ``L`` levels, the fewest with ``2 (k/2)^L >= N``; ``2N/k`` per level below
    the top and ``N/k`` at the top, each rounded up. One endpoint needs none."""
    if endpoints <= 1:
        return 0
    if ports < 2:
        raise ConfigError("facility power", "switch ports", f"expected at least 2, got {ports}")
    half = ports // 2
    levels = 1
    while 2 * half ** levels < endpoints:
        levels += 1
    if levels == 1:
        return 1
    return (levels - 1) * math.ceil(2 * endpoints / ports) + math.ceil(endpoints / ports)


def facility_power(cluster, options: PowerOptions = PowerOptions()) -> FacilityPower | None:
    """The run's power per device at device, node, IT and facility level; None where the catalog
    has no TDP for the card (nothing to start from)."""
    acc = cluster.accelerator
    if not acc.tdp_w:
        return None
    o, data = options, facility_data()
    basis = []
    device_w = acc.tdp_w * o.power_fraction
    basis.append(f"device {device_w:.0f} W: {o.power_fraction:.0%} of the {acc.tdp_w:.0f} W TDP (no published "
                 "utilisation-power curve shipped for this card)")
    if o.host_w_per_device is not None:
        host_w = o.host_w_per_device
        basis.append(f"host {host_w:.0f} W per device (given)")
    elif o.host_overhead is not None:
        host_w = device_w * o.host_overhead
        basis.append(f"host {host_w:.0f} W per device: {o.host_overhead:.0%} of device power (given)")
    else:
        sp = system_power(acc.id)
        if sp is not None:
            host_w = max(0.0, sp.watts_per_device - acc.tdp_w)
            basis.append(f"host {host_w:.0f} W per device: {sp.system} maximum power less its devices' TDP "
                         f"({sp.source})")
        else:
            ref = system_power(FALLBACK_SYSTEM)
            from dayzero.specs.hardware import get_accelerator

            host_w = max(0.0, ref.watts_per_device - get_accelerator(FALLBACK_SYSTEM).tdp_w)
            basis.append(f"host {host_w:.0f} W per device assumed: a {ref.system}'s host share (no system power "
                         f"documented for {acc.name}; --host-w to set it)")
    sw = data["switch"]
    if o.switch_w_per_device is not None:
        network_w = o.switch_w_per_device
        basis.append(f"network {network_w:.0f} W per device (given)")
    else:
        n = cluster.devices if cluster.nodes > 1 else 1
        count = clos_switches(n, sw["ports"])
        network_w = count * sw["power_w"] / cluster.devices
        basis.append(f"network {network_w:.0f} W per device: {count:,} x {sw['power_w']:,} W switches, a "
                     f"non-blocking fat tree of {sw['ports']}-port {sw['name']} over {n:,} NICs ({sw['source']})"
                     if count else "network: one node, no scale-out switches")
    pue = o.pue if o.pue is not None else default_pue()
    basis.append(f"PUE {pue:g}" + (" (given)" if o.pue is not None else f": {data['pue']['source']}"))
    return FacilityPower(device_w=device_w, host_w=host_w, network_w=network_w, pue=pue, basis=tuple(basis))
