"""Build tooling, not shipped in any image: the HolmesJob CustomResourceDefinition made from the
contract's field declarations (render) and the status the operator writes, declared for its schema
(status). ``make crd`` runs it through hack/gen_crd.py."""
