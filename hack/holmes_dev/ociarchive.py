"""Pack one static program as an OCI image archive (the layout `ctr images import` and `podman
load` read): a single layer holding the program at /<its name>, run as its entrypoint by the
unprivileged user 65535, as Kubernetes' pause image is. Deterministic: the same program gives the
same archive (and image id). Standard library only (hack/build-node.sh runs it with the host's
python3).

    python -m holmes_dev.ociarchive PROGRAM REF OUT.tar
"""

from __future__ import annotations

import hashlib
import io
import json
import sys
import tarfile
from pathlib import Path

MANIFEST = "application/vnd.oci.image.manifest.v1+json"
CONFIG = "application/vnd.oci.image.config.v1+json"
LAYER = "application/vnd.oci.image.layer.v1.tar"
IMAGE_NAME = "io.containerd.image.name"  # the name `ctr images import` gives the image
REF_NAME = "org.opencontainers.image.ref.name"


def _tar(files: dict[str, tuple[bytes, int]]) -> bytes:
    """A tar of ``name -> (content, mode)``, owned by root, timestamps 0."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, (data, mode) in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), mode, 0
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _descriptor(media_type: str, blob: bytes) -> dict:
    return {
        "mediaType": media_type,
        "digest": f"sha256:{hashlib.sha256(blob).hexdigest()}",
        "size": len(blob),
    }


def _json(obj: dict) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def image_archive(program: bytes, name: str, ref: str) -> bytes:
    """The archive of an image whose one layer holds ``program`` at ``/name``, named ``ref``."""
    if "/" not in ref or ":" not in ref.rsplit("/", 1)[1]:
        raise ValueError(f"{ref!r}: give a full reference with a tag, e.g. localhost/holmes-pause:1")
    layer = _tar({name: (program, 0o755)})
    config = _json(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Entrypoint": [f"/{name}"], "User": "65535:65535"},
            "rootfs": {"type": "layers", "diff_ids": [_descriptor(LAYER, layer)["digest"]]},
        }
    )
    manifest = _json(
        {
            "schemaVersion": 2,
            "mediaType": MANIFEST,
            "config": _descriptor(CONFIG, config),
            "layers": [_descriptor(LAYER, layer)],
        }
    )
    return layout(ref, manifest, MANIFEST, [layer, config])


def layout(ref: str, manifest: bytes, manifest_type: str, blobs: list[bytes]) -> bytes:
    """The archive of the image ``manifest`` named ``ref``, with ``blobs`` (its config and the
    layers the importer is to read: `ctr images import` reads no layer the manifest names but the
    archive lacks, and unpacks none whose snapshot it has)."""
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            {
                **_descriptor(manifest_type, manifest),
                "annotations": {IMAGE_NAME: ref, REF_NAME: ref.rsplit(":", 1)[1]},
            }
        ],
    }
    files = {f"blobs/sha256/{hashlib.sha256(b).hexdigest()}": (b, 0o644) for b in [*blobs, manifest]}
    return _tar(
        {
            "oci-layout": (_json({"imageLayoutVersion": "1.0.0"}), 0o644),
            "index.json": (_json(index), 0o644),
            **files,
        }
    )


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    program, ref, out = Path(argv[0]), argv[1], Path(argv[2])
    try:
        out.write_bytes(image_archive(program.read_bytes(), program.name, ref))
    except (OSError, ValueError) as e:
        print(f"ociarchive: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
