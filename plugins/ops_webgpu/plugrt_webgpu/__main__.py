"""`python -m plugrt_webgpu [--json]`: the WebGPU engines plugrt finds, and each one's adapters.

Listing adapters loads each engine's native library and the Vulkan/OpenGL drivers,
which `plugrt devices` must not do for every backend it shows (a probe is cheap and
changes nothing). This command is the deliberate, slower look; `plugrt devices`
points here.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from plugrt_webgpu.install import engine_hint


def engines() -> list[dict[str, Any]]:
  """One entry per WEBGPU interface the registry knows: its probe, and its adapters when it can list them."""
  from plugrt.registry import current
  reg = current().load()
  out = []
  for spec, rec in reg.interfaces.get("WEBGPU", []):
    p = reg.interface_probe(spec)
    row: dict[str, Any] = {"engine": spec.name, "package": rec.package, "ok": p.ok, "auto": spec.auto, "detail": p.detail, "hint": p.hint,
                           "adapters": [], "error": ""}
    lister = getattr(rec.module, "adapters", None)
    if p.ok and lister is not None:
      try:
        row["adapters"] = [{"name": a.name, "kind": a.kind, "backend": a.backend, "vendor": a.vendor, "driver": a.driver,
                            "features": list(a.features)} for a in lister()]
      except Exception as e:  # a broken driver must not hide the other engine
        row["error"] = f"{type(e).__name__}: {e}"
    out.append(row)
  return out


def main(argv: Sequence[str] | None = None) -> int:
  ap = argparse.ArgumentParser(prog="python -m plugrt_webgpu", description="WebGPU engines and their adapters")
  ap.add_argument("--json", action="store_true", help="machine-readable output")
  args = ap.parse_args(argv)
  rows = engines()
  if args.json:
    print(json.dumps(rows, indent=2))
    return 0
  if not rows:
    print(f"no WebGPU engine is installed: {engine_hint()}")
    return 1
  for r in rows:
    status = "usable" if r["ok"] else "unavailable"
    print(f"{r['engine']} ({r['package']}): {status}: {r['detail']}")
    if r["hint"] and not r["ok"]: print(f"    fix: {r['hint']}")
    if r["error"]: print(f"    listing adapters failed: {r['error']}")
    for i, a in enumerate(r["adapters"]):
      feats = ", ".join(f for f in a["features"] if f in ("shader-f16", "timestamp-query")) or "-"
      print(f"  [{i}] {a['name']}: {a['kind'] or '?'} via {a['backend'] or '?'}, vendor {a['vendor'] or '?'}; {a['driver']}; features: {feats}")
    if r["ok"] and not r["adapters"] and not r["error"]: print("  no adapter (no Vulkan or OpenGL driver this engine can use)")
  print("\nchoose the engine with WEBGPU_IFACE=WGPU|DAWN (or DEV=DAWN+WEBGPU), the adapter with "
        "PLUGRT_WEBGPU_ADAPTER=vulkan|opengl|cpu|gpu|<index>|<part of its name>")
  return 0


if __name__ == "__main__":
  sys.exit(main())
