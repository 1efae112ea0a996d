"""Holmes' launcher for programs Holmes did not write (``spec.framework`` other than holmes).

The operator copies this package into the pod (an init container from the Holmes image writes
it into an emptyDir), so the user's image needs nothing but its own Python and torch:

- ``islands``: which NCCL network a group of ranks gets, from the Layout JSON (pure);
- ``hook``: wraps torch.distributed's group creation so that every new NCCL group gets that
  network, and logs one JSON line per group (pinned to the torch versions it was read against);
- ``sitecustomize``: installs the hook in every worker torchrun starts;
- ``podnet``: the pod's socket interface and HCAs, resolved inside the pod (the Holmes engine's
  start-up calls it too), from the hints the operator renders (``netenv``);
- ``__main__``: ``python -m holmes.launch -- <the user's command>``: the pod's environment,
  the device checks, then torchrun with the Layout's static node rank;
- ``install``: what the init container runs to copy all of this.

Only the standard library is imported at module level; torch where a function needs it.
"""
