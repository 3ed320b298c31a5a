"""The contracts: what a host author implements (model, tools, policy, approver, hooks,
the driver seam, the context budget) and what a back end implements (the store and the
coordinator)."""
