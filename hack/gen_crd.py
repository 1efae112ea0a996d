"""Write crds/holmesjob.yaml from the contract's field declarations (`make crd`, which then
copies it into the chart and re-renders deploy/install.yaml with hack/chart-sync.sh). The
rendering is hack/crdgen's: build tooling, in no image."""

from __future__ import annotations

from pathlib import Path

from crdgen.render import render

CRD = Path(__file__).resolve().parents[1] / "crds" / "holmesjob.yaml"

if __name__ == "__main__":
    CRD.write_text(render())
    print(f"wrote {CRD}")
