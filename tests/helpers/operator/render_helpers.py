"""Rendering a planned attempt's pods the way the reconciler does (routes.job_routes +
render.build_pod): shared by the rendering, template-policy and Pod Security tests."""

from __future__ import annotations

from holmes.operator import placement_facts
from holmes.operator.core.render import JobRef, RenderSettings, build_pod
from holmes.operator.core.routes import pod_route, socket_nodes
from holmes.plan import plan
from tests.helpers.operator.opfixtures import default_nodes, manifest, with_link_layers

SETTINGS = RenderSettings(image="img:1", master_port=29511, metrics_port=9411)
REF = JobRef("tiny", "ns", 3, "spechash", "modelhash")
FACTS = placement_facts.gather(placement_facts.builtin_cost_model())


def planned(count=6, gpus=2, **spec):
    nodes = with_link_layers(default_nodes())
    job = manifest(
        count=count,
        gpus=gpus,
        training={"globalBatchSize": 24, "microBatchSize": 1, "iterations": 5, "learningRate": 1.0e-3},
        **spec,
    )
    layout = plan(nodes, job)
    return {n["metadata"]["name"]: n for n in nodes}, layout, job


def route_for(layout, rank, nodes, **settings):
    """The route the reconciler renders for the pod of ``rank`` (routes.job_routes)."""
    name = layout.nodes[rank]
    net = FACTS.network(nodes[name])
    return pod_route(net, name, sockets=rank in socket_nodes(layout), **settings)


def pod_for(rank, template=None, count=6):
    nodes, layout, job = planned(count=count)
    node = nodes[layout.nodes[rank]]
    return (
        build_pod(
            REF,
            layout,
            rank,
            route=route_for(layout, rank, nodes),
            template=template if template is not None else job["spec"].get("template"),
            settings=SETTINGS,
            hostname_label=node["metadata"]["labels"]["kubernetes.io/hostname"],
        ),
        layout,
        node,
    )
