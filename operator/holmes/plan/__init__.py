"""Holmes' planner: NIC discovery -> topology -> cost model -> layout search. Pure Python
(no Kubernetes or torch import), shared by the operator, the trainer and `holmes plan`."""
