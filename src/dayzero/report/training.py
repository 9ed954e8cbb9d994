"""The time, energy and cost of training (a ``training`` object of
:mod:`dayzero.planner.training_cost`) as labelled lines: what ``predict``, ``plan`` and the Day-0
report show, in one place."""

from __future__ import annotations

from dayzero.units import figure


def count_text(n: float) -> str:
    """1.5e13 -> '15T', 3e11 -> '300B', 2.5e6 -> '2.5M' (the form ``--tokens`` accepts)."""
    for div, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= div:
            return f"{n / div:.4g}{suffix}"
    return f"{n:.4g}"


def _duration(s: float) -> str:
    return f"{s / 60:.0f} min" if s < 7200 else f"{s / 3600:.1f} h"


def training_rows(tr: dict) -> list[tuple[str, str]]:
    """(label, value) rows of a ``training`` object."""
    f, e = tr["failures"], tr["energy"]
    rows = [("tokens", f"{count_text(tr['tokens'])} in {tr['steps']:,} steps"),
            ("wall time", f"{tr['wall_days']:,.1f} days ({tr['ideal_days']:,.1f} at 100 % goodput)"),
            ("device-hours", f"{tr['device_hours']:,.0f}")]
    if e:
        tpj = e["tokens_per_joule"]
        rows += [("energy", f"{figure(e['mwh'])} MWh at the facility (PUE {e['pue']:g}); {figure(e['node_mwh'])} MWh "
                            f"at the nodes, {figure(e['device_mwh'])} MWh at the devices"),
                 ("power", f"{figure(e['cluster_mw'])} MW: {e['device_w']:.0f} W device + {e['host_w']:.0f} W host + "
                           f"{e['network_w']:.0f} W network per device, x PUE {e['pue']:g}"),
                 ("tokens per joule", f"{tpj.get('facility', 0):.3g} facility, {tpj.get('device', 0):.3g} device"),
                 ("TFLOP/s per W", f"{e['model_tflops_per_w']:.3f} (device)")]
    else:
        rows.append(("energy", "no TDP in the catalog for this accelerator"))
    c = tr["cost"]
    if c:
        parts = []
        if "devices_total" in c:
            parts.append(f"{c['devices_total']:,.0f} for devices at {c['price_per_device_hour']:g} per device-hour "
                         f"({c['price_source']})")
        if "energy_total" in c:
            parts.append(f"{c['energy_total']:,.0f} for energy at {c['electricity_per_kwh']:g} per kWh")
        rows.append(("cost", f"{c['total']:,.0f}: " + "; ".join(parts)))
        for o in c.get("other_offers", ()):  # the card's other public offers (device_prices.json)
            rows.append((f"cost, {o['offer']}", f"{o['devices_total']:,.0f} for devices at "
                                                 f"{o['price_per_device_hour']:.4g} per device-hour ({o['source']})"))
    else:
        rows.append(("cost", "no public price for this card: give --price-per-device-hour"))
    rows += [("goodput", f"{tr['goodput']:.1%} ({figure(f['interruptions_per_day'])} interruptions a day, a restart "
                         f"{_duration(f['restart_s'])})"),
             ("checkpoint", f"every {f['optimal_checkpoint_interval_steps']:,} steps "
                            f"({_duration(f['optimal_checkpoint_interval_s'])}), a save blocks "
                            f"{f['checkpoint_s']:.0f} s: {f.get('interval_reason', '')}")]
    return rows
