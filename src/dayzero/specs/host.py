"""The host side of a device: its share of host memory, its link to host memory, and its share of
host DRAM bandwidth. Offloading prices them (planner.memory.offload: the optimizer on the host;
planner.memory.activation_offload: the saved activations' copies) and the search caps what an
offloading layout keeps on the host at the device's share (planner.search.search_fit).

The figures belong to a system, not a card: a DGX H100 has 2 TB and a PCIe Gen5 x16 link per
GPU, an Atlas 800T A2 four Kunpeng 920 and PCIe 4.0 x16 per NPU, a GB200 superchip one Grace for
two GPUs over NVLink-C2C. The shipped ``presets/data/host_systems.json`` states them per system
(each entry with its sources), for the accelerators it names; a cluster file overrides any of them
(``host:`` in :mod:`dayzero.specs.cluster`). A figure no document states is the DGX H100's
(:data:`FALLBACK`), named in :attr:`HostSpec.assumed` so that plan and predict say so.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from functools import lru_cache

from dayzero.errors import ConfigError
from dayzero.specs.presets import reference_data

# Per direction, PCIe x16 with 128b/130b encoding (PCI-SIG, PCI Express Base Specification 4.0 and
# 5.0: 16 and 32 GT/s per lane): Gen5 32 GT/s x 16 lanes x 128/130 / 8 = 63.0 GB/s, Gen4 31.5 GB/s.
# NVIDIA's H100 datasheet lists "PCIe Gen5: 128GB/s" (both directions).
PCIE_GEN5_X16_BW = 32e9 * 16 * 128 / 130 / 8
PCIE_GEN4_X16_BW = 16e9 * 16 * 128 / 130 / 8
HOST_LINKS = {"PCIe Gen5 x16": PCIE_GEN5_X16_BW, "PCIe Gen4 x16": PCIE_GEN4_X16_BW}
DRAM_BYTES_PER_TRANSFER = 8  # one 64-bit DDR4/DDR5 channel (JEDEC): MT/s x 8 B
# One device's share of host memory bandwidth on a DGX H100 (DGX H100 user guide: 2 x Intel Xeon
# Platinum 8480C, 8 GPUs; Intel: 8 DDR5-4800 channels per socket, 8 x 4800 MT/s x 8 B = 307.2 GB/s):
# 2 x 307.2 / 8 = 76.8 GB/s, the theoretical peak (CPU Adam reaches a fraction of it).
HOST_MEMORY_BW_PER_DEVICE = 2 * 8 * 4800e6 * DRAM_BYTES_PER_TRANSFER / 8
# One device's share of host memory on a DGX H100 (DGX H100 user guide, hardware overview: 2 TB
# system memory, 8 GPUs): 250 GB.
HOST_MEMORY_PER_DEVICE = 2e12 / 8
FIELDS = {"memory_bytes": "host memory", "link_bw": "host link", "memory_bw": "host DRAM bandwidth"}


@dataclass(frozen=True)
class HostSpec:
    """One device's share of its host. ``assumed``: the fields (:data:`FIELDS`) no document or
    cluster file gave, taken from :data:`FALLBACK` (the DGX H100's)."""

    memory_bytes: float  # host memory per device: the node's over the devices that share it
    link_bw: float  # bytes/s per direction between the device and host memory (PCIe x16, NVLink-C2C share)
    memory_bw: float  # bytes/s of host DRAM bandwidth per device (the host Adam's rate)
    system: str = ""  # the documented system the figures are from
    assumed: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()
    given: tuple[str, ...] = ()  # the fields a cluster file set (specs.cluster, host:)

    def assumption(self) -> str | None:
        """One line naming the figures taken from the DGX H100's, or None where none is."""
        if not self.assumed:
            return None
        what = ", ".join(f"{FIELDS[f]} {_text(f, getattr(self, f))}" for f in self.assumed)
        where = f"{self.system} documents no such figure" if self.system else "no host is documented for this card"
        return (f"host side assumed as a DGX H100's: {what} per device ({where}; set host: in a cluster file, "
                "docs/specs.md)")

    def memory_text(self) -> str:
        """The device's share of host memory in words: whose it is, or that it is assumed."""
        if "memory_bytes" in self.assumed:
            return (f"{self.memory_bytes / 1e9:.3g} GB per device assumed (a DGX H100's 2 TB for 8 GPUs; set "
                    "host.memory_gb in a cluster file)")
        whose = "the cluster file's" if "memory_bytes" in self.given else self.system
        return f"{self.memory_bytes / 1e9:.3g} GB per device of host memory ({whose})"

    def to_dict(self) -> dict:
        return {"memory_gb_per_device": self.memory_bytes / 1e9, "link_gbytes_per_s": self.link_bw / 1e9,
                "memory_gbytes_per_s": self.memory_bw / 1e9, "system": self.system, "assumed": list(self.assumed),
                "from_cluster_file": list(self.given), "sources": list(self.sources)}


def _text(name: str, value: float) -> str:
    return f"{value / 1e9:.3g} GB" if name == "memory_bytes" else f"{value / 1e9:.3g} GB/s"


FALLBACK = HostSpec(memory_bytes=HOST_MEMORY_PER_DEVICE, link_bw=PCIE_GEN5_X16_BW,
                    memory_bw=HOST_MEMORY_BW_PER_DEVICE, system="", assumed=tuple(FIELDS))


def _from_entry(e: dict) -> HostSpec:
    """A system entry of host_systems.json as one device's share; the fields it lacks from FALLBACK."""
    devices = e.get("devices")
    got, assumed = {}, []
    if "host_memory_gb" in e:
        got["memory_bytes"] = e["host_memory_gb"] * 1e9 / devices
    if "host_link" in e:
        got["link_bw"] = HOST_LINKS[e["host_link"]]
    elif "host_link_gbytes_per_s" in e:
        got["link_bw"] = e["host_link_gbytes_per_s"] * 1e9
    if "host_dram" in e:
        d = e["host_dram"]
        got["memory_bw"] = (d["sockets"] * d["channels_per_socket"] * d["mega_transfers_per_s"] * 1e6
                            * DRAM_BYTES_PER_TRANSFER / devices)
    elif "host_dram_gbytes_per_s" in e:
        got["memory_bw"] = e["host_dram_gbytes_per_s"] * 1e9 / devices
    assumed = tuple(f for f in FIELDS if f not in got)
    return replace(FALLBACK, **got, system=e["system"], assumed=assumed, sources=tuple(e.get("sources", ())))


@lru_cache(maxsize=1)
def host_systems() -> dict[str, HostSpec]:
    """Accelerator id -> the host of the system the shipped data documents for it."""
    entries = json.loads(reference_data("host_systems.json").read_text())
    return {acc: _from_entry(e) for e in entries for acc in e["accelerators"]}


def default_host(accelerator_id: str) -> HostSpec:
    """The documented host of ``accelerator_id``'s system, else :data:`FALLBACK` (every field assumed).
    The figures are per device, so they hold for any ``devices_per_node`` a cluster groups the cards in."""
    return host_systems().get(accelerator_id, FALLBACK)


def with_overrides(host: HostSpec, source: str, devices_per_node: int, memory_gb: float | None = None,
                   memory_gb_per_node: float | None = None, link_gbytes_per_s: float | None = None,
                   memory_gbytes_per_s: float | None = None) -> HostSpec:
    """``host`` with a cluster file's ``host:`` figures (GB, GB/s; decimal), which are no longer assumed;
    ``memory_gb_per_node`` is shared by the node's ``devices_per_node`` devices."""
    if memory_gb is not None and memory_gb_per_node is not None:
        raise ConfigError(source, "host", f"give memory_gb (per device, {memory_gb:g}) or memory_gb_per_node "
                          f"({memory_gb_per_node:g}), not both")
    if memory_gb_per_node is not None:
        memory_gb = memory_gb_per_node / devices_per_node
    got = {k: v * 1e9 for k, v in (("memory_bytes", memory_gb), ("link_bw", link_gbytes_per_s),
                                   ("memory_bw", memory_gbytes_per_s)) if v is not None}
    if not got:
        return host
    return replace(host, **got, assumed=tuple(f for f in host.assumed if f not in got),
                   given=tuple(f for f in FIELDS if f in got))


@dataclass(frozen=True)
class SystemPower:
    """A documented system's maximum power, per device (the devices' own share included), with
    the document that states it."""

    watts_per_device: float
    system: str
    source: str


@lru_cache(maxsize=1)
def _system_powers() -> dict[str, SystemPower]:
    out = {}
    for e in json.loads(reference_data("host_systems.json").read_text()):
        if "system_power_w_max" in e and e.get("devices"):
            src = next((s for s in e.get("sources", ()) if "power" in s.lower()), e["system"])
            for acc in e["accelerators"]:
                out[acc] = SystemPower(e["system_power_w_max"] / e["devices"], e["system"], src)
    return out


def system_power(accelerator_id: str) -> SystemPower | None:
    """The maximum power per device of the system host_systems.json documents for a card, or None."""
    return _system_powers().get(accelerator_id)
