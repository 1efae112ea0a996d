"""The part of a pod template the CRD documents (``spec.template``): what ``kubectl explain``
shows for the fields Holmes reads or adds to. The job keeps the template as given (a mapping,
``JobSpec.template``); everything else a PodTemplateSpec holds is kept too
(``x-kubernetes-preserve-unknown-fields``). Declarations only, for the CRD's schema."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from .schema import Field, documented


@documented
@dataclass(frozen=True)
class PodMetadata:
    labels: Annotated[
        dict[str, str] | None, Field("Labels added to every pod (holmes.dev/* labels are reserved).")
    ] = None
    annotations: Annotated[dict[str, str] | None, Field("Annotations added to every pod.")] = None


@documented
@dataclass(frozen=True)
class Container:
    name: Annotated[str, Field('Container name; "trainer" marks the training container.')]
    image: Annotated[
        str | None, Field("Image holding Holmes and torch; the operator's --trainer-image when omitted.")
    ] = None
    command: Annotated[
        tuple[str, ...] | None, Field("Overrides the default torchrun launch of holmes.trainer.")
    ] = None
    args: Annotated[tuple[str, ...] | None, Field("Arguments to command.")] = None
    env: Annotated[
        tuple[dict[str, Any], ...] | None,
        Field("Extra environment; wins over Holmes' defaults of the same name (e.g. NCCL_SOCKET_IFNAME)."),
    ] = None
    resources: Annotated[
        dict[str, Any] | None,
        Field(
            "Requests and limits; Holmes adds nvidia.com/gpu = gpusPerNode and the node's RDMA "
            "resource unless set here."
        ),
    ] = None


@documented
@dataclass(frozen=True)
class PodSpec:
    containers: Annotated[
        tuple[Container, ...] | None,
        Field(
            (
                'Containers; the one named "trainer" (or the first) runs training. Omit to use the '
                "default trainer container."
            ),
            preserve_unknown=True,
        ),
    ] = None
    volumes: Annotated[
        tuple[dict[str, Any], ...] | None,
        Field("Volumes added to every pod (e.g. the dataset or checkpoint volume)."),
    ] = None
    tolerations: Annotated[tuple[dict[str, Any], ...] | None, Field("Tolerations for tainted GPU nodes.")] = (
        None
    )
    scheduler_name: Annotated[
        str | None,
        Field("Scheduler for the pods (e.g. a gang scheduler); the default scheduler when omitted."),
    ] = None
    service_account_name: Annotated[str | None, Field("Service account the pods run as.")] = None
    priority_class_name: Annotated[str | None, Field("Priority class of the pods.")] = None


@documented
@dataclass(frozen=True)
class PodTemplate:
    metadata: Annotated[PodMetadata | None, Field("Labels and annotations added to every pod.")] = None
    spec: Annotated[
        PodSpec | None,
        Field(
            (
                "A PodSpec. Holmes sets affinity to the planned node, hostname, subdomain and "
                "restartPolicy Never itself."
            ),
            preserve_unknown=True,
        ),
    ] = None
